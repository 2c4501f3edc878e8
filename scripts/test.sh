#!/usr/bin/env bash
# The README's second command: build and run every test for real (no cached results), then
# print one line "N passed, N failed". Exits non-zero when anything failed.
# Extra arguments go to bazel test (e.g. a target pattern).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # What `//...` means, less the C++ libraries, which the tests and binaries build as they
  # need them: a library built as a target of its own adds a shared object, whose
  # position-independent objects compile each of its sources a second time (a third of a
  # clean build's compiling). Targets tagged manual (the libFuzzer harnesses) stay out.
  mapfile -t targets < <(bazel query \
    '//... except kind(cc_library, //...) except attr(tags, "\bmanual\b", //...)' 2>/dev/null)
  [ ${#targets[@]} -gt 0 ] || { echo "test.sh: bazel query found no targets"; exit 1; }
fi
# The wheelhouse install_deps.sh fills (h5py, onnxruntime) for //clients/python:python_test.
export TOPIARY_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/topiary/wheels"
log=$(mktemp)
bazel test -c opt --nocache_test_results --test_output=errors \
  --test_env=TOPIARY_WHEELS "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log")
# A test whose every case was skipped (GPU tests on a machine without one: gtest's
# result="skipped" in test.xml) counts as skipped, not passed, and says why.
testlogs=$(bazel info -c opt bazel-testlogs 2>/dev/null)
passed=0; skipped=0
for target in $(grep -oE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" | awk '{print $1}'); do
  xml="$testlogs/$(echo "${target#//}" | tr ':' '/')/test.xml"
  if [ -f "$xml" ] && python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
results = [c.get("result", "completed") for c in cases]
sys.exit(0 if results and all(r == "skipped" for r in results) else 1)
PY
  then
    skipped=$((skipped + 1))
    echo "skipped: $target (every case skipped: $(grep -m1 -oE 'no usable GPU[^<"]*' "${xml%test.xml}test.log" || echo "see its log"))"
  else
    passed=$((passed + 1))
  fi
done
rm -f "$log"
# A build failure before any test ran still counts as a failure.
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
