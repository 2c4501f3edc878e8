#!/usr/bin/env bash
# The README's second command: build and run every test for real (no cached results), then
# print one line "N passed, N failed". Exits non-zero when anything failed.
# Extra arguments go to bazel test (e.g. a target pattern).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(//...)
log=$(mktemp)
bazel test -c opt --nocache_test_results --test_output=errors "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log")
rm -f "$log"
# A build failure before any test ran still counts as a failure.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
