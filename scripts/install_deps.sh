#!/usr/bin/env bash
# Installs the Debian 12 packages Topiary builds and tests with, if any are missing.
# Runs apt-get as root, or through sudo. Idempotent: does nothing when all are present.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap           # Bazel 4.2.3, used fully offline (see docs/building.md)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libhdf5-dev libgtest-dev libopenblas-dev zlib1g-dev
  libdnnl-dev               # oneDNN: CPU convolutions (kernels/conv_onednn.h)
  libgfortran-12-dev        # libgfortran.a, for --config=static (OpenBLAS needs it)
  dataset-fashion-mnist     # the default dataset: /usr/share/datasets/fashion-mnist
  python3                   # tests/cli_test.sh checks `topiary inspect --json` with it
  python3-grpcio            # tests/daemon_test.sh calls grpc.health.v1 and reflection with it
  libonnx-dev               # onnx.proto: `topiary export --onnx` writes through ONNX's schema
  # clients/python (the `topiary` package) and its tests: pip into a venv, offline
  python3-protobuf python3-h5py python3-numpy python3-venv python3-pip python3-pytest
  python3-onnx python3-torch python3-matplotlib
  openssl                   # tests/daemon_test.sh makes a self-signed certificate for TLS
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and the sanitizers (tests/fuzz)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run onnxruntime for the ONNX export tests; any node will do (a machine may
# have it from elsewhere, whose package conflicts with Debian's npm).
command -v npm >/dev/null && command -v node >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# onnxruntime for the ONNX export tests, from the npm registry (Debian has no onnxruntime):
# the CPU build that onnxruntime-node ships; its install script (GPU downloads) is skipped.
ORT_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/topiary/npm"
ORT_VERSION=1.30.0
if [ ! -f "$ORT_DIR/node_modules/onnxruntime-node/package.json" ] ||
   ! grep -q "\"version\": \"$ORT_VERSION\"" "$ORT_DIR/node_modules/onnxruntime-node/package.json"; then
  mkdir -p "$ORT_DIR"
  (cd "$ORT_DIR" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error \
      "onnxruntime-node@$ORT_VERSION" >&2) ||
    echo "warning: npm could not install onnxruntime-node; the ONNX tests will say so" >&2
fi
