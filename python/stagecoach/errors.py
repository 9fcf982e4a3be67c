"""Errors of the Stagecoach client: one exception class per kind of failure.

Every failed call raises a :class:`StagecoachError` (or a subclass) carrying the server's message,
which names what is wrong and where (``training.batch_size: must be >= 1``), and its gRPC status
code. Catch the subclass for the case you handle::

    try:
        job = client.submit(spec)
    except stagecoach.InvalidSpec as e:
        print("fix the spec:", e.message)
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class StagecoachError(Exception):
    """A call to the coordinator failed.

    Attributes:
        message: the server's message (or the client's, for an error found before calling).
        code: the gRPC status code (``grpc.StatusCode``), None for an error the client found.
        call: the RPC that failed, e.g. ``"SubmitJob"``; empty for client-side errors.
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, call: str = ""):
        self.message = message
        self.code = code
        self.call = call
        where = f"{call}: " if call else ""
        what = f" [{code.name}]" if code is not None else ""
        super().__init__(f"{where}{message}{what}")


class InvalidArgument(StagecoachError):
    """The request was wrong: a field, a tensor's shape or dtype (INVALID_ARGUMENT)."""


class InvalidSpec(InvalidArgument):
    """The job spec is invalid; the message names the field path and the reason."""


class NotFound(StagecoachError):
    """No such job, step or artifact (NOT_FOUND)."""


class FailedPrecondition(StagecoachError):
    """The job is not in a state that allows the call, e.g. stepping a RUNNING job."""


class Unauthenticated(StagecoachError):
    """The client token is missing or wrong (UNAUTHENTICATED)."""


class PermissionDenied(StagecoachError):
    """The caller may not make this call (PERMISSION_DENIED)."""


class DeadlineExceeded(StagecoachError):
    """The call did not finish within its timeout (DEADLINE_EXCEEDED)."""


class Aborted(StagecoachError):
    """The job failed while serving the call; the message is its failure (ABORTED)."""


class Cancelled(StagecoachError):
    """The job was cancelled, or the call was (CANCELLED)."""


class ResourceExhausted(StagecoachError):
    """A limit was reached: message size, artifact size, admission (RESOURCE_EXHAUSTED)."""


class Unavailable(StagecoachError):
    """The coordinator cannot be reached (UNAVAILABLE)."""


class JobFailed(StagecoachError):
    """A job the client waited for ended FAILED or CANCELLED; ``status`` is its final status."""

    def __init__(self, message: str, status: object):
        super().__init__(message)
        self.status = status


_BY_CODE: Dict[grpc.StatusCode, Type[StagecoachError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}

# Calls whose INVALID_ARGUMENT is about the spec they carry.
_SPEC_CALLS = {"SubmitJob", "PlanSpec", "Infer"}


def from_rpc_error(error: grpc.RpcError, call: str) -> StagecoachError:
    """The exception for a failed call: its class by status code, the server's message."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    cls = _BY_CODE.get(code, StagecoachError)
    if cls is InvalidArgument and call in _SPEC_CALLS and not (message or "").startswith("inputs"):
        cls = InvalidSpec
    return cls(message or "", code, call)
