"""kernel_family: the targets of one folder of kernels/ (one family of operations).

Each family has the same shape: `:cpu` (the shape contracts and CPU twins), `:cuda` (the CUDA
twins: nvcc for .cu files, the host compiler for cuDNN and cuBLAS calls; in a CPU-only build
the family's cuda_unavailable.cc instead), a cc_test per CPU test, and `:cuda_tests` (its GPU
tests, linked into the one binary //kernels:cuda_test). Adding an operation touches one folder.
"""

load("//bazel:cuda.bzl", "CUTLASS_FLAGS", "CUTLASS_HDRS", "GENCODE_SM90A", "cuda_library")
load("@local_config_cuda//:defs.bzl", "if_cuda")

def kernel_family(
        hdrs,
        cpu_srcs = [],
        deps = [],
        cu_srcs = [],
        cu_sm90a_srcs = [],
        cu_hdrs = [],
        cuda_srcs = [],
        cuda_deps = [],
        tests = {},
        cuda_tests = []):
    """The targets of one kernel family.

    Args:
      hdrs: the family's headers (each operation's shape contract, shared impl headers).
      cpu_srcs: the CPU twins.
      deps: the :cpu targets of the families these headers and sources use.
      cu_srcs: .cu files, compiled by nvcc.
      cu_sm90a_srcs: .cu files for Hopper only (wgmma, TMA), built on CUTLASS's collectives.
      cu_hdrs: headers of other families the .cu files include (their :headers).
      cuda_srcs: host-compiled CUDA sources (cuDNN, cuBLAS, nvJPEG calls).
      cuda_deps: the :cuda targets of the families the CUDA sources call.
      tests: CPU test name -> extra deps (each test is <name>.cc).
      cuda_tests: the family's GPU test sources.
    """
    native.filegroup(name = "headers", srcs = hdrs)
    native.cc_library(
        name = "cpu",
        srcs = cpu_srcs,
        hdrs = hdrs,
        copts = ["-fopenmp"],
        deps = deps + ["//kernels/runtime:cpu", "//third_party:absl"],
    )
    if cu_srcs:
        cuda_library(
            name = "cuda_kernels",
            srcs = if_cuda(cu_srcs),
            extra_hdrs = [
                ":headers",
                "//kernels/runtime:headers",
                "//util:status_macros.h",
            ] + cu_hdrs,
            deps = [":cpu"],
        )
    if cu_sm90a_srcs:
        cuda_library(
            name = "cuda_sm90a_kernels",
            srcs = if_cuda(cu_sm90a_srcs),
            extra_hdrs = [
                ":headers",
                "//kernels/runtime:headers",
                "//util:status_macros.h",
            ] + cu_hdrs + CUTLASS_HDRS,
            gencode = GENCODE_SM90A,
            nvcc_flags = CUTLASS_FLAGS,
            deps = [":cpu"],
        )
    native.cc_library(
        name = "cuda",
        srcs = if_cuda(cuda_srcs, ["cuda_unavailable.cc"]),
        # The nvcc objects call the Status helpers of runtime/cuda_context.cc but may be
        # linked after it: keep every object so the archive order cannot drop them.
        alwayslink = True,
        deps = [
            ":cpu",
            "//kernels/runtime:cuda",
            "//third_party:absl",
        ] + cuda_deps + if_cuda(([":cuda_kernels"] if cu_srcs else []) +
                                ([":cuda_sm90a_kernels"] if cu_sm90a_srcs else []) + [
            "//util:status_macros",
            "@local_config_cuda//:cublas",
            "@local_config_cuda//:cudart",
            "@local_config_cuda//:cudnn",
        ]),
    )
    for name, extra in tests.items():
        native.cc_test(
            name = name,
            srcs = [name + ".cc"],
            deps = [
                ":cpu",
                "//kernels:test_util",
                "//third_party:absl",
                "//third_party:gtest_main",
            ] + extra,
        )
    if cuda_tests:
        native.cc_library(
            name = "cuda_tests",
            testonly = True,
            srcs = if_cuda(cuda_tests),
            # Tests register themselves from static initializers.
            alwayslink = True,
            deps = [
                ":cuda",
                "//kernels:cuda_test_util",
                "//third_party:absl",
                "//third_party:gtest_main",
            ],
        )
