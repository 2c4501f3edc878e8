#!/usr/bin/env bash
# The README's first command: install what is missing, build topiary and topiaryd, start the
# daemon on loopback, submit the default experiment (dense training, then block-pruning
# rounds to 50% on Fashion-MNIST), watch it with progress bars, print the round table and
# where the checkpoints are, and stop the daemon. On a GPU the full-size experiment (about 2
# minutes on an H100/H200); without one a smaller version (about 5 minutes on 2 cores).
# The daemon's data stays in runs/topiaryd/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
bazel build -c opt //clients:topiary //server:topiaryd
topiary=bazel-bin/clients/topiary
data=runs/topiaryd
mkdir -p "$data"
rm -f "$data/port"
bazel-bin/server/topiaryd --data_dir "$data" --listen 127.0.0.1:0 --port_file "$data/port" \
  2> "$data/topiaryd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do [ -s "$data/port" ] && break; sleep 0.1; done
export TOPIARY_SERVER="127.0.0.1:$(cat "$data/port")"
echo "topiaryd is listening on $TOPIARY_SERVER (log: $data/topiaryd.log)"

if "$topiary" info --json | grep -q '"gpus":\[{'; then
  spec=examples/fashion_resnet20_block50.textproto
else
  spec=examples/fashion_resnet20_block50_cpu.textproto
fi
id=$("$topiary" submit "$spec" --json | sed -E 's/.*"id":"([^"]+)".*/\1/')
echo "submitted $spec as $id"
"$topiary" watch "$id"
echo
"$topiary" checkpoints "$id"
echo
echo "checkpoints are in $data/experiments/$id/checkpoints/; inspect one with"
echo "  $topiary inspect --file $data/experiments/$id/checkpoints/dense.h5"
