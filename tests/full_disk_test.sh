#!/usr/bin/env bash
# topiaryd on a full disk (its data directory on a small tmpfs, filled up while experiments
# run): an acknowledged Cancel holds, even across a kill -9 before the run stopped; a run
# that cannot write ends FAILED saying so, and stays FAILED after a restart; nothing
# acknowledged is lost and the daemon lives throughout.
set -uo pipefail
TOPIARYD="$1"
TOPIARY="$2"
TINY="$3"
# The tmpfs lives in a mount namespace of this test's own, gone when it ends.
if [ -z "${TOPIARY_MOUNT_NS:-}" ]; then
  exec unshare -m --propagation private env TOPIARY_MOUNT_NS=1 bash "$0" "$@"
fi
tmp="${TEST_TMPDIR:-/tmp}/full_disk_test"
rm -rf "$tmp" && mkdir -p "$tmp/data"
mount -t tmpfs -o size=48m tmpfs "$tmp/data" || { echo "FAIL: cannot mount a tmpfs"; exit 1; }
source "$(dirname "$0")/daemon_lib.sh"
alive() { kill -0 "$daemon_pid" 2>/dev/null && "$TOPIARY" list > /dev/null 2>&1; }
record() {  # record ID FIELD: the field of the experiment's record on disk
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' \
    "$tmp/data/experiments/$1/experiment.json" "$2"
}
fill() { cat /dev/zero > "$tmp/data/ballast" 2>/dev/null; sync; }

sed 's/epochs: [0-9]*/epochs: 50/' "$TINY" > "$tmp/long.textproto"
start_daemon --max_restarts 5
check "the daemon keeps a reserve for acknowledged records" test -s "$tmp/data/.reserve"

# 1. Cancel on a full disk, then kill -9 at once: the cancel is on disk before it is answered.
a=$(submit "$tmp/long.textproto")
wait_state "$a" RUNNING 60 > /dev/null
fill
out=$("$TOPIARY" cancel "$a" 2>&1); rc=$?
check "cancel of a running experiment on a full disk is acknowledged (exit $rc)" test "$rc" -eq 0
on_disk="$(record "$a" cancel_requested) $(record "$a" state)"
check "... and recorded before the answer ($on_disk)" \
  bash -c '[[ "$0" == "True "* || "$0" == *CANCELLED ]]' "$on_disk"
kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
start_daemon --max_restarts 5
check "after kill -9 and a restart on the full disk, the daemon serves" alive
check "the cancelled experiment is CANCELLED, not run again" wait_state "$a" CANCELLED 10
check "... on disk too" test "$(record "$a" state)" == CANCELLED

# 2. A run that fills the disk itself: it ends FAILED saying the disk is full, the record
# says so, and a restart does not run it again.
rm -f "$tmp/data/ballast"
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null; rc=$?
check "it stops cleanly on SIGTERM after the full disk (exit $rc)" test "$rc" -eq 0
start_daemon --max_restarts 5
b=$(submit "$tmp/long.textproto")
wait_state "$b" RUNNING 60 > /dev/null
fill
check "a run on the full disk ends FAILED" wait_state "$b" FAILED 120
err=$("$TOPIARY" get "$b" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"])')
check "its error says the disk is full: $err" bash -c '[[ "$0" == *"disk is full"* ]]' "$err"
check "the daemon is alive" alive
kill -9 "$daemon_pid"; wait "$daemon_pid" 2>/dev/null
start_daemon --max_restarts 5
check "after a restart it is still FAILED" wait_state "$b" FAILED 10
check "a submission on the full disk is refused, not half-made" \
  bash -c '! "$0" submit "$1" > /dev/null 2>&1' "$TOPIARY" "$tmp/long.textproto"
check "the daemon still serves" alive
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null; rc=$?
grep -a "topiaryd" "$tmp/daemon.log" | tail -5
check "it stops cleanly on SIGTERM at the end (exit $rc, not a signal)" test "$rc" -eq 0
check "no crash in the daemon's log" bash -c '! grep -qaE "Segmentation|Aborted|terminate called" "$0"' "$tmp/daemon.log"
umount "$tmp/data"
exit $fail
