#!/usr/bin/env bash
# Block pruning's end-to-end figures on Hopper (docs/PERFORMANCE.md section 4, issue 44):
# resnet50 at 224 px trained for 2 epochs on Fashion-MNIST (as an image folder), then one
# run from that checkpoint: 2 more dense epochs (its round 0, finetune.h5), then one round of
# balanced block pruning (64 input x 128 output channels, half of each eligible layer's
# blocks) with a fine-tuning epoch; the pruned checkpoint against its dense parent (round 0)
# in evaluate --bench (test top-1 and GPU inference with the measured dispatch). The round
# table gives each masked layer's measured choices.
# usage: block_prune.sh TOPIARY FASHION_IDX_DIR WORK_DIR [BLOCK_IN BLOCK_OUT TARGET]
set -euo pipefail
topiary="$(realpath "$1")"; idx="$(realpath "$2")"; here="$(dirname "$(realpath "$0")")"
block_in="${4:-64}"; block_out="${5:-128}"; target="${6:-0.5}"
mkdir -p "$3" && cd "$3"
source "$here/fashion224.sh"
printf 'name: "fm224_resnet50_blocks"\nseed: 5\nmodel { arch: "resnet50" }\ninit_from_checkpoint: "runs/dense/checkpoints/dense.h5"\n%s\npruning { method: BLOCK block_in: %s block_out: %s balanced: true target: %s step_fraction: 1 finetune_epochs: 1 finetune_lr: 0.02 }\n' "$data" "$block_in" "$block_out" "$target" > prune.textproto
[ -f runs/dense/checkpoints/dense.h5 ] || "$topiary" run dense.textproto --out runs/dense
"$topiary" run prune.textproto --out "runs/prune_${block_in}x${block_out}"
out="runs/prune_${block_in}x${block_out}/checkpoints"
"$topiary" evaluate "$(ls "$out"/round-*.h5 | tail -1)" --bench --baseline "$out/finetune.h5"
