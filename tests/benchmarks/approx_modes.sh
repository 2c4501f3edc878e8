#!/usr/bin/env bash
# Approximate multipliers under both weight codes, both scale modes, dense and block-pruned,
# without and with fine-tuning, and the greedy sensitivity (docs/PERFORMANCE.md, "Weight
# codes, scales, pruning and fine-tuning"). Runs on a GPU machine (no Bazel there):
#   tests/benchmarks/approx_modes.sh TOPIARY FASHION_DIR [OUT_DIR]
# FASHION_DIR holds Fashion-MNIST's four .gz files; the EvoApprox tables are found through
# $TOPIARY_MULTIPLIERS (default: data/multipliers/evoapprox8b beside this script's checkout).
# About 10 minutes on an H100. APPROX_MULTIPLIERS="exact drum:6 ..." picks the multipliers
# (the first is taken as the baseline and not fine-tuned).
set -uo pipefail
topiary="$1"
data="$2"
out="${3:-$(mktemp -d)}"
here="$(cd "$(dirname "$0")" && pwd)"
export TOPIARY_MULTIPLIERS="${TOPIARY_MULTIPLIERS:-$here/../../data/multipliers/evoapprox8b}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%F
read -r -a multipliers <<< "${APPROX_MULTIPLIERS:-exact drum:6 bam:6 mul8u_L40 mul8u_185Q mul8u_12N4}"
optimizer='optimizer { lr: 0.02 momentum: 0.9 nesterov: true weight_decay: 5e-4 }'
data_block="data { dataset: FASHION_MNIST path: \"$data\" batch_size: 128 augment { crop_padding: 2 horizontal_flip: true } }"

sed "s#^data {#data { path: \"$data\"#" "$here/../../examples/fashion_resnet20_gpu.textproto" \
  > "$out/dense.textproto"
"$topiary" run "$out/dense.textproto" --out "$out/dense" > "$out/dense.log" 2>&1 || exit 1
dense="$out/dense/checkpoints/dense.h5"
cat > "$out/prune.textproto" <<SPEC
name: "resnet20_prune50" seed: 3 model { arch: "resnet20" } init_from_checkpoint: "$dense"
$data_block
train { epochs: 0 $optimizer }
pruning { method: BLOCK block_in: 8 block_out: 8 target: 0.5 step_fraction: 0.5 finetune_epochs: 2 max_rounds: 6 score: L2 }
device { kind: CUDA }
SPEC
"$topiary" run "$out/prune.textproto" --out "$out/prune" > "$out/prune.log" 2>&1 || exit 1
pruned="$(ls "$out"/prune/checkpoints/round-*.h5 | tail -n 1)"

echo "checkpoint code scales multiplier top1 layers_warned"
for ck in "$dense" "$pruned"; do for code in asymmetric sign_magnitude; do
  for scales in per_tensor per_channel; do for m in "${multipliers[@]}"; do
    r=$("$topiary" evaluate "$ck" --set "*=$m" --weight_code "$code" --weight_scales "$scales" \
        --json 2>/dev/null)
    echo "$(basename "$ck") $code $scales $m $(python3 -c 'import json,sys; e=json.loads(sys.argv[1])
print("%.4f %d/%d" % (e["top1"], sum(u["far"] for u in e["code_use"]), len(e["code_use"])))' "$r")"
  done; done
done; done

echo "checkpoint code multiplier top1_after_3_epochs"
for ck in "$dense" "$pruned"; do for code in ASYMMETRIC SIGN_MAGNITUDE; do
  for m in "${multipliers[@]:1}"; do
    spec="$out/ft.textproto"
    cat > "$spec" <<SPEC
name: "resnet20_approx_ft" seed: 3 model { arch: "resnet20" } init_from_checkpoint: "$ck"
$data_block
train { epochs: 3 optimizer { lr: 0.01 momentum: 0.9 nesterov: true weight_decay: 5e-4 } lr_schedule { kind: COSINE } }
approximation { rules { layer: "*" multiplier: "$m" } weight_code: $code }
device { kind: CUDA }
SPEC
    run="$out/ft_$(basename "$ck" .h5)_${code}_${m/:/}"
    "$topiary" run "$spec" --json --out "$run" > "$run.jsonl" 2>&1
    echo "$(basename "$ck") $code $m $(tail -n 1 "$run.jsonl" | grep -o '"test_top1":[0-9.]*' | head -n 1)"
  done
done; done

for code in asymmetric sign_magnitude; do
  "$topiary" sensitivity "$dense" mul8u_L40 mul8u_185Q mul8u_12N4 --budget 1 --weight_code "$code" \
    --json > "$out/sensitivity_$code.json" 2>/dev/null
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); g=r["greedy"]
print("sensitivity %s: float %.2f%%, greedy %.2f%%, %d layers, power %.1f%% of exact" % (
    sys.argv[2], r["float_top1"], g["top1"], len(g["assignment"]), 100 * g["relative_power"]))' \
    "$out/sensitivity_$code.json" "$code"
done
