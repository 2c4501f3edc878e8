#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang and sanitizers, then runs each for
# SECONDS (default 60) on a copy of its seed corpus, JOBS at a time (default 2). Prints each
# harness's executions and coverage and a final "N passed, N failed" line; a crash, leak or
# timeout fails its harness and leaves the input in runs/fuzz/<harness>/.
#   scripts/fuzz.sh [SECONDS] [HARNESS...]
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"; shift || true
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(spec_fuzz idx_fuzz cifar_fuzz digits_fuzz checkpoint_fuzz multiplier_fuzz plan_cache_fuzz onnx_fuzz image_fuzz graph_fuzz)
jobs="${FUZZ_JOBS:-2}"
command -v clang > /dev/null || { echo "fuzz: clang is needed (apt-get install clang)"; exit 1; }
base="${FUZZ_OUTPUT_BASE:-$HOME/.cache/topiary-fuzz}"
targets=(); for h in "${harnesses[@]}"; do targets+=("//tests/fuzz:$h"); done
bazel --output_base="$base" build -c opt --config=fuzz --symlink_prefix=/ "${targets[@]}" || exit 1
bin=$(bazel --output_base="$base" info -c opt --config=fuzz bazel-bin 2>/dev/null)
out=runs/fuzz; mkdir -p "$out"
run_one() {
  local h="$1" dir="$out/$1"
  local corpus_name="${h%_fuzz}"
  rm -rf "$dir" && mkdir -p "$dir/corpus" && cp tests/fuzz/corpus/"$corpus_name"/* "$dir/corpus/"
  # -rss_limit_mb: a reader that allocates what a file merely declares is a finding.
  ( cd "$dir" && TMPDIR="$PWD" "$bin/tests/fuzz/$h" -max_total_time="$seconds" -timeout=20 \
      -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 corpus > log 2>&1 )
  local rc=$?
  local execs cov
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1 | grep -o '[0-9]*')
  if [ "$rc" -eq 0 ]; then
    echo "PASSED $h: ${execs:-?} executions in ${seconds}s, coverage ${cov:-?} edges"
  else
    echo "FAILED $h (exit $rc): see $dir/log"; grep -m3 -E 'ERROR|SUMMARY|==[0-9]+==' "$dir/log"
  fi
}
export -f run_one; export out seconds bin
printf '%s\n' "${harnesses[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' | tee "$out/summary"
passed=$(grep -c '^PASSED' "$out/summary"); failed=$(grep -c '^FAILED' "$out/summary")
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
