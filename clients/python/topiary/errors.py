"""Errors from topiaryd as Python exceptions.

Every failed call raises a subclass of TopiaryError chosen by the gRPC status code, carrying
the code, the server's message and the field it names. topiaryd starts a message about a bad
request with the field's path ("data.batch_size: must be > 0"); `field` is that path, or None.
"""
from __future__ import annotations

import re
from typing import Optional

import grpc

# "pruning.target: ...", "device.gpus[1]: ...", "set: ..." (not a file path or a sentence).
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*): ")


def field_of(message: str) -> Optional[str]:
    """The field a server message names at its start, or None."""
    m = _FIELD.match(message)
    return m.group(1) if m else None


class TopiaryError(Exception):
    """A call to topiaryd failed. `code` is the grpc.StatusCode, `message` the server's text,
    `field` the request field it names (or None)."""

    def __init__(self, code: grpc.StatusCode, message: str, field: Optional[str] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.field = field if field is not None else field_of(message)


class InvalidArgument(TopiaryError):
    """A bad spec or request (INVALID_ARGUMENT); `field` names what is wrong."""


class NotFound(TopiaryError):
    """No such experiment or checkpoint (NOT_FOUND)."""


class FailedPrecondition(TopiaryError):
    """The experiment's state does not allow it (FAILED_PRECONDITION), e.g. resuming a
    running one or advancing a round nobody waits for."""


class Unauthenticated(TopiaryError):
    """No token, or the wrong one (UNAUTHENTICATED)."""


class PermissionDenied(TopiaryError):
    """A path outside the daemon's data directory (PERMISSION_DENIED)."""


class ResourceExhausted(TopiaryError):
    """The queue is full or the request too large (RESOURCE_EXHAUSTED)."""


class Unavailable(TopiaryError):
    """No daemon answering at the address (UNAVAILABLE, DEADLINE_EXCEEDED)."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.DATA_LOSS: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}


def from_code(code: grpc.StatusCode, message: str) -> TopiaryError:
    """The TopiaryError subclass for `code`, with `message`."""
    return _BY_CODE.get(code, TopiaryError)(code, message)


def from_rpc_error(error: grpc.RpcError) -> TopiaryError:
    """The TopiaryError subclass for a failed gRPC call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    return from_code(code, details)
