#!/usr/bin/env bash
# //clients/python:python_test: `pip install ./clients/python` into a fresh virtual environment
# (Debian's site packages visible, --no-index: nothing may come from the package index), then
# the package's pytest suite against the built topiaryd and topiary.
# Args: TOPIARYD TOPIARY EXAMPLES/tiny.textproto MAKE_HOSTILE_FILES
set -euo pipefail
export TOPIARYD="$PWD/$1" TOPIARY="$PWD/$2" TOPIARY_EXAMPLES="$PWD/$(dirname "$3")"
export MAKE_HOSTILE="$PWD/$4"
export PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR="$TEST_TMPDIR/mpl"
src="$PWD/clients/python"
venv="$TEST_TMPDIR/venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --no-index --no-cache-dir --disable-pip-version-check --quiet "$src"
# From a folder outside the sources, so that `import topiary` finds the installed package.
cd "$TEST_TMPDIR"
"$venv/bin/python" -c 'import topiary, sys; assert "site-packages" in topiary.__file__, topiary.__file__; print("testing", topiary.__file__)'
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$src/tests"
