"""tpfuse communicators, one per (process group, device), made on first use and cached.

The NCCL communicator under it is the one torch's ProcessGroupNCCL already holds when torch shares
tpfuse's NCCL library (see _library.py), else tpfuse's own over the group (a unique id broadcast
through the group). Receive buffers are sized for the first call and grown, outside CUDA graph
capture only, when a call needs more. Creating, growing and closing are collective: every rank of
the group does them at the same call, which holds since all ranks call with the same shapes.
"""

import ctypes
import threading
from typing import Optional

import torch
import torch.distributed as dist

from ._library import NCCL_UNIQUE_ID_BYTES, library
from .errors import InvalidArgumentError, TpfuseError


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
    max_m x max_n and all-gather calls of max_m x max_k (max_k 0: none yet)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        self.group = group  # held, so that the cache's key (its id) stays this group's
        self.device = device
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
                    "graph capture: run the largest call once before capturing")
            # M at least doubles when it grows, so that varying M re-creates the buffers a few times only.
            max_m = self.max_m if m <= self.max_m else max(m, 2 * self.max_m)
            self._create(max_m, max(n, self.max_n), max(k, self.max_k))
        self.captured = self.captured or capturing
        return self.handle

    def _create(self, max_m: int, max_n: int, max_k: int) -> None:
        with torch.cuda.device(self.device):
            handle = ctypes.c_void_p()
            library().call("tpfuse_communicator_create", self.nccl_comm, max_m, max_n, max_k, 0.0,
                           ctypes.byref(handle))
            if self.handle is not None:
                self._retire()
        self.handle, self.max_m, self.max_n, self.max_k = handle.value, max_m, max_n, max_k

    def _retire(self) -> None:
        if self.captured:
            self.retired.append(self.handle)
        else:
            library().call("tpfuse_communicator_destroy", self.handle)
        self.captured = False

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


_communicators = {}
_communicators_lock = threading.Lock()


def communicator(group: dist.ProcessGroup, device: torch.device) -> GroupCommunicator:
    """The cached communicator of `group` on `device`, made on first use (collective)."""
    key = (id(group), device.index)
    with _communicators_lock:
        if key not in _communicators:
            if torch.cuda.is_current_stream_capturing():
                raise InvalidArgumentError(
                    "tpfuse's communicator for this group is made at its first call, which cannot be inside CUDA "
                    "graph capture: run the call once before capturing")
            _communicators[key] = GroupCommunicator(group, device)
        return _communicators[key]


def close(group: Optional[dist.ProcessGroup] = None) -> None:
    """Frees tpfuse's communicators of `group` (all groups: None). Collective; call it on every rank
    before destroying the group."""
    with _communicators_lock:
        # The same order on every rank (group names, unlike ids, agree), since closing is collective.
        keys = sorted((key for key, comm in _communicators.items() if group is None or comm.group is group),
                      key=lambda key: (_communicators[key].group.group_name, key[1]))
        errors = []  # every communicator is closed even when one fails; the first failure is raised
        for key in keys:
            try:
                _communicators.pop(key).close()
            except TpfuseError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def status(group: Optional[dist.ProcessGroup] = None) -> None:
    """Raises the PeerTimeoutError of any synchronized call of `group` (all groups: None) that waited
    in vain for a peer."""
    with _communicators_lock:
        comms = [comm for comm in _communicators.values() if group is None or comm.group is group]
    for comm in comms:
        comm.status()
