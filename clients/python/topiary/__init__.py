"""Topiary from Python: a client of topiaryd, checkpoints as numpy arrays, PyTorch twins.

    import topiary
    client = topiary.Client()                         # $TOPIARY_SERVER, $TOPIARY_TOKEN_FILE
    ckpt = topiary.load_checkpoint("round-003.h5")    # weights, masks, statistics, metrics
    model = topiary.to_torch_model(ckpt)              # needs torch (imported only there)

The generated protobuf and gRPC modules are topiary.v1.*_pb2 and service_pb2_grpc.
"""
from topiary.checkpoint import (Checkpoint, CheckpointError, InputFormat, LayerParams,
                                load_checkpoint)
from topiary.client import TERMINAL, Client, parse_spec
from topiary.errors import (FailedPrecondition, InvalidArgument, NotFound, PermissionDenied,
                            ResourceExhausted, TopiaryError, Unauthenticated, Unavailable)

__all__ = [
    "Checkpoint", "CheckpointError", "Client", "FailedPrecondition", "InputFormat",
    "InvalidArgument", "LayerParams", "NotFound", "PermissionDenied", "ResourceExhausted",
    "TERMINAL", "TopiaryError", "Unauthenticated", "Unavailable", "load_checkpoint",
    "parse_spec", "to_torch_model", "to_torch_state_dict",
]


def to_torch_state_dict(ckpt, arch=None):
    """See topiary.torch_models.to_torch_state_dict (imports torch)."""
    from topiary.torch_models import to_torch_state_dict as f
    return f(ckpt, arch)


def to_torch_model(ckpt, device="cpu"):
    """See topiary.torch_models.to_torch_model (imports torch)."""
    from topiary.torch_models import to_torch_model as f
    return f(ckpt, device)
