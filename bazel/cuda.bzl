"""cuda_library: nvcc per .cu file through a genrule, wrapped in a cc_library.

Bazel 4 has no CUDA rules; this is the smallest thing that works offline. Headers a .cu
includes must be listed in hdrs (or srcs of a dep listed in cu_deps_hdrs).
"""

load("@local_config_cuda//:defs.bzl", "CUDA_PATH")

GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",  # H100 / H200
    "-gencode=arch=compute_90,code=compute_90",  # PTX, JIT-compiled on newer GPUs
]

# Hopper's own instructions (wgmma, setmaxnreg) exist only in the arch-specific target; such
# code runs on H100/H200 and nothing else, so it gets no PTX for newer GPUs.
GENCODE_SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]

# CUTLASS's headers (bazel/wheel_headers.bzl), for .cu files built on its collectives.
CUTLASS_HDRS = ["@cutlass//:header_files"]
CUTLASS_FLAGS = [
    "-Iexternal/cutlass/include",
    "-Iexternal/cutlass/extra_include",
    "--expt-relaxed-constexpr", "-DNDEBUG"]

def cuda_library(
        name,
        srcs,
        hdrs = [],
        extra_hdrs = [],
        deps = [],
        nvcc_flags = [],
        gencode = GENCODE,
        **kwargs):
    objs = []
    for src in srcs:
        obj = "_objs_cu/%s/%s.pic.o" % (name, src[:-len(".cu")])
        native.genrule(
            name = "%s_nvcc_%s" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + extra_hdrs,
            outs = [obj],
            cmd = " ".join([
                CUDA_PATH + "/bin/nvcc",
                "-c",
                "$(location %s)" % src,
                "-o",
                "$@",
                "-ccbin",
                "/usr/bin/gcc",
                "-std=c++17",
                "-O3",
                "-Xcompiler",
                "-fPIC,-Wall",
                "-I.",
                "-I$(GENDIR)",
            ] + gencode + nvcc_flags),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//:cudart"],
        linkstatic = True,
        alwayslink = True,
        **kwargs
    )
