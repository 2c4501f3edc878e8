"""Topiary from Python: a client of topiaryd, checkpoints as numpy arrays, PyTorch twins.

    import topiary
    client = topiary.Client()                         # $TOPIARY_SERVER, $TOPIARY_TOKEN_FILE
    ckpt = topiary.load_checkpoint("round-003.h5")    # weights, masks, statistics, metrics
    model = topiary.to_torch_model(ckpt)              # needs torch (imported only there)
    topiary.from_torch(net, example, "net.h5")        # a PyTorch CNN as a checkpoint

The generated protobuf and gRPC modules are topiary.v1.*_pb2 and service_pb2_grpc.
"""
from topiary.checkpoint import (Checkpoint, CheckpointError, InputFormat, LayerParams,
                                load_checkpoint)
from topiary.client import TERMINAL, Client, parse_spec
from topiary.importing import from_torch, import_onnx
from topiary.errors import (FailedPrecondition, InvalidArgument, NotFound, PermissionDenied,
                            ResourceExhausted, TopiaryError, Unauthenticated, Unavailable)
# Experiment states, as the protos define them (an experiment's .state, a summary's .state
# and a state event's .state are these values): compare with them, print with state_name.
from topiary.v1.events_pb2 import (CANCELLED, FAILED, PAUSED, QUEUED, RUNNING, SUCCEEDED,
                                   WAITING_FOR_ROUND, ExperimentState)


def state_name(state: int) -> str:
    """'SUCCEEDED' for topiary.SUCCEEDED (an Experiment's or a RunSummary's .state)."""
    return ExperimentState.Name(state)


__all__ = [
    "Checkpoint", "CheckpointError", "Client", "FailedPrecondition", "InputFormat",
    "InvalidArgument", "LayerParams", "NotFound", "PermissionDenied", "ResourceExhausted",
    "TERMINAL", "TopiaryError", "from_torch", "import_onnx", "Unauthenticated", "Unavailable", "load_checkpoint",
    "parse_spec", "to_torch", "to_torch_model", "to_torch_state_dict", "ExperimentState", "state_name",
    "QUEUED", "RUNNING", "PAUSED", "WAITING_FOR_ROUND", "SUCCEEDED", "FAILED", "CANCELLED",
]


def to_torch(ckpt, module, name_map=None, masks="zero"):
    """See topiary.torch_models.to_torch (imports torch): a checkpoint's weights into your own
    nn.Module."""
    from topiary.torch_models import to_torch as f
    return f(ckpt, module, name_map, masks)


def to_torch_state_dict(ckpt, arch=None):
    """See topiary.torch_models.to_torch_state_dict (imports torch)."""
    from topiary.torch_models import to_torch_state_dict as f
    return f(ckpt, arch)


def to_torch_model(ckpt, device="cpu"):
    """See topiary.torch_models.to_torch_model (imports torch)."""
    from topiary.torch_models import to_torch_model as f
    return f(ckpt, device)
