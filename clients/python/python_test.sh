#!/usr/bin/env bash
# //clients/python:python_test: `pip install ./clients/python` into a fresh virtual environment
# of Debian's python3 (its site packages visible: numpy, grpcio, protobuf, torch, onnx,
# pytest), offline: what Debian lacks (h5py under its own name, onnxruntime) comes from the
# wheelhouse that scripts/install_deps.sh fills from the package index ($TOPIARY_WHEELS);
# then the package's pytest suite against the built topiaryd and topiary.
# Args: TOPIARYD TOPIARY EXAMPLES/tiny.textproto MAKE_HOSTILE_FILES ONNX_LOGITS SLURM_LOCAL
set -euo pipefail
export TOPIARYD="$PWD/$1" TOPIARY="$PWD/$2" TOPIARY_EXAMPLES="$PWD/$(dirname "$3")"
export MAKE_HOSTILE="$PWD/$4" TOPIARY_LOGITS="$PWD/$5" TOPIARY_SLURM_LOCAL="$PWD/$6"
export PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR="$TEST_TMPDIR/mpl"
src="$PWD/clients/python"
venv="$TEST_TMPDIR/venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
wheels="${TOPIARY_WHEELS:?set by scripts/test.sh: the wheelhouse of scripts/install_deps.sh}"
pip=("$venv/bin/pip" install --no-index --find-links "$wheels" --no-cache-dir
     --disable-pip-version-check --quiet)
"${pip[@]}" "$src"
# onnxruntime's declared protobuf is newer than Debian's; it runs models without it.
"${pip[@]}" --no-deps onnxruntime flatbuffers
# From a folder outside the sources, so that `import topiary` finds the installed package.
cd "$TEST_TMPDIR"
"$venv/bin/python" -c 'import topiary, sys; assert "site-packages" in topiary.__file__, topiary.__file__; print("testing", topiary.__file__)'
# Which test files: TOPIARY_PYTEST_ONLY names them (space-separated); otherwise every file but
# those in TOPIARY_PYTEST_EXCEPT. The targets of clients/python/BUILD split the suite so that
# each stays well inside its timeout on two busy cores, and slurm_test runs test_slurm.py
# outside the sandbox, where slurmd may set its groups.
files=()
if [ -n "${TOPIARY_PYTEST_ONLY:-}" ]; then
  for f in $TOPIARY_PYTEST_ONLY; do files+=("$src/tests/$f"); done
else
  files=("$src/tests")
  for f in ${TOPIARY_PYTEST_EXCEPT:-}; do files+=(--ignore="$src/tests/$f"); done
fi
exec "$venv/bin/python" -m pytest -q -rs --durations=10 -p no:cacheprovider "${files[@]}"
