#!/usr/bin/env bash
# Hostile inputs against the real binaries: every one gets a clear error (exit code, gRPC code
# naming the field or file), nothing crashes or wedges, and the daemon keeps serving.
# Each check here reproduces a finding that crashed, wedged, exhausted or escaped before.
set -uo pipefail
TOPIARYD="$1"
TOPIARY="$2"
MAKE_HOSTILE="$3"  # tests/tools:make_hostile_files
TINY="$4"          # examples/tiny.textproto
tmp="${TEST_TMPDIR:-/tmp}/hostile_daemon_test"
rm -rf "$tmp" && mkdir -p "$tmp/data/hostile" "$tmp/elsewhere"
source "$(dirname "$0")/daemon_lib.sh"
alive() { kill -0 "$daemon_pid" 2>/dev/null && "$TOPIARY" list > /dev/null 2>&1; }

# Hostile checkpoints, written into the data directory (as a local user could).
"$MAKE_HOSTILE" "$tmp/data/hostile" "$tmp/elsewhere/outside.h5" > "$tmp/cases.tsv"
check "hostile checkpoints written" test "$(wc -l < "$tmp/cases.tsv")" -ge 17

# 1. The CLI's local inspect: a clear error and exit 3, 4 or 7, never a signal.
while IFS=$'\t' read -r name needle; do
  err=$("$TOPIARY" inspect --file "$tmp/data/hostile/$name" 2>&1); rc=$?
  check "inspect --file $name: exit $rc, says '$needle'" \
    bash -c '[[ $1 -eq 3 || $1 -eq 7 ]] && [[ "$0" == *"$2"* ]]' "$err" "$rc" "$needle"
done < "$tmp/cases.tsv"
# ... and export --onnx, which reads the file the same way and writes nothing.
while IFS=$'\t' read -r name needle; do
  err=$("$TOPIARY" export "$tmp/data/hostile/$name" --onnx "$tmp/x.onnx" 2>&1); rc=$?
  check "export $name: exit $rc, says '$needle', no file" \
    bash -c '[[ $1 -eq 3 || $1 -eq 7 ]] && [[ "$0" == *"$2"* ]] && [[ ! -e $3 ]]' \
    "$err" "$rc" "$needle" "$tmp/x.onnx"
done < "$tmp/cases.tsv"
out=$("$TOPIARY" inspect --file "$tmp/data/hostile/float_mask.h5" --json); rc=$?
check "inspect --file --json error is valid JSON (exit $rc)" python3 -c '
import json, sys; e = json.loads(sys.argv[1]); assert "a mask must be uint8" in e["error"]' "$out"

# A small --max_file_bytes keeps the gzip bomb below quick to make.
start_daemon --max_restarts 2 --max_file_bytes 67108864
# 2. Through the daemon: inspect and fork of every hostile file; the daemon keeps serving.
while IFS=$'\t' read -r name needle; do
  err=$("$TOPIARY" inspect --remote "hostile/$name" 2>&1); rc=$?
  check "daemon inspect $name: exit $rc, says '$needle'" \
    bash -c '[[ $1 -eq 3 || $1 -eq 7 ]] && [[ "$0" == *"$2"* ]]' "$err" "$rc" "$needle"
done < "$tmp/cases.tsv"
check "the daemon is alive after every hostile inspect" alive
for name in huge_kernel.h5 float_mask.h5 external_link.h5 nan.h5; do
  id=$("$TOPIARY" fork "hostile/$name" --json 2>/dev/null |
       python3 -c 'import json,sys; print(json.load(sys.stdin).get("id",""))' 2>/dev/null)
  if [ -n "$id" ]; then
    check "fork of $name ends FAILED (not RUNNING forever)" wait_state "$id" FAILED 60
  else
    check "fork of $name is refused at once" true
  fi
done
check "inspect of a good checkpoint still answers (no wedged HDF5 lock)" \
  bash -c '"$0" inspect --remote hostile/good.h5 > /dev/null' "$TOPIARY"

# 3. Specs: bounded counts, finite numbers, known enums, regular files, no control characters.
base='model { arch: "lenet5" }'
for case in "train { epochs: 100000000 }|train.epochs" \
            "train { epochs: 1 optimizer { lr: inf } }|train.optimizer.lr" \
            "train { epochs: 1 lr_schedule { warmup_epochs: inf } }|train.lr_schedule.warmup_epochs" \
            "train { epochs: 1 } device { threads: 100000 }|device.threads" \
            "train { epochs: 1 } device { kind: CPU threads: 128 cpu_ranks: 8 }|device.threads" \
            "train { epochs: 1 } data { dataset: 99 }|data.dataset" \
            "name: \"a\\nb\" train { epochs: 1 }|name"; do
  printf '%s %s\n' "$base" "${case%%|*}" > "$tmp/spec.textproto"
  err=$("$TOPIARY" submit "$tmp/spec.textproto" 2>&1); rc=$?
  check "submit with ${case%%|*}: INVALID_ARGUMENT naming ${case##*|} (exit $rc)" \
    bash -c '[[ $1 -eq 3 && "$0" == *INVALID_ARGUMENT*"$2: "* ]]' "$err" "$rc" "${case##*|}"
done
err=$(timeout 10 "$TOPIARY" validate /dev/zero 2>&1); rc=$?
check "validate /dev/zero: refused at once (exit $rc)" bash -c '[[ $1 -eq 3 && "$0" == *"not a regular file"* ]]' "$err" "$rc"
err=$("$TOPIARY" validate "$tmp" 2>&1); rc=$?
check "validate of a folder: 'is a folder' (exit $rc)" bash -c '[[ $1 -eq 3 && "$0" == *"is a folder, not a file"* ]]' "$err" "$rc"
out=$("$TOPIARY" validate "$tmp/spec.textproto" --json); rc=$?
check "validate --json error is valid JSON" python3 -c '
import json, sys; e = json.loads(sys.argv[1]); assert not e["valid"] and e["error"].startswith("name:")' "$out"
python3 -c '
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
call = ch.unary_unary("/topiary.v1.Topiary/SubmitExperiment",
                      request_serializer=lambda x: x, response_deserializer=lambda x: x)
try:
    call(b"\x0a\x83\x80\x80\x01" + b"x" * (2 << 20), timeout=10)
except grpc.RpcError as e:
    sys.exit(0 if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else 1)
sys.exit(1)' "$TOPIARY_SERVER"
check "a 2 MB request: RESOURCE_EXHAUSTED from the daemon" test $? -eq 0

# 4. Datasets: a link out of the data directory, /dev/zero, a gzip bomb: the run FAILS with
# the file named, the daemon lives.
mkdir -p "$tmp/data/ds_link" "$tmp/data/ds_zero" "$tmp/data/ds_bomb"
printf 'root:x:0:0:root:/root:/bin/bash\n' > "$tmp/elsewhere/secret"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  ln -s "$tmp/elsewhere/secret" "$tmp/data/ds_link/$f"
  ln -s /dev/zero "$tmp/data/ds_zero/$f"
done
python3 - "$tmp/data/ds_bomb" <<'EOF'
import gzip, struct, sys
d = sys.argv[1]
# 256 MiB of pixels from 256 KiB of gzip: inflation stops at the daemon's 64 MiB limit.
with gzip.open(d + "/train-images-idx3-ubyte.gz", "wb", compresslevel=9) as f:
    f.write(struct.pack(">IIII", 0x803, 1 << 22, 8, 8))
    block = bytes(1 << 24)
    for _ in range(16):
        f.write(block)
for name, n in (("train-labels-idx1-ubyte", 1 << 22), ("t10k-labels-idx1-ubyte", 1)):
    open(d + "/" + name, "wb").write(struct.pack(">II", 0x801, n) + bytes(n))
open(d + "/t10k-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, 1, 28, 28) + bytes(784))
EOF
for ds in ds_link ds_zero ds_bomb; do
  printf 'name: "%s"\nmodel { arch: "lenet5" }\ndata { dataset: MNIST path: "%s" }\ntrain { epochs: 1 }\n' \
    "$ds" "$tmp/data/$ds" > "$tmp/$ds.textproto"
  id=$(submit "$tmp/$ds.textproto")
  check "dataset $ds: the run ends FAILED" wait_state "$id" FAILED 120
  err=$("$TOPIARY" get "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"])')
  case $ds in
    ds_link) want="outside the folders this process may read" ;;
    ds_zero) want="outside the folders this process may read" ;;
    ds_bomb) want="inflates to more than the limit" ;;
  esac
  check "dataset $ds: the error says '$want'" bash -c '[[ "$0" == *"$1"* && "$0" != *0x726f6f74* ]]' "$err" "$want"
done
check "the daemon is alive after the hostile datasets" alive

# 5. A pause answered by an immediate resume is never lost, whatever the run was doing.
sed 's/epochs: 2/epochs: 5/' "$TINY" > "$tmp/five.textproto"
for i in 1 2 3; do
  id=$(submit "$tmp/five.textproto")
  wait_state "$id" RUNNING 30 > /dev/null
  "$TOPIARY" pause "$id" > /dev/null; "$TOPIARY" resume "$id" > /dev/null; rc=$?
  check "pause then resume ($i): resume accepted (exit $rc)" test "$rc" -eq 0
  "$TOPIARY" watch "$id" > /dev/null 2>&1; rc=$?
  check "pause then resume ($i): the experiment finishes SUCCEEDED" test "$(state "$id")" == SUCCEEDED
done

# 6. Authentication covers reflection; health stays open for probes.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
echo "s3cret" > "$tmp/token"
start_daemon --token_file "$tmp/token"
check "with --token_file: health answers without a token, reflection does not" python3 -c '
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
raw = dict(request_serializer=lambda x: x, response_deserializer=lambda x: x)
assert ch.unary_unary("/grpc.health.v1.Health/Check", **raw)(b"", timeout=10) == b"\x08\x01"
info = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", **raw)
try:
    got = b"".join(info(iter([b"\x3a\x00"]), timeout=10))
    sys.exit("reflection answered without a token: %r" % got[:80])
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.code()
md = [("authorization", "Bearer s3cret")]
got = b"".join(info(iter([b"\x3a\x00"]), timeout=10, metadata=md))
assert b"topiary.v1.Topiary" in got' "$TOPIARY_SERVER"
check "an unauthenticated submit queues nothing" python3 -c '
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
call = ch.unary_unary("/topiary.v1.Topiary/SubmitExperiment",
                      request_serializer=lambda x: x, response_deserializer=lambda x: x)
try:
    call(open(sys.argv[2], "rb").read(), timeout=10); sys.exit(1)
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.code()' "$TOPIARY_SERVER" /dev/null
before=$("$TOPIARY" list --token_file "$tmp/token" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("experiments", [])))')
err=$("$TOPIARY" submit "$TINY" 2>&1); rc=$?
after=$("$TOPIARY" list --token_file "$tmp/token" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("experiments", [])))')
check "submit without the token: UNAUTHENTICATED (exit $rc), nothing added ($before -> $after)" \
  bash -c '[[ $1 -eq 7 && "$0" == *UNAUTHENTICATED* && $2 -eq $3 ]]' "$err" "$rc" "$before" "$after"
unset TOPIARY_TOKEN_FILE

# 7. A crash loop ends FAILED after --max_restarts instead of restarting forever.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
start_daemon --max_restarts 2 --max_file_bytes 67108864
sed 's/epochs: [0-9]*/epochs: 50/' "$TINY" > "$tmp/long.textproto"
id=$(submit "$tmp/long.textproto")
for round in 1 2; do
  wait_state "$id" RUNNING 30 > /dev/null
  kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
  start_daemon --max_restarts 2 --max_file_bytes 67108864
done
check "after 2 deaths without a checkpoint the experiment is FAILED" wait_state "$id" FAILED 10
err=$("$TOPIARY" get "$id")
check "its error says why" bash -c '[[ "$0" == *"the daemon stopped 2 times while this experiment ran"* ]]' "$err"
check "the daemon serves on" alive
"$TOPIARY" cancel "$id" > /dev/null 2>&1

# 8. The third pass: model import, write-side links, experiment folders, concurrency, a FIFO
# at start-up, escape sequences in names.
python3 - "$tmp/data" <<'EOF'
import sys
import numpy as np
from onnx import TensorProto, helper
d = sys.argv[1]
def model(nodes, inits, in_dims, out_name="y"):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims)],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
# ~100 bytes whose output is its own input: killed the daemon.
open(d + "/self.onnx", "wb").write(model([], [], [1, 3, 8, 8], out_name="x"))
# A valid model with 32 MB of weights: an import takes a while.
n = 3 * 512 * 512
w = helper.make_tensor("w", TensorProto.FLOAT, [10, n], np.zeros(10 * n, np.float32).tobytes(), raw=True)
open(d + "/big.onnx", "wb").write(model([helper.make_node("Flatten", ["x"], ["f"], name="flat"),
                                         helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)],
                                        [w], [1, 3, 512, 512]))
EOF
err=$("$TOPIARY" import --remote self.onnx --out self.h5 2>&1); rc=$?
check "import --remote of an ONNX whose output is its input: exit $rc, no crash" \
  bash -c '[[ $1 -eq 3 && "$0" == *"is the graph'"'"'s input"* ]]' "$err" "$rc"
check "the daemon is alive after it" alive
ln -s "$tmp/elsewhere" "$tmp/data/up"
err=$("$TOPIARY" import --remote big.onnx --out up/made/x.h5 2>&1); rc=$?
check "import --remote through a planted link: refused (exit $rc), no folder made outside" \
  bash -c '[[ $1 -ne 0 && "$0" == *PERMISSION_DENIED* && ! -e $2 ]]' "$err" "$rc" "$tmp/elsewhere/made"
mkdir -p "$tmp/data/experiments/exp-0001/checkpoints"
err=$("$TOPIARY" import --remote big.onnx --out experiments/exp-0001/checkpoints/pause.h5 2>&1); rc=$?
check "import --remote into an experiment's folder: PERMISSION_DENIED (exit $rc)" \
  bash -c '[[ $1 -ne 0 && "$0" == *PERMISSION_DENIED*"belong to the daemon"* ]]' "$err" "$rc"
# Eight imports at once: two run, the others are told to come back; nothing else happens.
pids=()
for i in 1 2 3 4 5 6 7 8; do
  "$TOPIARY" import --remote big.onnx --out "conc/$i.h5" > "$tmp/import_$i.out" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
ok_n=$(grep -L "topiary:" "$tmp"/import_*.out | wc -l)
busy_n=$(grep -l "RESOURCE_EXHAUSTED.*imports are under way" "$tmp"/import_*.out | wc -l)
check "8 concurrent imports: $ok_n done, $busy_n told to retry, none otherwise" \
  bash -c '[[ $0 -ge 1 && $1 -ge 1 && $(($0 + $1)) -eq 8 ]]' "$ok_n" "$busy_n"
check "the daemon is alive after them" alive
# A file name carrying escape sequences fails its run; what the client prints has none.
mkdir -p "$tmp/data/ds_esc/train/a" "$tmp/data/ds_esc/val/a"
printf 'not an image' > "$tmp/data/ds_esc/train/a/"$'\e]0;pwned\a\e[2J'".png"
printf 'not an image' > "$tmp/data/ds_esc/val/a/x.png"
printf 'name: "esc"\nmodel { arch: "lenet5" }\ndata { dataset: IMAGE_FOLDER path: "%s" image_folder { image_size: 28 channels: 1 } }\ntrain { epochs: 1 }\n' \
  "$tmp/data/ds_esc" > "$tmp/esc.textproto"
id=$(submit "$tmp/esc.textproto")
check "a run reading a file named with escape sequences ends FAILED" wait_state "$id" FAILED 60
"$TOPIARY" get "$id" > "$tmp/esc_get.out" 2>&1
"$TOPIARY" watch "$id" > "$tmp/esc_watch.out" 2>&1
check "get and watch print its name without the escape sequences" bash -c \
  '! grep -q $'"'"'\e'"'"' "$0" "$1" && grep -q "?]0;pwned??\[2J" "$0" && grep -q "?]0;pwned??\[2J" "$1"' \
  "$tmp/esc_get.out" "$tmp/esc_watch.out"
# A FIFO planted as an experiment's event log: the daemon still starts and serves.
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
rm -f "$tmp/data/experiments/$id/events.jsonl"
mkfifo "$tmp/data/experiments/$id/events.jsonl"
start_daemon --max_restarts 2 --max_file_bytes 67108864
check "with a FIFO as an event log, the daemon listens and serves" alive
check "... and still has that experiment" bash -c '"$0" get "$1" > /dev/null' "$TOPIARY" "$id"

# 9. SIGTERM stops the daemon promptly after all this.
kill "$daemon_pid"
for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
check "SIGTERM stops the daemon within 10 s" bash -c '! kill -0 "$0" 2>/dev/null' "$daemon_pid"
exit $fail
