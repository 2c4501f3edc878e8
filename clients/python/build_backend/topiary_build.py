"""The package's own PEP 517 build backend: standard library only, so that
`pip install ./clients/python` needs nothing from the Python package index (the machines
Topiary runs on cannot reach it) and no build isolation tricks.

A wheel holds the pure-Python sources of `topiary/` plus the gRPC and protobuf stubs generated
at build time from the repository's protos/ (or the copy an sdist carries) with `protoc` and
`grpc_python_plugin` (Debian: protobuf-compiler, protobuf-compiler-grpc). The metadata comes
from pyproject.toml's [project] table; the version from protos/version.h, the daemon's own.
"""
import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # clients/python
TAG = "py3-none-any"


def _protos_dir():
    for candidate in (os.environ.get("TOPIARY_PROTOS"), os.path.join(HERE, "protos"),
                      os.path.join(HERE, "..", "..", "protos")):
        if candidate and os.path.isfile(os.path.join(candidate, "topiary", "v1", "service.proto")):
            return os.path.abspath(candidate)
    raise RuntimeError("topiary: protos/topiary/v1/*.proto not found (build from the repository "
                       "or an sdist, or set TOPIARY_PROTOS)")


def _version():
    text = open(os.path.join(_protos_dir(), "version.h")).read()
    m = re.search(r'kTopiaryVersion\[\] = "([^"]+)"', text)
    if not m:
        raise RuntimeError("topiary: no kTopiaryVersion in protos/version.h")
    return m.group(1)


def _project():
    path = os.path.join(HERE, "pyproject.toml")
    if tomllib is None:
        raise RuntimeError("topiary: building needs Python 3.11+ (tomllib)")
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {_version()}",
             f"Summary: {p['description']}", f"Requires-Python: {p['requires-python']}"]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    readme = open(os.path.join(HERE, p["readme"])).read()
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def _generate_stubs(out_dir):
    """protoc writes topiary/v1/*_pb2.py and service_pb2_grpc.py under out_dir."""
    protos = _protos_dir()
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if not protoc or not plugin:
        raise RuntimeError("topiary: building needs protoc and grpc_python_plugin "
                           "(Debian: apt install protobuf-compiler protobuf-compiler-grpc)")
    files = sorted(os.path.join("topiary", "v1", f)
                   for f in os.listdir(os.path.join(protos, "topiary", "v1"))
                   if f.endswith(".proto"))
    subprocess.run([protoc, f"--proto_path={protos}", f"--python_out={out_dir}"] + files,
                   check=True, cwd=protos)
    subprocess.run([protoc, f"--proto_path={protos}", f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", "topiary/v1/service.proto"],
                   check=True, cwd=protos)
    with open(os.path.join(out_dir, "topiary", "v1", "__init__.py"), "w") as f:
        f.write('"""Generated from protos/topiary/v1 at build time; do not edit."""\n')


def _package_files():
    """(archive name, path) of every file the wheel carries."""
    with tempfile.TemporaryDirectory() as gen:
        _generate_stubs(gen)
        out = []
        for root in (HERE, gen):
            base = os.path.join(root, "topiary")
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith((".py", ".typed")):
                        path = os.path.join(dirpath, name)
                        out.append((os.path.relpath(path, root).replace(os.sep, "/"),
                                    open(path, "rb").read()))
        return out


def _dist_info_name():
    return f"topiary-{_version()}.dist-info"


def _write_dist_info(directory):
    info = os.path.join(directory, _dist_info_name())
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata())
    with open(os.path.join(info, "WHEEL"), "w") as f:
        f.write(f"Wheel-Version: 1.0\nGenerator: topiary_build\nRoot-Is-Purelib: true\nTag: {TAG}\n")
    return os.path.basename(info)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


# PEP 517 hooks.
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"topiary-{_version()}-{TAG}.whl"
    files = _package_files()
    with tempfile.TemporaryDirectory() as tmp:
        info = _write_dist_info(tmp)
        for f in ("METADATA", "WHEEL"):
            files.append((f"{info}/{f}", open(os.path.join(tmp, info, f), "rb").read()))
    record = [_record_line(n, d) for n, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d,
                       zipfile.ZIP_DEFLATED)
    return name


def build_sdist(sdist_directory, config_settings=None):
    """A self-contained source tree: the package, this backend and a copy of protos/."""
    base = f"topiary-{_version()}"
    name = base + ".tar.gz"
    protos = _protos_dir()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for entry in ("pyproject.toml", "README.md", "build_backend", "topiary", "tests"):
            tar.add(os.path.join(HERE, entry), f"{base}/{entry}",
                    filter=lambda t: None if "__pycache__" in t.name else t)
        tar.add(os.path.join(protos, "version.h"), f"{base}/protos/version.h")
        tar.add(os.path.join(protos, "topiary"), f"{base}/protos/topiary")
        info = io.BytesIO(_metadata().encode())
        t = tarfile.TarInfo(f"{base}/PKG-INFO")
        t.size = len(info.getvalue())
        tar.addfile(t, info)
    return name
