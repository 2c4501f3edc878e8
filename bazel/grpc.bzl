"""Protobuf / gRPC C++ code generation with the system protoc and grpc_cpp_plugin."""

PROTOC = "/usr/bin/protoc"
GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def cc_proto(name, srcs, deps = [], grpc = False, imports = [], **kwargs):
    """srcs: .proto files relative to this package, which is the proto root: imports read
    "topiary/v1/x.proto" and C++ includes "topiary/v1/x.pb.h". Generates *.pb.{h,cc}
    (and *.grpc.pb.{h,cc} with grpc = True) wrapped in a cc_library. imports: the .proto
    files of this package that srcs import (inputs of protoc, compiled by their own rule)."""
    root = native.package_name()
    hdrs, ccs = [], []
    for s in srcs:
        base = s[:-len(".proto")]
        hdrs.append(base + ".pb.h")
        ccs.append(base + ".pb.cc")
        if grpc:
            hdrs.append(base + ".grpc.pb.h")
            ccs.append(base + ".grpc.pb.cc")
    out = "$(GENDIR)/" + root
    cmd = PROTOC + " --proto_path=" + root + " --cpp_out=" + out
    if grpc:
        cmd += " --grpc_out=" + out + " --plugin=protoc-gen-grpc=" + GRPC_CPP_PLUGIN
    cmd += " " + " ".join([root + "/" + s for s in srcs])
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + imports,
        outs = hdrs + ccs,
        cmd = cmd,
        message = "protoc %s" % name,
    )
    native.cc_library(
        name = name,
        srcs = ccs,
        hdrs = hdrs,
        includes = ["."],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        **kwargs
    )
