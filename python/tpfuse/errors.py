"""tpfuse's errors: one exception class per status code of the C ABI (include/tpfuse/tpfuse_c.h)."""

import enum


class StatusCode(enum.IntEnum):
    """The status codes of tpfuse_c.h (tpfuse::StatusCode)."""

    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    CUDA_ERROR = 3
    NCCL_ERROR = 4
    PEER_TIMEOUT = 5
    INTERNAL = 6


class TpfuseError(RuntimeError):
    """A tpfuse call failed; `code` says how, the message says what."""

    code = StatusCode.INTERNAL

    # No __init__ of its own: torch.compile's tracer can then raise it as it is.
    @property
    def message(self) -> str:
        return self.args[0] if self.args else ""


class InvalidArgumentError(TpfuseError, ValueError):
    """A shape, dtype, device, layout, pointer or option the caller got wrong."""

    code = StatusCode.INVALID_ARGUMENT


class UnsupportedError(TpfuseError):
    """Valid, but not supported on this device, build or NCCL."""

    code = StatusCode.UNSUPPORTED


class CudaError(TpfuseError):
    code = StatusCode.CUDA_ERROR


class NcclError(TpfuseError):
    code = StatusCode.NCCL_ERROR


class PeerTimeoutError(TpfuseError, TimeoutError):
    """A peer never arrived: a bounded wait for another rank's partial expired. The group's
    communicator is unusable afterwards: tpfuse.close(group) on every rank, then call again."""

    code = StatusCode.PEER_TIMEOUT


class InternalError(TpfuseError):
    code = StatusCode.INTERNAL


_ERROR_OF_CODE = {error.code: error for error in (
    InvalidArgumentError, UnsupportedError, CudaError, NcclError, PeerTimeoutError, InternalError)}


def error_for(code: int, message: str) -> TpfuseError:
    """The exception for a status code that is not OK (an unknown code is an InternalError)."""
    try:
        error = _ERROR_OF_CODE[StatusCode(code)]
    except (ValueError, KeyError):
        return InternalError(f"unknown tpfuse status code {code}: {message}")
    return error(message)


def tpfuse_error_of(error: BaseException):
    """The TpfuseError behind `error`, or None. torch.compile reports an error of an op's fake
    implementation (a bad argument found at trace time) as its own TorchRuntimeError, whose chain
    (__cause__ or __context__) holds the tpfuse error: this finds it."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, TpfuseError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
