#!/usr/bin/env bash
# Data-parallel scaling: Topiary's runner on 1 and 2 GPUs (the global batch grows with the
# GPUs: the same batch per GPU) beside PyTorch DDP on the same GPUs, same models and batches.
# Runs on a multi-GPU machine (no Bazel there): pass the topiary binary.
#   tests/benchmarks/dp_scaling.sh TOPIARY [python] [torchrun]
# SYNC_BN=1: synchronized batch norm on both sides (device.sync_batch_norm; SyncBatchNorm).
# MODELS="resnet50": only those models (default: resnet20 resnet50).
# Topiary figures are the training images/s of `topiary run` on synthetic data (batches
# assembled and augmented on the GPU), the median over epochs 2-4 (epoch 1 includes the
# eager step and CUDA-graph capture). PyTorch's are timed steps on random tensors.
set -uo pipefail
topiary="$1"
python="${2:-python3}"
torchrun="${3:-torchrun}"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
sync_bn="${SYNC_BN:-0}"
models="${MODELS:-resnet20 resnet50}"
if [ "$sync_bn" = 1 ]; then spec_sync="sync_batch_norm: true"; ddp_sync="--sync-bn"; fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
date -u +%F

ours() {  # model per_gpu_batch hw train_size_per_gpu gpus
  # The training set grows with the GPUs, so every run has the same steps per epoch and the
  # same share of per-epoch work (shuffling, the waits at the epoch's end) in its figure.
  local model=$1 batch=$2 hw=$3 size=$(($4 * $5)) gpus=$5
  local spec="$work/$model-$gpus.textproto"
  cat > "$spec" <<SPEC
name: "dp_${model}_${gpus}" seed: 1
model { arch: "$model" }
data { dataset: SYNTHETIC batch_size: $((batch * gpus)) eval_batch_size: 256
       synthetic { height: $hw width: $hw channels: 3 classes: 10 train_size: $size test_size: 256 } }
train { epochs: 4 precision: BF16 eval_every_epochs: 100 optimizer { lr: 0.01 momentum: 0.9 } }
device { kind: CUDA gpu_count: $gpus ${spec_sync:-} }
SPEC
  "$topiary" run "$spec" --out "$work/run-$model-$gpus" --json > "$work/$model-$gpus.jsonl" 2>&1
  "$python" - "$work/$model-$gpus.jsonl" "$model" "$batch" "$gpus" <<'PY'
import json, os, statistics, sys
path, model, batch, gpus = sys.argv[1:]
epochs, error = [], ""
for line in open(path):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "epoch":
        epochs.append(e.get("images_per_s", 0))
    if e.get("event") == "summary" and e.get("error"):
        error = e["error"]
ips = statistics.median(epochs[1:]) if len(epochs) > 1 else 0
print(json.dumps({"engine": "topiary bf16" + (" sync_bn" if os.environ.get("SYNC_BN") == "1" else ""),
                  "model": model, "batch_per_gpu": int(batch),
                  "gpus": int(gpus), "images_per_s": round(ips, 1),
                  "epochs_images_per_s": [round(x) for x in epochs], "error": error}))
PY
}

theirs() {  # model per_gpu_batch hw gpus steps
  "$torchrun" --standalone --nproc_per_node "$4" "$here/pytorch_ddp.py" --model "$1" \
    --batch "$2" --hw "$3" --channels 3 --steps "$5" --mode bf16_eager_cl ${ddp_sync:-} 2>&1 |
    grep '^{'
}

for g in 1 2; do
  case " $models " in *" resnet20 "*) ours resnet20 512 32 40960 $g ;; esac
  case " $models " in *" resnet50 "*) ours resnet50 256 224 7680 $g ;; esac
done
for g in 1 2; do
  case " $models " in *" resnet20 "*) theirs resnet20 512 32 $g 100 ;; esac
  case " $models " in *" resnet50 "*) theirs resnet50 256 224 $g 60 ;; esac
done
rm -rf "$work"
