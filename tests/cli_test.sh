#!/usr/bin/env bash
# End-to-end test of the topiary binary: help, validation errors, exit codes, and a real
# run on Fashion-MNIST with --json and --out.
set -uo pipefail
TOPIARY="$1"
SPEC="$2"
README="$4"
tmp="${TEST_TMPDIR:-/tmp}/cli_test"
rm -rf "$tmp" && mkdir -p "$tmp"
fail=0
check() {  # check DESCRIPTION COMMAND...
  local what="$1"; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}

help=$("$TOPIARY" --help)
check "--help exits 0 and lists every command" \
  bash -c '[[ "$0" == *"run SPEC"* && "$0" == *"validate SPEC"* && "$0" == *"info"* && "$0" == *"--json"* ]]' "$help"
# The README's command reference and --help name the same commands (with the same remote
# forms), so that neither falls behind the other.
check "README's command reference and --help name the same commands" python3 - "$README" <<'EOF' "$help"
import re, sys
readme, help_text = open(sys.argv[1]).read(), sys.argv[2]
block = readme[readme.index("## The `topiary` command"):]
block = block[block.index("```") + 3:]
block = block[:block.index("```")]
def commands(lines):
    # "topiary get ID | watch ID": every word after "topiary " or "| " that names a command,
    # with --remote where that form is meant.
    found = set()
    for line in lines:
        m = re.match(r"\s*topiary (.*)", line)
        if not m:
            continue
        for alt in re.split(r"\s\|\s", m.group(1)):
            words = alt.split()
            if words and re.fullmatch(r"[a-z]+", words[0]):
                found.add(words[0] + (" --remote" if "--remote" in words[1:3] else ""))
    return found
in_help = commands(help_text.splitlines()) - {"help"}
in_readme = commands(block.splitlines())
if in_help != in_readme:
    sys.exit("only in --help: %s; only in README: %s" % (sorted(in_help - in_readme), sorted(in_readme - in_help)))
EOF

"$TOPIARY" run >/dev/null 2>&1; rc=$?
check "run without SPEC is a usage error (2)" test "$rc" -eq 2
"$TOPIARY" run "$SPEC" --bogus >/dev/null 2>&1; rc=$?
check "unknown flag is a usage error (2)" test "$rc" -eq 2
"$TOPIARY" round x --target abc 2>"$tmp/flag.err"; rc=$?
check "a flag value of the wrong type is a usage error (2) naming the flag" \
  bash -c '[[ $1 -eq 2 ]] && grep -q "^topiary: --target: " "$0"' "$tmp/flag.err" "$rc"
"$TOPIARY" watch x --from 2>"$tmp/flag.err"; rc=$?
check "a flag without its value is a usage error (2)" \
  bash -c '[[ $1 -eq 2 ]] && grep -q -- "--from needs a value" "$0"' "$tmp/flag.err" "$rc"
# Multipliers: the published L40 figures, a held-out table, and a wrong-size file.
l40=data/multipliers/evoapprox8b/mul8u_L40.bin
"$TOPIARY" multipliers --json "$l40" exact > "$tmp/mult.json"; rc=$?
check "multipliers --json: mul8u_L40's published MAE, WCE, EP, MRE, power and area; exact is mul8u_1JFF" \
  python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
l40, exact = rows
assert round(l40["mae"]) == 1011 and l40["wce"] == 9124, l40
assert abs(l40["ep_pct"] - 74.91) < 0.005 and abs(l40["mre_pct"] - 7.46) < 0.005, l40
assert l40["power_mw"] == 0.189 and l40["area_um2"] == 437.4 and len(l40["sha256"]) == 64, l40
assert exact["mae"] == 0 and exact["known_circuit"] == "mul8u_1JFF", exact
' "$tmp/mult.json"
head -c 131072 /dev/urandom > "$tmp/held_out.bin"
out=$("$TOPIARY" multipliers mul8u_L40 --json 2>&1); rc=$?
check "a shipped table by its name alone (mul8u_L40, 0.189 mW)" \
  bash -c '[[ $1 -eq 0 && "$0" == *"\"power_mw\":0.189"* ]]' "$out" "$rc"
"$TOPIARY" multipliers "$tmp/held_out.bin" > "$tmp/held.out"; rc=$?
check "a held-out 131,072-byte table works (exit 0, metrics printed)" \
  bash -c '[[ $1 -eq 0 ]] && grep -q "^held_out " "$0"' "$tmp/held.out" "$rc"
head -c 1000 /dev/urandom > "$tmp/short.bin"
"$TOPIARY" multipliers "$tmp/short.bin" 2> "$tmp/short.err"; rc=$?
check "a wrong-size table is refused (exit 3) naming the file and the size" \
  bash -c '[[ $1 -eq 3 ]] && grep -q "short.bin: must be exactly 131072 bytes" "$0"' "$tmp/short.err" "$rc"
"$TOPIARY" multipliers drum:12 2> "$tmp/drum.err"; rc=$?
check "a bad family parameter is refused (exit 3) naming it" \
  bash -c '[[ $1 -eq 3 ]] && grep -q "drum:12" "$0"' "$tmp/drum.err" "$rc"
"$TOPIARY" multipliers "$l40" --png "$tmp/l40.png" > /dev/null 2> "$tmp/png_l40.err"; rc1=$?
"$TOPIARY" multipliers exact --png "$tmp/exact.png" > /dev/null 2>&1; rc2=$?
check "--png says where it wrote" grep -q "^wrote $tmp/l40.png: " "$tmp/png_l40.err"
check "--png writes the error surface (one pixel per entry at 48,40), labelled axes and a colour bar; exact all white, L40 red and blue" \
  bash -c '[[ $1 -eq 0 && $2 -eq 0 ]] && python3 -c "
import struct, sys, zlib
L, T = 48, 40
def pixels(path):
    b = open(path, \"rb\").read()
    assert b[:8] == b\"\\x89PNG\\r\\n\\x1a\\n\"
    pos, idat = 8, b\"\"
    while pos < len(b):
        n, kind = struct.unpack(\">I4s\", b[pos:pos + 8])
        data = b[pos + 8:pos + 8 + n]
        assert struct.unpack(\">I\", b[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + data)
        if kind == b\"IHDR\":
            w, h, depth, colour = struct.unpack(\">IIBB\", data[:10])
            assert (depth, colour) == (8, 2) and w >= L + 256 + 40 and h >= T + 256
        if kind == b\"IDAT\": idat += data
        pos += 12 + n
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    rows = [raw[r * (1 + 3 * w) + 1:(r + 1) * (1 + 3 * w)] for r in range(h)]
    return [[tuple(r[3 * x:3 * x + 3]) for x in range(w)] for r in rows]
def plot(img): return [p for r in img[T:T + 256] for p in r[L:L + 256]]
exact, l40 = pixels(sys.argv[1]), pixels(sys.argv[2])
assert all(p == (255, 255, 255) for p in plot(exact))
px = plot(l40)
assert any(p[0] == 255 and p[2] < 255 for p in px) and any(p[2] == 255 and p[0] < 255 for p in px)
assert l40[T][L] == (255, 255, 255)  # a = 0, w = 0: exact
# Labels (black) left of and above the plot; the bar right of it: red on top, blue below.
assert any(p == (0, 0, 0) for r in l40[T:T + 256] for p in r[:L])
assert any(p == (0, 0, 0) for r in l40[:T] for p in r[L:L + 256])
bar = [r[L + 256 + 24 + 8] for r in l40[T:T + 256]]
assert bar[0][0] == 255 and bar[0][2] < 255 and bar[-1][2] == 255 and bar[-1][0] < 255
" "$0" "$3"' "$tmp/exact.png" "$rc1" "$rc2" "$tmp/l40.png"
"$TOPIARY" multipliers exact trunc:2 --png "$tmp/two.png" 2> "$tmp/png.err"; rc=$?
check "--png with two multipliers is refused (exit 3)" bash -c '[[ $1 -eq 3 ]] && grep -q "exactly one" "$0"' "$tmp/png.err" "$rc"
check "--help lists every flag with its help" \
  bash -c 'for f in out resume file layer server token_file tls_ca state name from target step budget png epochs set json watch; do grep -q -- "^  --$f " <<<"$0" || exit 1; done' "$help"

printf 'model { arch: "lenet5" }\ndata { batch_size: -4 }\ntrain { epochs: 1 }\n' > "$tmp/bad.textproto"
err=$("$TOPIARY" run "$tmp/bad.textproto" 2>&1); rc=$?
check "invalid spec exits 3" test "$rc" -eq 3
check "invalid spec names the field" bash -c '[[ "$0" == *"data.batch_size: must be > 0"* ]]' "$err"
printf 'model { arch: "lenet5" colour: 3 }\n' > "$tmp/unknown.textproto"
err=$("$TOPIARY" validate "$tmp/unknown.textproto" 2>&1); rc=$?
check "unknown spec field is an error naming it" bash -c '[[ $1 -eq 3 && "$0" == *colour* ]]' "$err" "$rc"
sed 's|^data {|data { path: "/nonexistent/fashion"|' "$SPEC" > "$tmp/nodata.textproto"
err=$("$TOPIARY" validate "$tmp/nodata.textproto" 2>&1); rc=$?
check "validate refuses a dataset folder that is not there (exit 3, naming data.path)" \
  bash -c '[[ $1 -eq 3 && "$0" == *"data.path: dataset folder /nonexistent/fashion does not exist"* ]]' "$err" "$rc"
err=$("$TOPIARY" run 2>&1); rc=$?
check "a usage error is one line and a pointer to --help" \
  bash -c '[[ $1 -eq 2 && $(printf "%s\n" "$0" | wc -l) -eq 1 && "$0" == *"see topiary --help"* ]]' "$err" "$rc"
out=$("$TOPIARY" validate "$SPEC"); rc=$?
check "validate prints defaults" bash -c '[[ $1 -eq 0 && "$0" == *"eval_batch_size: 64"* ]]' "$out" "$rc"

"$TOPIARY" run "$SPEC" --json --out "$tmp/run" > "$tmp/events.jsonl" 2> "$tmp/stderr"; rc=$?
check "run exits 0" test "$rc" -eq 0
check "run --out writes TensorBoard files, in a folder named by the run" test -s "$tmp/run/tensorboard/tiny/events.out.tfevents.topiaryd"
last=$(tail -n 1 "$tmp/events.jsonl")
check "first line is the started event" bash -c 'head -n 1 "$0" | grep -q "\"event\":\"started\""' "$tmp/events.jsonl"
check "planning events follow, one done per network" bash -c '[[ $(grep -c "\"event\":\"planning\".*\"done\":true" "$0") -eq 2 ]] && sed -n 2p "$0" | grep -q "\"network\":\"training, batch"' "$tmp/events.jsonl"
check "the planning done events report what runs each layer" grep -q '"event":"planning".*"layers":\[".* (conv2d): ' "$tmp/events.jsonl"
check "epoch event with test metrics" grep -q '"event":"epoch".*"evaluated":true' "$tmp/events.jsonl"
for key in state test_top1 test_loss epochs seconds device checkpoint; do
  check "summary has $key" bash -c '[[ "$0" == *"\"$1\":"* ]]' "$last" "$key"
done
check "summary says SUCCEEDED" bash -c '[[ "$0" == *"\"state\":\"SUCCEEDED\""* ]]' "$last"
top1=$(echo "$last" | sed -E 's/.*"test_top1":([0-9.e-]+).*/\1/')
check "lenet5 learns (test top-1 $top1 > 0.7)" awk -v t="$top1" 'BEGIN { exit !(t > 0.7) }'
for f in spec.textproto events.jsonl summary.json; do
  check "--out wrote $f" test -s "$tmp/run/$f"
done
check "no progress bar when stderr is not a terminal" bash -c '! grep -q "ETA" "$0"' "$tmp/stderr"
check "dense run writes dense.h5" test -s "$tmp/run/checkpoints/dense.h5"

# Evaluation under multipliers, without training, and the per-layer sensitivity report.
dense="$tmp/run/checkpoints/dense.h5"
"$TOPIARY" evaluate "$dense" --json > "$tmp/eval.json"; rc=$?
check "evaluate without --set gives the run's own test top-1" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
e = json.load(open(sys.argv[1]))
assert e[\"top1\"] == float(sys.argv[2]) and e[\"images\"] == 1000 and e[\"rules\"] == [], e
" "$0" "$2"' "$tmp/eval.json" "$rc" "$top1"
"$TOPIARY" evaluate "$dense" --bench --batch 50 --json > "$tmp/bench.jsonl"; rc=$?
check "evaluate --bench: both engines, the run's top-1, speed, latency and every conv layer" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r[\"engine\"] for r in rows] == [\"dense\", \"dispatch\"], rows
for r in rows:
  assert abs(r[\"top1\"] - float(sys.argv[2])) <= 0.002 and r[\"batch\"] == 50, r
  assert r[\"images_per_s\"] > 0 and r[\"batch1_ms\"] > 0 and len(r[\"layers\"]) == 2, r
  assert r[\"block_sparse_passes\"] == 0 and r[\"joules_per_image\"] == 0, r  # CPU
" "$0" "$2"' "$tmp/bench.jsonl" "$rc" "$top1"
"$TOPIARY" evaluate "$dense" --multipliers exact,trunc:6 --weight_code asymmetric,sign_magnitude \
  --json > "$tmp/eval_table.jsonl"; rc=$?
check "evaluate --multipliers: a row per multiplier and weight code, the exact table near the float model" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r[\"multiplier\"], r[\"weight_code\"]) for r in rows] == [(\"exact\", \"asymmetric\"), (\"exact\", \"sign_magnitude\"), (\"trunc:6\", \"asymmetric\"), (\"trunc:6\", \"sign_magnitude\")], rows
base = json.load(open(sys.argv[2]))
assert abs(rows[0][\"top1\"] - base[\"top1\"]) <= 0.01 and rows[0][\"power_mw\"] > 0, (rows[0], base)
assert rows[2][\"top1\"] < rows[0][\"top1\"] - 0.02 and rows[2][\"power_mw\"] is None, rows
assert all(r[\"images\"] == 1000 for r in rows), rows
" "$0" "$2"' "$tmp/eval_table.jsonl" "$rc" "$tmp/eval.json"
"$TOPIARY" evaluate "$dense" --multipliers exact,bogus:3 > "$tmp/eval_table.out" 2> "$tmp/eval_table.err"; rc=$?
check "evaluate --multipliers: an unknown one is refused (exit 3) before anything is evaluated" \
  bash -c '[[ $2 -eq 3 && ! -s "$0" ]] && grep -q "multipliers .bogus:3.: " "$1"' "$tmp/eval_table.out" "$tmp/eval_table.err" "$rc"
check "evaluate refuses --multipliers with --set" bash -c '"$0" evaluate "$1" --multipliers exact --set "*=exact" 2>&1 | grep -q "give one or the other"' "$TOPIARY" "$dense"
check "evaluate --bench refuses --set" bash -c '! "$0" evaluate "$1" --bench --set "*=exact" 2>/dev/null' "$TOPIARY" "$dense"
"$TOPIARY" evaluate "$dense" --set '*=exact' --json > "$tmp/eval_exact.json"; rc1=$?
"$TOPIARY" evaluate "$dense" --set '*=trunc:6' --set 'conv1=none' --json > "$tmp/eval_trunc.json"; rc2=$?
check "evaluate --set: the exact table within a point; dropping 6 bits of conv2's operands costs more" \
  python3 -c '
import json, sys
base, exact, trunc = (json.load(open(f)) for f in sys.argv[1:4])
assert abs(exact["top1"] - base["top1"]) <= 0.01, (exact, base)
assert trunc["top1"] < base["top1"] - 0.02, (trunc, base)
assert trunc["rules"] == [{"layer": "*", "multiplier": "trunc:6"}, {"layer": "conv1", "multiplier": None}], trunc
' "$tmp/eval.json" "$tmp/eval_exact.json" "$tmp/eval_trunc.json"
"$TOPIARY" evaluate "$dense" --set '*=drum:4' --json > "$tmp/eval_asym.json" 2> "$tmp/eval_asym.err"; rc1=$?
"$TOPIARY" evaluate "$dense" --set '*=drum:4' --weight_code sign_magnitude --weight_scales per_channel \
  --json > "$tmp/eval_sm.json" 2> "$tmp/eval_sm.err"; rc2=$?
check "evaluate: each layer's error at the codes it uses; asymmetric codes warn, sign-magnitude ones err less" \
  bash -c '[[ $2 -eq 0 && $3 -eq 0 ]] && python3 -c "
import json, sys
asym, sm = (json.load(open(f)) for f in sys.argv[1:3])
ua = {u[\"layer\"]: u for u in asym[\"code_use\"]}
us = {u[\"layer\"]: u for u in sm[\"code_use\"]}
assert sorted(ua) == sorted(us) == [\"conv1\", \"conv2\"], (ua, us)
assert ua[\"conv2\"][\"table_error_pct\"] == us[\"conv2\"][\"table_error_pct\"] > 0, (ua, us)
assert us[\"conv2\"][\"used_error_pct\"] < ua[\"conv2\"][\"used_error_pct\"], (ua, us)
far = [l for l, u in ua.items() if u[\"far\"]]
warned = open(sys.argv[3]).read()
assert far and all((\"warning: %s: drum:4 errs by\" % l) in warned for l in far), (far, warned)
" "$0" "$1" "$4"' "$tmp/eval_asym.json" "$tmp/eval_sm.json" "$rc1" "$rc2" "$tmp/eval_asym.err"
check "evaluate refuses an unknown --weight_scales naming the flag" \
  bash -c '"$0" evaluate "$1" --weight_scales per_row 2>&1 | grep -q "weight_scales .per_row.: expected per_tensor or per_channel"' "$TOPIARY" "$dense"
"$TOPIARY" evaluate "$dense" --set "conv2=$tmp/short.bin" 2> "$tmp/eval_short.err"; rc=$?
check "evaluate with a wrong-size table fails (exit 3) naming the rule and the file" \
  bash -c '[[ $1 -eq 3 ]] && grep -q "approximation.rules\[0\].multiplier: .*short.bin: must be exactly 131072 bytes" "$0"' "$tmp/eval_short.err" "$rc"
"$TOPIARY" evaluate "$dense" --set "conv9=exact" 2> "$tmp/eval_nomatch.err"; rc=$?
check "evaluate with a pattern matching no convolution fails naming it" \
  bash -c '[[ $1 -eq 3 ]] && grep -q "conv9.* matches no convolution" "$0"' "$tmp/eval_nomatch.err" "$rc"
"$TOPIARY" sensitivity "$dense" "$l40" "$tmp/held_out.bin" --budget 2 --json > "$tmp/sens.json"; rc=$?
check "sensitivity --json: both layers under both multipliers, a greedy assignment within budget" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert [l[\"layer\"] for l in r[\"layers\"]] == [\"conv1\", \"conv2\"], r
assert all(len(l[\"top1\"]) == 2 and l[\"macs\"] > 0 for l in r[\"layers\"]), r
g = r[\"greedy\"]
assert r[\"float_top1\"] - g[\"top1\"] <= 2 and g[\"unknown_power\"] == [\"held_out\"], g
assert (g[\"relative_power\"] < 1) == (len(g[\"assignment\"]) > 0), g
" "$0"' "$tmp/sens.json" "$rc"
# Approximation-aware fine-tuning from the dense checkpoint, with sampled weight gradients on
# every other step, and inspect's view of it.
cat > "$tmp/approx.textproto" <<EOF
seed: 1
model { arch: "lenet5" }
data { batch_size: 64 train_limit: 5000 test_limit: 1000 }
init_from_checkpoint: "$dense"
train { epochs: 1 optimizer { lr: 0.01 } }
device { kind: CPU }
approximation { rules { layer: "conv2" multiplier: "$PWD/$l40" } range: MOVING_AVERAGE }
gradient_sampling { layers: "conv*" top_k: 2 every_n_steps: 2 }
EOF
"$TOPIARY" run "$tmp/approx.textproto" --json --out "$tmp/approx" > "$tmp/approx.jsonl" 2>&1; rc=$?
check "an approximate fine-tuning run succeeds" \
  bash -c '[[ $1 -eq 0 ]] && tail -n 1 "$0" | grep -q "\"state\":\"SUCCEEDED\""' "$tmp/approx.jsonl" "$rc"
approx_ckpt="$tmp/approx/checkpoints/finetune.h5"  # a fine-tune from init_from_checkpoint
"$TOPIARY" inspect "$approx_ckpt" > "$tmp/approx_inspect.txt"; rc=$?
check "inspect lists the approximate layer with its multiplier, hash and observed range" \
  bash -c '[[ $1 -eq 0 ]] && grep -Eq "^  conv2 .*mul8u_L40.bin +[0-9a-f]{16}  moving_average \[" "$0"' "$tmp/approx_inspect.txt" "$rc"
check "inspect lists the sampled layers and the steps that sampled (78 steps, every other)" \
  bash -c 'grep -q "^sampled weight gradients (top_k 2, unbiased scale): conv1, conv2$" "$0" &&
           grep -q "^  every 2 steps: 39 steps sampled, 39 exact$" "$0"' "$tmp/approx_inspect.txt"
check "the summary event reports the sampled layers and step counts" \
  bash -c 'tail -n 1 "$0" | grep -q "\"gradient_sampling\":{\"layers\":\[\"conv1\",\"conv2\"\],\"top_k\":2,\"scale\":\"UNBIASED\",\"policy\":\"every 2 steps\",\"sampled_steps\":\"39\",\"exact_steps\":\"39\"}"' "$tmp/approx.jsonl"
"$TOPIARY" inspect --file "$approx_ckpt" --json > "$tmp/approx_inspect.json"; rc=$?
check "inspect --json: conv2's approximation (multiplier, its SHA-256, range, activation_range), not conv1's" \
  python3 -c '
import json, sys
r = {l["layer"]: l for l in json.load(open(sys.argv[1]))["layers"]}
c = r["conv2"]["approximation"]
assert c["multiplier"].endswith("mul8u_L40.bin") and len(c["multiplier_sha256"]) == 64, c
assert c["range"] == "MOVING_AVERAGE" and c["activation_range"][2] == 1, c
assert c["weight_code"] == "ASYMMETRIC" and c["per_channel_weights"] is False, c
assert "approximation" not in r["conv1"], r["conv1"]
' "$tmp/approx_inspect.json"
"$TOPIARY" sensitivity "$dense" "$l40" > "$tmp/sens.txt"; rc=$?
check "sensitivity prints the layer table and the assignment" \
  bash -c '[[ $1 -eq 0 ]] && grep -q "^conv2 " "$0" && grep -q "^greedy assignment within 1.00 points" "$0"' "$tmp/sens.txt" "$rc"
"$TOPIARY" sensitivity "$dense" drum:4 --budget 0 > /dev/null 2> "$tmp/sens_asym.err"; rc=$?
check "sensitivity: one code-use warning line for drum:4's asymmetric codes, with the layer count" \
  bash -c '[[ $1 -eq 0 ]] && [[ $(grep -c "^warning: drum:4 errs by .* at the codes [12] of 2 layers use" "$0") -eq 1 ]]' "$tmp/sens_asym.err" "$rc"
"$TOPIARY" sensitivity "$dense" drum:4 --weight_code sign_magnitude --json > "$tmp/sens_sm.json"; rc=$?
check "sensitivity --weight_code sign_magnitude: the mode is used, each entry has its code use" \
  bash -c '[[ $1 -eq 0 ]] && python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r[\"weight_code\"] == \"sign_magnitude\" and r[\"weight_scales\"] == \"per_tensor\", r
assert all(len(l[\"code_use\"]) == 1 and l[\"code_use\"][0][\"layer\"] == l[\"layer\"] for l in r[\"layers\"]), r
" "$0"' "$tmp/sens_sm.json" "$rc"

# Block pruning on the CPU: rounds to 50% of 4x4 blocks, a round table, inspectable checkpoints.
PRUNE_SPEC="$3"
"$TOPIARY" run "$PRUNE_SPEC" --out "$tmp/prune" > "$tmp/prune.out" 2> "$tmp/prune.err"; rc=$?
check "pruning run exits 0" test "$rc" -eq 0
check "round table printed" grep -q "^round  sparsity" "$tmp/prune.err"
final=$(ls "$tmp"/prune/checkpoints/round-*.h5 | tail -n 1)
check "round checkpoints written" test -s "$final"
report=$("$TOPIARY" inspect --file "$final" --json); rc=$?
check "inspect --json exits 0" test "$rc" -eq 0
check "every eligible conv has 50% zero blocks" python3 -c '
import json, sys
r = json.loads(sys.argv[1])
blocks = [l for l in r["layers"] if l["mask"] == "MASK_BLOCK"]
assert len(blocks) == 20, len(blocks)
for l in blocks:
    assert 2 * int(l["blocks_kept"]) == l["block_rows"] * l["block_cols"], l["layer"]
    assert l["mask_consistent"], l["layer"]
    assert all(k > 0 for k in l["row_occupancy"]), l["layer"]
stem = [l for l in r["layers"] if l["layer"] == "stem.conv"][0]
assert stem.get("mask", "MASK_NONE") == "MASK_NONE" and stem["sparsity"] == 0
' "$report"
heat=$("$TOPIARY" inspect --file "$final" --layer 'stage3.block0.conv1')
check "inspect --layer draws the block grid" bash -c '[[ "$0" == *"rows = input blocks"* && "$0" == *"#"* ]]' "$heat"
"$TOPIARY" inspect --file "$tmp/prune/spec.textproto" > /dev/null 2> "$tmp/inspect.err"; rc=$?
check "inspect of a non-checkpoint fails naming the file (exit 3)" bash -c '[[ $1 -eq 3 ]] && grep -q "spec.textproto: not an HDF5 file" "$0"' "$tmp/inspect.err" "$rc"
"$TOPIARY" run "$PRUNE_SPEC" --resume "$tmp/prune/checkpoints/round-001.h5" --json --out "$tmp/resumed" > "$tmp/resumed.jsonl" 2>/dev/null; rc=$?
check "--resume finishes the run" bash -c '[[ $1 -eq 0 ]] && tail -n 1 "$0" | grep -q "\"state\":\"SUCCEEDED\""' "$tmp/resumed.jsonl" "$rc"

# Per-command help and strict flags.
check "COMMAND --help shows that command's usage and flags, and only those" \
  bash -c 'h=$("$0" export --help) && [[ "$h" == *"topiary export CKPT --onnx FILE"* && "$h" == *"--batch_norm"* && "$h" != *"topiary run SPEC"* && "$h" != *"--target"* ]] &&
           h=$("$0" resume --help) && [[ "$h" == *"pause ID | resume ID | cancel ID"* && "$h" == *"--server"* ]]' "$TOPIARY"
"$TOPIARY" export x.h5 --target 0.3 > /dev/null 2> "$tmp/strict.err"; rc=$?
check "a flag the command does not take is refused (exit 2), naming it and what the command takes" \
  bash -c '[[ $1 -eq 2 ]] && grep -q "export does not take --target (it takes --onnx, --batch, --batch_norm, --remote, --json" "$0"' "$tmp/strict.err" "$rc"
"$TOPIARY" frobnicate --help > /dev/null 2> "$tmp/unknown.err"; rc=$?
check "an unknown command's --help is refused (exit 2)" \
  bash -c '[[ $1 -eq 2 ]] && grep -q "unknown command .frobnicate." "$0"' "$tmp/unknown.err" "$rc"

# Channel pruning: the compacted checkpoint measured against its dense parent.
"$TOPIARY" run "$5" --json --out "$tmp/channel" > "$tmp/channel.jsonl" 2>/dev/null; rc=$?
"$TOPIARY" evaluate "$tmp/channel/checkpoints/round-002.h5" --bench --batch 32 --device cpu \
  --baseline "$tmp/channel/checkpoints/dense.h5" --json > "$tmp/channel_bench.jsonl"; rc2=$?
check "evaluate --bench --baseline: both checkpoints, then the compacted one's shares and speed-ups" \
  bash -c '[[ $1 -eq 0 && $2 -eq 0 ]] && python3 -c "
import json, sys
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
rows = [json.loads(l) for l in open(sys.argv[2])]
ck = [r for r in rows if r.get(\"role\") == \"checkpoint\"]
base = [r for r in rows if r.get(\"role\") == \"baseline\"]
cmp = [r for r in rows if \"compare\" in r]
assert len(ck) == len(base) == len(cmp) == 2, rows
last = summary[\"rounds\"][-1]; dense = summary[\"rounds\"][0]
assert ck[0][\"multiply_adds\"] == int(last[\"multiply_adds\"]) < base[0][\"multiply_adds\"] == int(dense[\"multiply_adds\"]), (ck[0], last, dense)
assert abs(ck[0][\"top1\"] - summary[\"test_top1\"]) <= 0.002 and abs(base[0][\"top1\"] - summary[\"dense_top1\"]) <= 0.002, (ck, base, summary)
c = cmp[0]
assert abs(c[\"multiply_adds_share\"] - ck[0][\"multiply_adds\"] / base[0][\"multiply_adds\"]) < 1e-5, c
assert abs(c[\"throughput_speedup\"] - ck[0][\"images_per_s\"] / base[0][\"images_per_s\"]) < 1e-3 * c[\"throughput_speedup\"], c
assert c[\"parameters_share\"] < 1 and c[\"latency_speedup\"] > 0, c
" "$0" "$3"' "$tmp/channel.jsonl" "$rc" "$rc2" "$tmp/channel_bench.jsonl"
check "evaluate: a bad --device and --baseline without --bench are refused by flag" \
  bash -c '"$0" evaluate "$1" --device tpu 2>&1 | grep -q "device: .cpu. or .cuda., not .tpu." &&
           "$0" evaluate "$1" --baseline "$1" 2>&1 | grep -q "baseline is for evaluate --bench"' \
  "$TOPIARY" "$tmp/channel/checkpoints/dense.h5"
exit $fail
