#!/usr/bin/env bash
# One process per GPU (`topiary worker`) against one process with every GPU, on one machine
# with N GPUs (no Bazel there: pass the topiary binary):
#   tests/benchmarks/multi_process.sh TOPIARY [GPUS] [SECONDS_PER_RUN] [all|bits|speed]
# 1. Bit for bit: resnet20 half width, fp32, deterministic, sync BN, run by one process and by
#    GPUS processes with NCCL forced onto sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, as
#    between hosts): the epochs' losses and every dataset of dense.h5 compared.
# 2. Throughput: resnet50 bf16, 256 images per GPU, sync BN: one process on 1 and on GPUS
#    GPUs, GPUS processes with NCCL's defaults (NVLink), and with sockets.
# Each run has its own time limit; every result is printed as it comes (JSON lines).
set -uo pipefail
T="$(realpath "$1")"
G="${2:-2}"
LIMIT="${3:-150}"
WHAT="${4:-all}"
W="$(mktemp -d)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
date -u +%F

spec() {  # name arch width batch hw train epochs precision deterministic gpus
  cat > "$W/$1.textproto" <<SPEC
name: "$1" seed: 3
model { arch: "$2" width: $3 }
data { dataset: SYNTHETIC batch_size: $4 eval_batch_size: 256
       synthetic { height: $5 width: $5 channels: 3 classes: 10 train_size: $6 test_size: 256 } }
train { epochs: $7 precision: $8 eval_every_epochs: 100 optimizer { lr: 0.02 momentum: 0.9 } }
checkpoints { every_epochs: 100 }
device { kind: CUDA gpu_count: ${10} deterministic: $9 sync_batch_norm: true }
SPEC
}
one() {  # name out
  local t0=$SECONDS
  timeout "$LIMIT" "$T" run "$W/$1.textproto" --out "$2" --json > "$2.jsonl" 2>&1 ||
    echo "{\"run\": \"$2\", \"error\": \"exit $? (124: past ${LIMIT} s)\"}"
  echo "{\"run\": \"$2\", \"seconds\": $((SECONDS - t0))}"
}
workers() {  # name out n [env...]
  local name=$1 out=$2 n=$3 t0=$SECONDS
  shift 3
  for r in $(seq $((n - 1)) -1 0); do
    env "$@" timeout "$LIMIT" "$T" worker "$W/$name.textproto" --out "$out" --rank "$r" \
      --world "$n" --local_rank "$r" --rendezvous "$out.rv" --json > "$out.r$r.jsonl" \
      2> "$out.r$r.err" &
  done
  wait
  echo "{\"run\": \"$out\", \"seconds\": $((SECONDS - t0))}"
}
figures() {  # file label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
path, label = sys.argv[1:]
ev = []
for line in open(path):
    try:
        ev.append(json.loads(line))
    except ValueError:
        pass
ips = [e["images_per_s"] for e in ev if e.get("event") == "epoch"]
s = [e for e in ev if e.get("event") == "summary"]
print(json.dumps({"run": label, "images_per_s": round(statistics.median(ips[1:])) if len(ips) > 1 else None,
                  "epochs": [round(x) for x in ips], "state": s[-1]["state"] if s else "none",
                  "error": s[-1]["error"][:300] if s else ""}), flush=True)
PY
}

if [ "$WHAT" != speed ]; then
spec bits resnet20 0.5 $((32 * G)) 16 $((640 * G)) 2 FP32 true "$G"
one bits "$W/one"
workers bits "$W/many" "$G" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
python3 - "$W/one" "$W/many" <<'PY'
import json, sys
import h5py, numpy as np
one, many = sys.argv[1:]
def epochs(path):
    out = []
    for line in open(path):
        if line.startswith("{"):
            e = json.loads(line)
            if e.get("event") == "epoch":
                out.append((e["train_loss"], e.get("test_loss")))
    return out
a, b = epochs(one + ".jsonl"), epochs(many + ".r0.jsonl")
fa, fb = h5py.File(one + "/checkpoints/dense.h5"), h5py.File(many + "/checkpoints/dense.h5")
names = []
fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
diff = [n for n in names if np.asarray(fa[n][()]).tobytes() != np.asarray(fb[n][()]).tobytes()]
print(json.dumps({"bit_for_bit": not diff and a == b and len(a) == 2, "epochs_one": a,
                  "epochs_processes": b, "datasets": len(names), "differ": diff[:8]}), flush=True)
PY
fi
[ "$WHAT" = bits ] && exit 0

# Six steps per epoch, five epochs: the synthetic 224-pixel images are made on one core (about
# 40 s per 10k images), which is most of a run's time on four GPUs.
for g in 1 "$G"; do
  spec "t$g" resnet50 1.0 $((256 * g)) 224 $((1536 * g)) 5 BF16 false "$g"
  one "t$g" "$W/t$g"
  figures "$W/t$g.jsonl" "one process, $g GPU(s)"
done
workers "t$G" "$W/tw" "$G"
figures "$W/tw.r0.jsonl" "$G processes, NCCL defaults"
workers "t$G" "$W/ts" "$G" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
figures "$W/ts.r0.jsonl" "$G processes, sockets"
rm -rf "$W"
