#!/usr/bin/env bash
# CPU training throughput of Topiary beside PyTorch on the same machine, models, batches and
# thread count, in one run. Needs Debian's python3-torch (apt-get install python3-torch).
#   tests/benchmarks/cpu_vs_pytorch.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps="${1:-20}"
threads=$(nproc)
bazel build -c opt //tests/benchmarks:train_step_bench >&2
bench=bazel-bin/tests/benchmarks/train_step_bench
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $threads threads"
for cfg in "lenet5 64" "lenet5 128" "resnet20 128"; do
  set -- $cfg
  "$bench" --models "$1" --batch "$2" --steps "$steps" --threads "$threads"
  /usr/bin/python3 tests/benchmarks/pytorch_train_step.py --models "$1" --batch "$2" \
    --steps "$steps" --threads "$threads"
done
