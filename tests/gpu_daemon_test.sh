#!/usr/bin/env bash
# The daemon's GPU sets on a machine with two GPUs (run there by hand or by a GPU CI; skips,
# saying why, with fewer): two one-GPU experiments run side by side while a two-GPU one
# waits in QUEUED, then it runs on both; `topiary info --json` shows each GPU's occupant;
# asking for more GPUs than the daemon has is refused naming the field.
#   tests/gpu_daemon_test.sh TOPIARYD TOPIARY
set -uo pipefail
TOPIARYD="$1"
TOPIARY="$2"
tmp="${TEST_TMPDIR:-/tmp}/gpu_daemon_test"
rm -rf "$tmp" && mkdir -p "$tmp"
source "$(dirname "$0")/daemon_lib.sh"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then echo "SKIPPED: needs two GPUs, found $gpus"; exit 0; fi

spec() {  # spec NAME GPU_COUNT EPOCHS
  cat > "$tmp/$1.textproto" <<SPEC
name: "$1" seed: 1
model { arch: "resnet20" }
data { dataset: SYNTHETIC batch_size: 256
       synthetic { height: 32 width: 32 channels: 3 classes: 10 train_size: 20480 test_size: 1024 } }
train { epochs: $3 optimizer { lr: 0.05 momentum: 0.9 } }
device { kind: CUDA gpu_count: $2 }
SPEC
  echo "$tmp/$1.textproto"
}
occupants() {  # the experiment id on each GPU, space-separated ("-" when free)
  "$TOPIARY" info --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["daemon"]
print(" ".join(g.get("experiment") or "-" for g in d.get("gpus", [])))'
}

start_daemon
a=$(submit "$(spec one_a 1 12)")
b=$(submit "$(spec one_b 1 12)")
c=$(submit "$(spec two 2 6)")
check "two one-GPU experiments run side by side" wait_state "$a" RUNNING 60
check "  (the second too)" wait_state "$b" RUNNING 60
check "the two-GPU experiment waits in QUEUED" test "$(state "$c")" == QUEUED
occ=$(occupants); echo "  occupants: $occ"
check "each GPU shows its one-GPU experiment" bash -c "[[ '$occ' == '$a $b' || '$occ' == '$b $a' ]]"
check "the first finishes" wait_state "$a" SUCCEEDED 300
check "the second finishes" wait_state "$b" SUCCEEDED 300
check "then the two-GPU experiment runs" wait_state "$c" RUNNING 60
occ=$(occupants); echo "  occupants: $occ"
check "it holds both GPUs" test "$occ" == "$c $c"
check "and succeeds" wait_state "$c" SUCCEEDED 300
"$TOPIARY" watch "$c" --json > "$tmp/c.jsonl"
check "it started on both GPUs, two ranks" bash -c "grep '\"event\":\"started\"' '$tmp/c.jsonl' | grep 'cuda:0' | grep 'cuda:1' | grep -q '\"ranks\":2'"
err=$("$TOPIARY" submit "$(spec four 4 1)" 2>&1); rc=$?
echo "  $err"
check "four GPUs are refused, naming device.gpu_count" bash -c "[ $rc -ne 0 ] && [[ '$err' == *device.gpu_count* ]]"
occ=$(occupants)
check "both GPUs are free again" test "$occ" == "- -"
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
[ $fail -eq 0 ] && echo "gpu_daemon_test: all checks passed" || echo "gpu_daemon_test: FAILED"
exit $fail
