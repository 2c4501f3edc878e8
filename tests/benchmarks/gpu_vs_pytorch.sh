#!/usr/bin/env bash
# GPU training throughput of Topiary beside PyTorch on the same GPU, models and batches.
# Runs on the GPU machine (no Bazel there): pass the train_step_bench binary.
#   tests/benchmarks/gpu_vs_pytorch.sh BENCH [topiary|pytorch|all] [steps] [python]
# PyTorch modes: eager (NCHW), eager_cl (channels-last), compile (torch.compile
# mode="reduce-overhead", i.e. CUDA graphs), and bf16 autocast variants. TF32 is off in
# PyTorch's fp32 modes, as in Topiary's fp32.
set -uo pipefail
bench="$1"
which="${2:-all}"
steps="${3:-50}"
python="${4:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
ours() {  # model batch hw channels [extra flags]
  local m=$1 b=$2 hw=$3 c=$4; shift 4
  for p in fp32 tf32 bf16; do
    "$bench" --device cuda --models "$m" --batch "$b" --hw "$hw" --channels "$c" \
      --steps "$steps" --precision "$p" "$@"
  done
}
theirs() {  # model batch hw channels modes
  "$python" "$here/pytorch_train_step.py" --device cuda --models "$1" --batch "$2" --hw "$3" \
    --channels "$4" --steps "$steps" --modes "$5"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%F
if [ "$which" != pytorch ]; then
  ours lenet5 128 28 1
  for b in 128 512; do ours resnet20 $b 32 3; ours resnet56 $b 32 3; done
  ours resnet50 256 224 3
fi
if [ "$which" != topiary ]; then
  theirs lenet5 128 28 1 eager,compile
  theirs resnet20 128 32 3 eager,eager_cl,compile,bf16_compile
  theirs resnet20 512 32 3 eager_cl,compile,bf16_eager_cl,bf16_compile
  theirs resnet56 128 32 3 eager_cl,compile
  theirs resnet56 512 32 3 eager_cl,compile,bf16_compile
  theirs resnet50 256 224 3 eager_cl,bf16_eager_cl
fi
