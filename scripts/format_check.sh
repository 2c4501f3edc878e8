#!/usr/bin/env bash
# The C++ and CUDA sources as clang-format (14, .clang-format) leaves them: lists any file it
# would change and fails. Prints one "N passed, N failed" line (one check) for .ci/run.
#   scripts/format_check.sh        check
#   scripts/format_check.sh --fix  reformat the files in place
set -uo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format) ||
  { echo "format: clang-format is needed (apt-get install clang-format-14)"; echo "0 passed, 1 failed"; exit 1; }
bad=()
while IFS= read -r f; do
  if [ "${1:-}" == "--fix" ]; then
    "$fmt" -i "$f"
  elif ! "$fmt" --dry-run --Werror "$f" > /dev/null 2>&1; then
    bad+=("$f")
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format: clang-format would change %s\n' "${bad[@]}"
  echo "format: run scripts/format_check.sh --fix"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "format: every C++ and CUDA source is clang-formatted"
echo "1 passed, 0 failed"
