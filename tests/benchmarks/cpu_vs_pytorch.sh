#!/usr/bin/env bash
# CPU training throughput of Topiary beside PyTorch on the same machine, models, batches and
# thread count, in one run. Rounds are interleaved (Topiary, PyTorch, Topiary, ...) and the
# table reports medians, because shared cloud CPUs drift by 10-30% from minute to minute.
# Needs Debian's python3-torch (apt-get install python3-torch).
#   tests/benchmarks/cpu_vs_pytorch.sh [rounds] [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-3}"
steps="${2:-30}"
threads=$(nproc)
bazel build -c opt //tests/benchmarks:train_step_bench >&2
bench=bazel-bin/tests/benchmarks/train_step_bench
raw=$(mktemp)
for round in $(seq "$rounds"); do
  for cfg in "lenet5 64" "lenet5 128" "resnet20 128"; do
    set -- $cfg
    "$bench" --models "$1" --batch "$2" --steps "$steps" --threads "$threads" >> "$raw"
    /usr/bin/python3 tests/benchmarks/pytorch_train_step.py --models "$1" --batch "$2" \
      --steps "$steps" --threads "$threads" >> "$raw"
  done
done
echo "$(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $threads threads, $rounds rounds x $steps steps"
/usr/bin/python3 tests/benchmarks/summarize.py < "$raw"
rm -f "$raw"
