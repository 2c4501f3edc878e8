"""C++ headers shipped in wheels of the Python package index, used offline.

NVIDIA publishes CUTLASS's headers (`nvidia-cutlass`) and cuDNN's frontend
(`nvidia-cudnn-frontend`) as wheels. scripts/install_deps.sh downloads the pinned wheels of
scripts/build_wheels.txt (hash-checked by pip) into the wheelhouse; this rule finds the wheel
there, checks its SHA-256 again, unpacks the include folder and exposes it as
`@<name>//:headers`. Nothing is fetched from the network: a missing wheel is an error that
says how to get it, raised only when a target uses the headers.
"""

def _wheelhouse(rctx):
    env = rctx.os.environ
    if env.get("TOPIARY_WHEELS"):
        return env["TOPIARY_WHEELS"]
    cache = env.get("XDG_CACHE_HOME") or (env.get("HOME", "") + "/.cache")
    return cache + "/topiary/wheels"

def _missing(rctx, why):
    rctx.file("BUILD", """
genrule(
    name = "missing",
    outs = ["missing.h"],
    cmd = "echo '{why}' >&2; exit 1",
)
cc_library(
    name = "headers",
    hdrs = [":missing"],
    visibility = ["//visibility:public"],
)
""".format(why = why.replace("'", "")))

def _wheel_headers_impl(rctx):
    wheel = "%s/%s" % (_wheelhouse(rctx), rctx.attr.wheel)
    if not rctx.path(wheel).exists:
        _missing(rctx, "%s: not found; run scripts/install_deps.sh (it downloads the wheels of scripts/build_wheels.txt)" % wheel)
        return
    sha = rctx.execute(["sha256sum", wheel])
    if sha.return_code != 0 or sha.stdout.split(" ")[0] != rctx.attr.sha256:
        _missing(rctx, "%s: SHA-256 %s, expected %s" % (wheel, sha.stdout.split(" ")[0], rctx.attr.sha256))
        return
    rctx.symlink(wheel, "wheel.zip")  # extract() knows archives by their extension
    rctx.extract("wheel.zip", output = "unpacked")
    rctx.symlink("unpacked/" + rctx.attr.include_dir, "include")
    dirs = ["include"]
    if rctx.attr.extra_include_dir:
        rctx.symlink("unpacked/" + rctx.attr.extra_include_dir, "extra_include")
        dirs.append("extra_include")
    files = []
    for d in dirs:
        files += ['"%s/**/*.h"' % d, '"%s/**/*.hpp"' % d, '"%s/**/*.inl"' % d]
    rctx.file("BUILD", """
cc_library(
    name = "headers",
    hdrs = glob([{files}]),
    includes = [{dirs}],
    visibility = ["//visibility:public"],
)

# The same files for nvcc genrules (bazel/cuda.bzl), which take files, not libraries.
filegroup(
    name = "header_files",
    srcs = glob([{files}]),
    visibility = ["//visibility:public"],
)
""".format(files = ", ".join(files), dirs = ", ".join(['"%s"' % d for d in dirs])))

wheel_headers = repository_rule(
    implementation = _wheel_headers_impl,
    attrs = {
        "wheel": attr.string(mandatory = True, doc = "the wheel's file name in the wheelhouse"),
        "sha256": attr.string(mandatory = True),
        "include_dir": attr.string(mandatory = True, doc = "the include folder inside the wheel"),
        "extra_include_dir": attr.string(doc = "a second include folder (e.g. CUTLASS's utilities)"),
    },
    environ = ["TOPIARY_WHEELS", "XDG_CACHE_HOME", "HOME"],
    local = True,
)
