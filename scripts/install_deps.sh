#!/usr/bin/env bash
# Installs the Debian 12 packages Topiary builds and tests with, if any are missing.
# Runs apt-get as root, or through sudo. Idempotent: does nothing when all are present.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap           # Bazel 4.2.3, used fully offline (see docs/building.md)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libhdf5-dev libgtest-dev libopenblas-dev zlib1g-dev
  libdnnl-dev               # oneDNN: CPU convolutions (kernels/conv/conv_onednn.h)
  libturbojpeg0-dev libpng-dev  # IMAGE_FOLDER datasets: JPEG and PNG decoding
  libgfortran-12-dev        # libgfortran.a, for --config=static (OpenBLAS needs it)
  dataset-fashion-mnist     # the default dataset: /usr/share/datasets/fashion-mnist
  python3                   # Debian's interpreter (/usr/bin/python3) runs every Python test
  python3-grpcio            # tests/daemon_test.sh calls grpc.health.v1 and reflection with it
  libonnx-dev               # onnx.proto: `topiary export --onnx` writes through ONNX's schema
  # clients/python (the `topiary` package) and its tests: pip into a venv that sees these
  python3-protobuf python3-h5py python3-numpy python3-venv python3-pip python3-pytest
  python3-onnx python3-torch python3-matplotlib
  openssl                   # tests/daemon_test.sh makes a self-signed certificate for TLS
  nginx-light               # deploy/nginx-topiaryd.conf, the front end (tests/frontend_test.sh)
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and the sanitizers (tests/fuzz)
  clang-format-14           # scripts/format_check.sh (.ci/run)
  libgloo-dev               # Gloo: collectives between CPU ranks of separate processes (topiary worker)
  munge slurmctld slurmd slurm-client  # a one-node Slurm cluster for tests (scripts/slurm_local.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Wheels from the Python package index that Debian does not package (or packages under a
# name pip does not count), pinned by version and hash in scripts/test_wheels.txt:
# onnxruntime (the ONNX export tests run exports in it) and h5py (a declared dependency of the
# `topiary` package; Debian's python3-h5py is named "h5py._debian_h5py_serial", which pip does
# not count as h5py). They go into a wheelhouse, so that the tests install the package
# offline, the way a user installs it.
WHEELS="${TOPIARY_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/topiary/wheels}"
# The build's header wheels (scripts/build_wheels.txt: CUTLASS, cuDNN's frontend, nvJPEG) go there too;
# bazel/wheel_headers.bzl unpacks them. Both lists are for CPython 3.11 on x86-64 Linux.
for REQS in "$(dirname "$0")/test_wheels.txt" "$(dirname "$0")/build_wheels.txt"; do
  have_all=1
  for w in $(grep -oE '^[a-z0-9_-]+==[^ ]+' "$REQS"); do
    name="${w%%==*}"
    ls "$WHEELS/${name//-/_}-${w##*==}-"*.whl >/dev/null 2>&1 || have_all=0
  done
  if [ "$have_all" -eq 0 ]; then
    /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --implementation cp \
        --no-deps --require-hashes -r "$REQS" -d "$WHEELS" >&2 ||
      { echo "cannot download the wheels of $REQS from the Python package index" >&2; exit 1; }
  fi
done
