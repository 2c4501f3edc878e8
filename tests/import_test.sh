#!/usr/bin/env bash
# ONNX import against PyTorch and hostile ONNX files (tests/import_test.py, with Debian's
# python3-torch and python3-onnx).
set -euo pipefail
TOPIARY="$(realpath "$1")"
LOGITS="$(realpath "$2")"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/import"
mkdir -p "$WORK"
exec /usr/bin/python3 "$(dirname "$0")/import_test.py" "$TOPIARY" "$LOGITS" "$WORK"
