#!/usr/bin/env bash
# deploy/nginx-topiaryd.conf in front of topiaryd: the CLI works through it, and an HTTP/2
# header block that never ends (HEADERS + CONTINUATION frames, sent before any
# authentication) grows neither nginx nor topiaryd. topiaryd alone (gRPC 1.51) keeps such a
# block in memory: ~2 GB in 8 s, which is why network exposure goes through the front end
# (docs/deploy.md). Args: TOPIARYD TOPIARY NGINX_CONF H2_FLOOD_PY
set -uo pipefail
TOPIARYD="$PWD/$1"; TOPIARY="$PWD/$2"; CONF="$PWD/$3"; FLOOD="$PWD/$4"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source "$(dirname "$0")/daemon_lib.sh"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [ ! -x "$NGINX" ]; then
  echo "FAIL: nginx is not installed (scripts/install_deps.sh installs nginx-light)"; exit 1
fi
echo "test" > "$tmp/token"
start_daemon --token_file "$tmp/token"
backend=$(cat "$tmp/port")
front=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The shipped file with this test's ports and a scratch folder for nginx's own files.
sed -e "s|127.0.0.1:7443|127.0.0.1:$front|; s|127.0.0.1:7077|127.0.0.1:$backend|" \
    -e "s|/tmp/nginx-topiaryd|$tmp/nginx|g" "$CONF" > "$tmp/nginx.conf"
# One process in the foreground (no master; it stays the user the test runs as, since a
# sandbox's user namespace cannot hand folders to nobody): its memory is what is measured.
"$NGINX" -c "$tmp/nginx.conf" -e "$tmp/nginx.stderr" -g 'daemon off; master_process off; user root;' \
  2>> "$tmp/nginx.stderr" &
worker=$!
trap 'kill -9 $daemon_pid $worker 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s "$tmp/nginx.pid" ] && break; sleep 0.1; done
export TOPIARY_SERVER="127.0.0.1:$front" TOPIARY_TOKEN_FILE="$tmp/token"
check "the CLI works through nginx (list)" "$TOPIARY" list
[ "$fail" -eq 0 ] || { echo "nginx said:"; cat "$tmp/nginx.stderr"; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
before_daemon=$(rss "$daemon_pid")
python3 "$FLOOD" "$front" "$worker" 4 | tee "$tmp/flood.out"
peak=$(grep -oE 'peak [0-9]+' "$tmp/flood.out" | awk '{print $2}')
check "nginx stays under 64 MiB during the flood (peak ${peak} MiB)" test "$peak" -lt 64
after_daemon=$(rss "$daemon_pid")
check "topiaryd does not grow by 64 MiB ($((before_daemon / 1024)) -> $((after_daemon / 1024)) MiB)" \
  test $((after_daemon - before_daemon)) -lt 65536
check "the daemon still serves through nginx" "$TOPIARY" list
unset TOPIARY_TOKEN_FILE
check "a call without the token is refused through nginx" bash -c '! "$0" list 2>/dev/null' "$TOPIARY"
[ "$fail" -eq 0 ] && echo PASS
exit "$fail"
