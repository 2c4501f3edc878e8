#!/usr/bin/env bash
# End-to-end test of topiaryd and the topiary client over loopback gRPC, with the real
# binaries and Fashion-MNIST: submit -> SUCCEEDED with checkpoints listed and inspectable,
# pause/resume, cancel, manual rounds, fork, error codes, kill -9 and recovery, token auth,
# path traversal.
set -uo pipefail
TOPIARYD="$1"
TOPIARY="$2"
TINY="$3"          # examples/tiny.textproto (lenet5, 2 epochs)
PRUNE="$4"         # examples/tiny_block_prune.textproto (resnet20/2, block rounds)
tmp="${TEST_TMPDIR:-/tmp}/daemon_test"
rm -rf "$tmp" && mkdir -p "$tmp"
source "$(dirname "$0")/daemon_lib.sh"

start_daemon
# The manual-round spec and a longer one for pause/cancel/kill.
sed 's/finetune_epochs: 1 }/finetune_epochs: 1 manual_rounds: true }/' "$PRUNE" > "$tmp/manual.textproto"
sed 's/epochs: 1 optimizer/epochs: 3 optimizer/' "$PRUNE" > "$tmp/long.textproto"

# Standard services for generic tools: grpc.health.v1 and server reflection (Debian's
# python3-grpcio, raw bytes: no generated code needed).
check "grpc.health.v1 says SERVING; reflection lists topiary.v1.Topiary" /usr/bin/python3 -c '
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
raw = dict(request_serializer=lambda x: x, response_deserializer=lambda x: x)
assert ch.unary_unary("/grpc.health.v1.Health/Check", **raw)(b"", timeout=10) == b"\x08\x01"
info = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", **raw)
listing = b"".join(info(iter([b"\x3a\x00"]), timeout=10))  # list_services
assert b"topiary.v1.Topiary" in listing and b"grpc.health.v1.Health" in listing, listing
' "$TOPIARY_SERVER"

# Submit, watch to the end, list checkpoints, inspect one through the daemon.
id=$(submit "$TINY")
check "submit returns an id" test -n "$id"
"$TOPIARY" watch "$id" > "$tmp/watch.out" 2> "$tmp/watch.err"; rc=$?
check "watch follows $id to SUCCEEDED (exit 0)" test "$rc" -eq 0
check "watch shows states and epochs" bash -c 'grep -q "state: RUNNING" "$0" && grep -q "^epoch 2" "$0" && grep -q "state: SUCCEEDED" "$0"' "$tmp/watch.err"
ckpts=$("$TOPIARY" checkpoints "$id" --json)
path=$(echo "$ckpts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][0]["path"])')
check "checkpoints listed (dense.h5)" bash -c '[[ "$0" == experiments/*/checkpoints/dense.h5 ]]' "$path"
report=$("$TOPIARY" inspect --remote "$path" --json); rc=$?
check "inspect through the daemon" bash -c '[[ $1 -eq 0 && "$0" == *"\"model_arch\":\"lenet5\""* ]]' "$report" "$rc"
"$TOPIARY" watch "$id" --from 3 --json > "$tmp/replay.jsonl"
check "watch --from replays the persisted log after seq 3" bash -c 'head -n 1 "$0" | grep -q "\"seq\":4,"' "$tmp/replay.jsonl"

# The daemon's multiplier library: DATA_DIR/multipliers/*.bin, named in rules by stem. A
# fresh data directory's starts with the 12 shipped EvoApprox tables.
check "a fresh daemon's library holds the shipped tables" \
  test "$(ls "$tmp"/data/multipliers/mul8u_*.bin 2>/dev/null | wc -l)" -eq 12
mkdir -p "$tmp/data/multipliers"
cp data/multipliers/evoapprox8b/mul8u_L40.bin "$tmp/data/multipliers/"
head -c 1000 /dev/urandom > "$tmp/data/multipliers/short.bin"
ln -s /etc/passwd "$tmp/data/multipliers/link.bin"
"$TOPIARY" multipliers --server "$TOPIARY_SERVER" --json > "$tmp/mults.json"; rc=$?
check "multipliers --server lists the library (L40 with its power; the short file with its error; no link) and the families" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
rows = {m[\"name\"]: m for m in json.load(open(sys.argv[1]))}
assert \"short\" in rows and \"link\" not in rows and len(rows) == 13, sorted(rows)
assert rows[\"mul8u_L40\"][\"power_mw\"] == 0.189 and rows[\"mul8u_L40\"][\"source\"] == \"multipliers/mul8u_L40.bin\", rows
assert \"131072\" in rows[\"short\"][\"error\"], rows
" "$0"' "$tmp/mults.json" "$rc"
"$TOPIARY" multipliers --server "$TOPIARY_SERVER" > "$tmp/mults.txt"
check "multipliers --server (text) names the families" grep -q "^generated families .*drum:K" "$tmp/mults.txt"
approx_spec() {  # approx_spec MULTIPLIER > FILE: the tiny spec with every conv approximate
  cat "$TINY"; printf 'approximation { rules { layer: "*" multiplier: "%s" } }\n' "$1"
}
approx_spec short > "$tmp/approx_short.textproto"
err=$("$TOPIARY" submit "$tmp/approx_short.textproto" 2>&1); rc=$?
check "a wrong-size table is refused at submission (exit 3) naming the rule and the size" \
  bash -c '[[ $1 -eq 3 && "$0" == *INVALID_ARGUMENT*"approximation.rules[0].multiplier: "*"short.bin: must be exactly 131072 bytes"* ]]' "$err" "$rc"
approx_spec /etc/passwd > "$tmp/approx_etc.textproto"
err=$("$TOPIARY" submit "$tmp/approx_etc.textproto" 2>&1); rc=$?
check "a table outside the data directory is refused (exit 7) naming the rule" \
  bash -c '[[ $1 -eq 7 && "$0" == *"approximation.rules[0].multiplier: "* ]]' "$err" "$rc"
approx_spec link > "$tmp/approx_link.textproto"
err=$("$TOPIARY" submit "$tmp/approx_link.textproto" 2>&1); rc=$?
check "a library link leading out of the data directory is refused (exit 7)" test "$rc" -eq 7
approx_spec mul8u_L40 > "$tmp/approx_l40.textproto"
aid=$(submit "$tmp/approx_l40.textproto")
"$TOPIARY" watch "$aid" > /dev/null 2>&1; rc=$?
check "a run with the library's mul8u_L40 on every conv succeeds" test "$rc" -eq 0
apath=$("$TOPIARY" checkpoints "$aid" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][0]["path"])')
"$TOPIARY" inspect --remote "$apath" --json > "$tmp/approx_report.json"
check "its checkpoint records the library table for every conv" python3 -c '
import json, sys
layers = [l for l in json.load(open(sys.argv[1]))["layers"] if l["layer"].startswith("conv")]
assert len(layers) == 2 and all(l["approximation"]["multiplier"].endswith("/multipliers/mul8u_L40.bin") for l in layers), layers
' "$tmp/approx_report.json"

# Errors and their codes.
printf 'model { arch: "lenet5" }\ndata { batch_size: -4 }\ntrain { epochs: 1 }\n' > "$tmp/bad.textproto"
err=$("$TOPIARY" submit "$tmp/bad.textproto" 2>&1); rc=$?
check "invalid spec: INVALID_ARGUMENT naming the field (exit 3)" bash -c '[[ $1 -eq 3 && "$0" == *INVALID_ARGUMENT*"data.batch_size: must be > 0"* ]]' "$err" "$rc"
err=$("$TOPIARY" get exp-9999 2>&1); rc=$?
check "unknown id: NOT_FOUND (exit 4)" bash -c '[[ $1 -eq 4 && "$0" == *NOT_FOUND* ]]' "$err" "$rc"
err=$("$TOPIARY" resume "$id" 2>&1); rc=$?
check "resume of a SUCCEEDED experiment: FAILED_PRECONDITION (exit 5)" bash -c '[[ $1 -eq 5 && "$0" == *FAILED_PRECONDITION* ]]' "$err" "$rc"
err=$("$TOPIARY" inspect --remote ../../../etc/passwd 2>&1); rc=$?
check "path traversal refused: PERMISSION_DENIED (exit 7)" bash -c '[[ $1 -eq 7 && "$0" == *"outside the daemon'"'"'s data directory"* ]]' "$err" "$rc"
err=$("$TOPIARY" fork /etc/passwd 2>&1); rc=$?
check "fork of a file outside the data directory refused (exit 7)" test "$rc" -eq 7
printf 'model { arch: "lenet5" }\ndata { dataset: MNIST path: "/etc" }\ntrain { epochs: 1 }\n' > "$tmp/etc.textproto"
err=$("$TOPIARY" submit "$tmp/etc.textproto" 2>&1); rc=$?
check "a dataset path outside the data directory and dataset folders refused (exit 7)" bash -c '[[ $1 -eq 7 && "$0" == *"data.path: '"'"'/etc'"'"' is outside"* ]]' "$err" "$rc"

# A dataset folder that is not there is refused at submission (not when the run starts).
printf 'name: "nodata"\nmodel { arch: "lenet5" }\ndata { dataset: MNIST path: "%s/data/no-such-dataset" }\ntrain { epochs: 1 }\n' "$tmp" > "$tmp/nodata.textproto"
err=$("$TOPIARY" submit "$tmp/nodata.textproto" 2>&1); rc=$?
check "a missing dataset folder is refused at submit (exit 3, naming data.path)" \
  bash -c '[[ $1 -eq 3 && "$0" == *"data.path: dataset folder"*"does not exist"* ]]' "$err" "$rc"
# A run that fails records why, and the client sees it: its dataset files are there but
# are not IDX files.
mkdir -p "$tmp/data/broken-dataset"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  echo "not idx" > "$tmp/data/broken-dataset/$f"
done
printf 'name: "broken"\nmodel { arch: "lenet5" }\ndata { dataset: MNIST path: "%s/data/broken-dataset" }\ntrain { epochs: 1 }\n' "$tmp" > "$tmp/broken.textproto"
id=$(submit "$tmp/broken.textproto")
check "a run that cannot start ends FAILED" wait_state "$id" FAILED 30
err=$("$TOPIARY" get "$id")
check "the error text reaches the client" bash -c '[[ "$0" == *"error: "*train-images-idx3-ubyte* ]]' "$err"
"$TOPIARY" watch "$id" > /dev/null 2>&1; rc=$?
check "watch of a FAILED experiment exits 1" test "$rc" -eq 1

# Pause a running experiment, resume it; cancel another.
id=$(submit "$tmp/long.textproto")
wait_state "$id" RUNNING 30 && sleep 2
"$TOPIARY" pause "$id" > /dev/null
check "pause: PAUSED at a step boundary" wait_state "$id" PAUSED 60
check "pause wrote pause.h5" bash -c '"$0" checkpoints "$1" | grep -q pause.h5' "$TOPIARY" "$id"
"$TOPIARY" resume "$id" > /dev/null
"$TOPIARY" watch "$id" > /dev/null 2>&1; rc=$?
check "resumed experiment finishes (exit 0)" test "$rc" -eq 0
rounds=$("$TOPIARY" get "$id" --json | python3 -c 'import json,sys; e=json.load(sys.stdin); print(e.get("round",0), e["sparsity"])')
check "its rounds reached 50% ($rounds)" bash -c 'set -- $0; [[ $1 -ge 1 ]] && python3 -c "import sys; sys.exit(abs(float(sys.argv[1]) - 0.5) > 0.02)" $2' "$rounds"
id2=$(submit "$tmp/long.textproto")
wait_state "$id2" RUNNING 30
"$TOPIARY" cancel "$id2" > /dev/null
check "cancel: CANCELLED" wait_state "$id2" CANCELLED 60
err=$("$TOPIARY" pause "$id2" 2>&1); rc=$?
check "pause of a CANCELLED experiment: exit 5" test "$rc" -eq 5

# Manual rounds driven by the client.
id=$(submit "$tmp/manual.textproto")
check "manual rounds: WAITING_FOR_ROUND after the dense phase" wait_state "$id" WAITING_FOR_ROUND 60
err=$("$TOPIARY" round "$id" --target 1.5 2>&1); rc=$?
check "round with a bad target: INVALID_ARGUMENT (exit 3)" test "$rc" -eq 3
advanced=0
for _ in $(seq 10); do
  s=$(state "$id")
  [ "$s" == SUCCEEDED ] && break
  if [ "$s" == WAITING_FOR_ROUND ]; then "$TOPIARY" round "$id" --epochs 1 > /dev/null && advanced=$((advanced + 1)); fi
  sleep 0.5
  for _ in $(seq 100); do s=$(state "$id"); [[ "$s" == RUNNING ]] || break; sleep 0.2; done
done
check "manual rounds advanced by the client ($advanced) until SUCCEEDED" bash -c '[[ $0 -ge 2 ]] && [[ "$1" == SUCCEEDED ]]' "$advanced" "$(state "$id")"
err=$("$TOPIARY" round "$id" 2>&1); rc=$?
check "round when not waiting: FAILED_PRECONDITION (exit 5)" test "$rc" -eq 5
# Manual rounds ended by the client: one round, then --finish.
id=$(submit "$tmp/manual.textproto")
wait_state "$id" WAITING_FOR_ROUND 60 && "$TOPIARY" round "$id" --epochs 1 > /dev/null
sleep 0.5
for _ in $(seq 150); do s=$(state "$id"); [[ "$s" == RUNNING ]] || break; sleep 0.2; done
err=$("$TOPIARY" round "$id" --finish --target 0.7 2>&1); rc=$?
check "round --finish with a target: INVALID_ARGUMENT (exit 3)" test "$rc" -eq 3
out=$("$TOPIARY" round "$id" --finish 2>&1)
check "round --finish says the run is finishing ($out)" grep -q "finishing $id" <<< "$out"
check "finished rounds: SUCCEEDED" wait_state "$id" SUCCEEDED 60
check "finished after round 1, target not reached and said so" python3 -c '
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
s = [e["summary"] for e in events if "summary" in e][-1]
rounds = [r.get("round", 0) for r in s["rounds"]]
sys.exit(not (rounds == [0, 1] and not s.get("target_reached") and "ended the rounds" in s.get("target_note", "")))' "$tmp/data/experiments/$id/events.jsonl"

# Fork from a round checkpoint with a spec change; the parent is recorded.
parent=$("$TOPIARY" checkpoints "$id" --json | python3 -c 'import json,sys; print([c["path"] for c in json.load(sys.stdin)["checkpoints"] if "round-001" in c["path"]][0])')
fork=$("$TOPIARY" fork "$parent" --set pruning.target=0.75 --set pruning.manual_rounds=false --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$TOPIARY" watch "$fork" > /dev/null 2>&1; rc=$?
check "fork runs to SUCCEEDED" test "$rc" -eq 0
info=$("$TOPIARY" get "$fork" --json)
check "fork records its parent and reaches the new target" python3 -c '
import json, sys
e = json.loads(sys.argv[1])
assert e["parent"] == sys.argv[2], e["parent"]
assert e["spec"]["pruning"]["target"] == 0.75
assert e["sparsity"] > 0.7, e["sparsity"]' "$info" "$parent"

# kill -9 while training; the restarted daemon resumes from the last checkpoint.
id=$(submit "$tmp/long.textproto")
for _ in $(seq 300); do
  "$TOPIARY" checkpoints "$id" 2>/dev/null | grep -q round-001.h5 && break; sleep 0.2
done
kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
start_daemon
check "after kill -9 the experiment is listed" bash -c '"$0" list | grep -q "$1"' "$TOPIARY" "$id"
"$TOPIARY" watch "$id" > "$tmp/recovered.out" 2>&1; rc=$?
check "it resumes and finishes (exit 0)" test "$rc" -eq 0
check "it resumed from its checkpoint" grep -q "resumes from experiments/$id/checkpoints/" "$tmp/recovered.out"
check "its round table is intact (rounds 0..N in the final summary)" python3 -c '
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
s = [e["summary"] for e in events if "summary" in e][-1]
rounds = [r.get("round", 0) for r in s["rounds"]]
assert s["state"] == "SUCCEEDED" and rounds == list(range(len(rounds))) and len(rounds) >= 3, rounds' "$tmp/data/experiments/$id/events.jsonl"

# Token authentication, and no unauthenticated non-loopback listening.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
echo "s3cret-token" > "$tmp/token"
err=$("$TOPIARYD" --data_dir "$tmp/data" --listen 0.0.0.0:0 2>&1); rc=$?
check "non-loopback without --token_file is refused at start" bash -c '[[ $1 -eq 2 && "$0" == *"not a loopback address"* ]]' "$err" "$rc"
start_daemon --token_file "$tmp/token"
err=$("$TOPIARY" list 2>&1); rc=$?
check "no token: UNAUTHENTICATED (exit 7)" bash -c '[[ $1 -eq 7 && "$0" == *UNAUTHENTICATED* ]]' "$err" "$rc"
echo "wrong" > "$tmp/wrong"
"$TOPIARY" list --token_file "$tmp/wrong" > /dev/null 2>&1; rc=$?
check "wrong token: exit 7" test "$rc" -eq 7
"$TOPIARY" list --token_file "$tmp/token" > /dev/null; rc=$?
check "right token: exit 0" test "$rc" -eq 0

# TLS with a self-signed certificate for 127.0.0.1.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
  -keyout "$tmp/key.pem" -out "$tmp/cert.pem" > /dev/null 2>&1
start_daemon --tls_cert "$tmp/cert.pem" --tls_key "$tmp/key.pem"
"$TOPIARY" list --tls_ca "$tmp/cert.pem" > /dev/null; rc=$?
check "TLS: a client trusting the certificate connects" test "$rc" -eq 0
"$TOPIARY" list > /dev/null 2>&1; rc=$?
check "TLS: a plaintext client does not (exit 6)" test "$rc" -eq 6

# Bounds: the queue and the request size.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
start_daemon --max_queued 1
a=$(submit "$tmp/long.textproto"); wait_state "$a" RUNNING 30
b=$(submit "$tmp/long.textproto")
err=$("$TOPIARY" submit "$tmp/long.textproto" 2>&1); rc=$?
check "a full queue: RESOURCE_EXHAUSTED (exit 8)" bash -c '[[ $1 -eq 8 && "$0" == *RESOURCE_EXHAUSTED* ]]' "$err" "$rc"
python3 -c 'print("name: \"" + "x" * 2000000 + "\"\nmodel { arch: \"lenet5\" }\ntrain { epochs: 1 }")' > "$tmp/huge.textproto"
err=$("$TOPIARY" submit "$tmp/huge.textproto" 2>&1); rc=$?
check "a 2 MB request: RESOURCE_EXHAUSTED (exit 8)" bash -c '[[ $1 -eq 8 && "$0" == *RESOURCE_EXHAUSTED* ]]' "$err" "$rc"
"$TOPIARY" cancel "$b" > /dev/null
check "cancel while QUEUED: CANCELLED at once" test "$(state "$b")" == CANCELLED
"$TOPIARY" cancel "$a" > /dev/null
check "cancel while RUNNING: CANCELLED at the next step" wait_state "$a" CANCELLED 60
exit $fail
