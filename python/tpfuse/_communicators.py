"""tpfuse communicators, one per (process group, device), made on first use (or by reserve) and cached.

The NCCL communicator under it is the one torch's ProcessGroupNCCL already holds when torch shares
tpfuse's NCCL library (see _library.py), else tpfuse's own over the group (a unique id broadcast
through the group). Receive buffers are sized for the first call (or reserve) and grown, outside CUDA
graph capture only, when a call needs more. Creating, growing and closing are collective: every rank
of the group does them at the same call, which holds since all ranks call with the same shapes.
Before each, the ranks meet in an all-reduce waited for at most the communicator's timeout, so a
rank that never comes raises PeerTimeoutError instead of blocking the others without bound.
"""

import ctypes
import datetime
import logging
import threading
from typing import Optional, Union

import torch
import torch.distributed as dist

from ._library import NCCL_UNIQUE_ID_BYTES, library
from .errors import InvalidArgumentError, PeerTimeoutError, TpfuseError

logger = logging.getLogger("tpfuse")

DEFAULT_TIMEOUT_S = 600.0  # torch's default for NCCL process groups, where a group does not say


def group_timeout_s(group: dist.ProcessGroup) -> float:
    """The group's own timeout in seconds (its NCCL backend's options), else torch's NCCL default."""
    try:
        return group._get_backend(torch.device("cuda")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError, ValueError):
        pass
    try:
        from torch.distributed.distributed_c10d import _get_default_timeout
        return _get_default_timeout(dist.Backend.NCCL).total_seconds()
    except (ImportError, AttributeError, TypeError):
        return DEFAULT_TIMEOUT_S


def rendezvous(group: dist.ProcessGroup, device: torch.device, timeout_s: float, what: str) -> None:
    """Waits, at most timeout_s, until every rank of the group has reached this point (a small
    all-reduce), so that the collective that follows does not wait for a rank that never comes."""
    work = dist.all_reduce(torch.zeros(1, device=device), group=group, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as error:
        raise PeerTimeoutError(
            f"{what}: not every rank of group {group.group_name!r} arrived within {timeout_s:g} s (every rank "
            f"makes its first tpfuse call on a group, and each larger one, together): {error}") from error


def torch_nccl_comm(group: dist.ProcessGroup, device: torch.device) -> Optional[int]:
    """The ncclComm_t of torch's ProcessGroupNCCL for `device`, or None where torch has none to give."""
    if not library().nccl.loaded_by_torch:
        return None
    try:
        backend = group._get_backend(torch.device("cuda"))
        # NOTE: torch looks the communicator up by the current device, and answers 0 where it has none.
        with torch.cuda.device(device):
            pointer = backend._comm_ptr()
            if not pointer:
                # A lazily initialized ProcessGroupNCCL makes its communicator at the first collective.
                dist.all_reduce(torch.zeros(1, device=device), group=group)
                pointer = backend._comm_ptr()
    except (AttributeError, RuntimeError, ValueError):
        return None
    return pointer or None


class NcclCommunicator:
    """tpfuse's own NCCL communicator over a group."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        unique_id = ctypes.create_string_buffer(NCCL_UNIQUE_ID_BYTES)
        if group.rank() == 0:
            library().call("tpfuse_nccl_get_unique_id", unique_id)
        shared = [unique_id.raw]
        dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0), group=group, device=device)
        handle = ctypes.c_void_p()
        library().call("tpfuse_nccl_comm_init_rank", ctypes.byref(handle), group.size(), shared[0], group.rank(),
                       device.index)
        self.handle = handle.value

    def destroy(self) -> None:
        library().call("tpfuse_nccl_comm_destroy", self.handle)


class GroupCommunicator:
    """tpfuse's communicator for one group on one device, with workspace for reduce-scatter calls of
    max_m x max_n and all-gather calls of max_m x max_k (max_k 0: none yet), and its peers' waits
    bounded by timeout_s."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, timeout_s: Optional[float] = None):
        self.group = group  # held, so that the cache's key (its id) stays this group's
        self.group_name = group.group_name
        self.group_size = group.size()
        self.device = device
        self.timeout_s = group_timeout_s(group) if timeout_s is None else timeout_s
        rendezvous(group, device, self.timeout_s, "making tpfuse's communicator")
        pointer = torch_nccl_comm(group, device)
        self.own_nccl = None if pointer is not None else NcclCommunicator(group, device)
        self.nccl_comm = pointer if pointer is not None else self.own_nccl.handle
        self.handle: Optional[int] = None
        self.max_m = self.max_n = self.max_k = 0
        self.captured = False    # a CUDA graph holds the current buffers' addresses
        self.retired = []        # earlier communicators whose buffers a CUDA graph holds

    @property
    def uses_torch_comm(self) -> bool:
        return self.own_nccl is None

    def reserve(self, m: int, n: int, k: int = 0) -> int:
        """The communicator's handle, with workspace for an m x n reduce-scatter call or, with k, an
        all-gather call of m x k gathered and n output columns (grown if needed)."""
        capturing = torch.cuda.is_current_stream_capturing()
        if m > self.max_m or n > self.max_n or k > self.max_k:
            if capturing:
                raise InvalidArgumentError(
                    f"an M x N x K = {m} x {n} x {k} call needs a larger workspace than the {self.max_m} x "
                    f"{self.max_n} x {self.max_k} this group's communicator has, and it cannot grow during CUDA "
                    "graph capture: run the largest call once before capturing, or tpfuse.reserve() it")
            # M at least doubles when it grows, so that varying M re-creates the buffers a few times only.
            max_m = self.max_m if m <= self.max_m else max(m, 2 * self.max_m)
            self._create(max_m, max(n, self.max_n), max(k, self.max_k))
        self.captured = self.captured or capturing
        return self.handle

    def _create(self, max_m: int, max_n: int, max_k: int) -> None:
        if self.handle is not None:
            rendezvous(self.group, self.device, self.timeout_s, "growing tpfuse's workspace")
        with torch.cuda.device(self.device):
            handle = ctypes.c_void_p()
            library().call("tpfuse_communicator_create", self.nccl_comm, max_m, max_n, max_k, float(self.timeout_s),
                           ctypes.byref(handle))
            grown = self.handle is not None
            if grown:
                self._retire()
        self.handle, self.max_m, self.max_n, self.max_k = handle.value, max_m, max_n, max_k
        logger.info("tpfuse: %s the workspace of group %r on %s: %.1f MiB for M <= %d, N <= %d, K <= %d "
                    "(peer timeout %g s)", "grew" if grown else "made", self.group_name, self.device,
                    self.workspace_bytes() / 2**20, max_m, max_n, max_k, self.timeout_s)

    def _retire(self) -> None:
        if self.captured:
            self.retired.append(self.handle)
        else:
            library().call("tpfuse_communicator_destroy", self.handle)
        self.captured = False

    def workspace_bytes(self) -> int:
        """The bytes of workspace this communicator holds on its device (with buffers kept for graphs)."""
        total = 0
        for handle in [self.handle, *self.retired]:
            if handle is not None:
                size = ctypes.c_int64()
                library().call("tpfuse_communicator_workspace_bytes", handle, ctypes.byref(size))
                total += size.value
        return total

    def status(self) -> None:
        """Raises PeerTimeoutError if a call whose stream was synchronized waited in vain for a peer."""
        for handle in [self.handle, *self.retired]:
            if handle is not None:
                library().call("tpfuse_communicator_status", handle)

    def close(self) -> None:
        """Frees the buffers (and tpfuse's own NCCL communicator). Collective."""
        with torch.cuda.device(self.device):
            for handle in [*self.retired, self.handle]:
                if handle is not None:
                    library().call("tpfuse_communicator_destroy", handle)
            self.handle, self.retired = None, []
            if self.own_nccl is not None:
                self.own_nccl.destroy()
                self.own_nccl = None


Group = Union[dist.ProcessGroup, str, None]

_communicators = {}  # (id(group), device index) -> GroupCommunicator
_by_name = {}        # (group name, device index) -> GroupCommunicator: the ops' look-up
_communicators_lock = threading.RLock()


def communicator(group: dist.ProcessGroup, device: torch.device,
                 timeout_s: Optional[float] = None) -> GroupCommunicator:
    """The cached communicator of `group` on `device`, made on first use (collective)."""
    key = (id(group), device.index)
    with _communicators_lock:
        if key not in _communicators:
            if torch.cuda.is_current_stream_capturing():
                raise InvalidArgumentError(
                    "tpfuse's communicator for this group is made at its first call, which cannot be inside CUDA "
                    "graph capture: run the call once before capturing, or tpfuse.reserve() the group")
            comm = GroupCommunicator(group, device, timeout_s)
            _communicators[key] = comm
            _by_name[(comm.group_name, device.index)] = comm
        return _communicators[key]


def _matches(comm: GroupCommunicator, group: Group) -> bool:
    if group is None:
        return True
    if isinstance(group, str):
        return comm.group_name == group
    return comm.group is group


def _select(group: Group) -> list:
    """The cached communicators of `group` (a ProcessGroup, its name, or None: all), in the same order
    on every rank (group names, unlike ids, agree), since closing is collective."""
    if isinstance(group, str) and not any(_matches(comm, group) for comm in _communicators.values()):
        known = sorted({comm.group_name for comm in _communicators.values()})
        if not dist.is_initialized() or not _group_name_exists(group):
            raise InvalidArgumentError(f"group = {group!r} names no process group (tpfuse has communicators for "
                                       f"{known or 'none'})")
    keys = sorted((key for key, comm in _communicators.items() if _matches(comm, group)),
                  key=lambda key: (_communicators[key].group_name, key[1]))
    return keys


def _group_name_exists(name: str) -> bool:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group
        _resolve_process_group(name)
        return True
    except (ImportError, KeyError, ValueError, RuntimeError):
        return False


def close(group: Group = None) -> None:
    """Frees tpfuse's communicators of `group` (a ProcessGroup or its name; None: all groups).
    Collective; call it on every rank before destroying the group."""
    with _communicators_lock:
        errors = []  # every communicator is closed even when one fails; the first failure is raised
        for key in _select(group):
            comm = _communicators.pop(key)
            _by_name.pop((comm.group_name, key[1]), None)
            try:
                comm.close()
            except TpfuseError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def status(group: Group = None) -> None:
    """Raises the PeerTimeoutError of any synchronized call of `group` (a ProcessGroup or its name;
    None: all groups) that waited in vain for a peer."""
    with _communicators_lock:
        comms = [_communicators[key] for key in _select(group)]
    for comm in comms:
        comm.status()


def workspace_bytes(group: Group = None) -> int:
    """The bytes of workspace tpfuse holds for `group` (None: all groups) on this process's devices."""
    with _communicators_lock:
        return sum(_communicators[key].workspace_bytes() for key in _select(group))


def reserve(group: dist.ProcessGroup, device: torch.device, max_m: int, max_n: int, max_k: int,
            timeout_s: Optional[float]) -> GroupCommunicator:
    """The group's communicator on `device` with workspace for calls up to max_m x max_n (x max_k),
    and timeout_s (None: as it is, or the group's) for its peers' waits. Collective."""
    if timeout_s is not None and not (timeout_s > 0 and timeout_s < float("inf")):
        raise InvalidArgumentError(f"timeout = {timeout_s!r} must be a positive, finite number of seconds")
    size = group.size()
    for name, value, multiple in (("max_m", max_m, size), ("max_n", max_n, 8), ("max_k", max_k, 8)):
        if not isinstance(value, int) or value < 0 or value % multiple != 0:
            raise InvalidArgumentError(f"{name} = {value!r} must be a non-negative multiple of {multiple}")
    with _communicators_lock:
        comm = communicator(group, device, timeout_s)
        if torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError("tpfuse.reserve cannot run during CUDA graph capture: call it before")
        retime = timeout_s is not None and timeout_s != comm.timeout_s
        if retime:
            comm.timeout_s = timeout_s
        if retime or max_m > comm.max_m or max_n > comm.max_n or max_k > comm.max_k:
            comm._create(max(max_m, comm.max_m, size), max(max_n, comm.max_n, 8), max(max_k, comm.max_k))
        return comm
