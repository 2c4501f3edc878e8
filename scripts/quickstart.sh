#!/usr/bin/env bash
# The README's first command: install what is missing, build, run the default experiment
# (LeNet-5 on Fashion-MNIST, 3 epochs) and leave its outputs in runs/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
bazel build -c opt //clients:topiary
bazel-bin/clients/topiary run examples/fashion_lenet5.textproto --out runs/quickstart "$@"
