# Shell helpers of the daemon tests (sourced): checks, a daemon on a free loopback port, and
# experiment states. The caller sets TOPIARYD, TOPIARY and tmp (its scratch folder).
fail=0
check() {  # check DESCRIPTION COMMAND...: prints ok/FAIL; a failure sets fail=1
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
daemon_pid=""
start_daemon() {  # start_daemon EXTRA_FLAGS...
  rm -f "$tmp/port"
  "$TOPIARYD" --data_dir "$tmp/data" --listen 127.0.0.1:0 --port_file "$tmp/port" "$@" \
    >> "$tmp/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  export TOPIARY_SERVER="127.0.0.1:$(cat "$tmp/port")"
}
state() { "$TOPIARY" get "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
wait_state() {  # wait_state ID STATE [SECONDS]: true when ID reaches STATE in time
  for _ in $(seq $((${3:-120} * 5))); do
    [ "$(state "$1")" == "$2" ] && return 0
    sleep 0.2
  done
  echo "  $1 is $(state "$1"), expected $2"; return 1
}
submit() { "$TOPIARY" submit "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
trap 'kill -9 $daemon_pid 2>/dev/null' EXIT
