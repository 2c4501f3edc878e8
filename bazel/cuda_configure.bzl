"""cuda_configure: finds a CUDA toolkit when the build is configured.

Writes @local_config_cuda with
  defs.bzl   HAVE_CUDA, if_cuda(a, b), CUDA_PATH
  BUILD      cc_library targets cudart (static), cublas, cudnn (empty without CUDA)
Environment: TOPIARY_CUDA=1 forces CUDA (fails without a toolkit), TOPIARY_CUDA=0 forces a
CPU-only build; otherwise CUDA is used when $CUDA_PATH (default /usr/local/cuda) has nvcc.
"""

def _impl(rctx):
    force = rctx.os.environ.get("TOPIARY_CUDA", "").strip()
    path = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = rctx.path(path + "/bin/nvcc")
    found = nvcc.exists and rctx.path(path + "/include/cuda_runtime.h").exists
    if force == "1" and not found:
        fail("TOPIARY_CUDA=1 but no CUDA toolkit at %s (set CUDA_PATH)" % path)
    have = found and force != "0"

    rctx.file("defs.bzl", """HAVE_CUDA = {have}
CUDA_PATH = "{path}"

def if_cuda(with_cuda, without_cuda = []):
    return with_cuda if HAVE_CUDA else without_cuda
""".format(have = have, path = path))

    if not have:
        rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])
# CUDA not configured: these targets are empty so BUILD files need no conditions to name them.
cc_library(name = "cuda_headers")
cc_library(name = "cudart")
cc_library(name = "cublas")
cc_library(name = "cudnn")
""")
        return

    rctx.symlink(path + "/include", "include")
    rctx.symlink(path + "/lib/libcudart_static.a", "libcudart_static.a")
    lib = path + "/lib"
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)
# Static runtime: a binary needs only the driver (plus cuDNN/cuBLAS shared libraries).
cc_library(
    name = "cudart",
    srcs = ["libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-lcublas", "-lcublasLt", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
cc_library(
    name = "cudnn",
    linkopts = ["-L{lib}", "-lcudnn", "-Wl,-rpath,{lib}"],
    deps = [":cuda_headers"],
)
""".format(lib = lib))

cuda_configure = repository_rule(
    implementation = _impl,
    local = True,
    environ = ["TOPIARY_CUDA", "CUDA_PATH"],
)
