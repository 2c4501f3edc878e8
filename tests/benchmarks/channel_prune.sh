#!/usr/bin/env bash
# Channel pruning's speed figures (docs/PERFORMANCE.md section 4): resnet50 at 224 px trained
# for 2 epochs on Fashion-MNIST (as an image folder), pruned to half of its multiply-adds in
# rounds that compact it, then the compacted checkpoint against its dense parent: training
# step (the round table), GPU inference (evaluate --bench --baseline) and the ONNX exports in
# onnxruntime on the CPU.  usage: channel_prune.sh TOPIARY FASHION_IDX_DIR WORK_DIR
set -euo pipefail
topiary="$(realpath "$1")"; idx="$(realpath "$2")"; here="$(dirname "$(realpath "$0")")"
mkdir -p "$3" && cd "$3"
source "$here/fashion224.sh"
printf 'name: "fm224_resnet50_flops50"\nseed: 5\nmodel { arch: "resnet50" }\ninit_from_checkpoint: "runs/dense/checkpoints/dense.h5"\n%s\npruning { method: CHANNEL score: L1 target_flops: 0.5 round_to: 8 step_fraction: 0.5 finetune_epochs: 1 finetune_lr: 0.02 }\n' "$data" > prune.textproto
"$topiary" run dense.textproto --out runs/dense
"$topiary" run prune.textproto --out runs/prune
small=$(ls runs/prune/checkpoints/round-*.h5 | tail -1)
"$topiary" evaluate "$small" --bench --baseline runs/dense/checkpoints/dense.h5
"$topiary" export runs/dense/checkpoints/dense.h5 --onnx dense.onnx --batch dynamic
"$topiary" export "$small" --onnx small.onnx --batch dynamic
B=1,32 python3 "$here/onnx_cpu_bench.py" dense=dense.onnx small=small.onnx
