"""tpfuse as the CUDA implementation of torch's symm_mem::fused_matmul_reduce_scatter and
symm_mem::fused_all_gather_matmul, opt in:

    tpfuse.use_for_symm_mem()            # on until .restore() is called on what it returns
    with tpfuse.use_for_symm_mem(): ...  # on inside the block

Inductor's async-TP pass (torch._inductor.config._micro_pipeline_tp, as TorchTitan sets it) and vLLM's
replace all-gather + matmul and matmul + reduce-scatter with these ops; with the override on, their calls
run tpfuse's kernels, in eager and in compiled graphs alike, since it is the ops' CUDA kernel that is
replaced (the graphs, their Meta/fake implementations and their needs_fixed_stride_order tag stay torch's).

reduce_op "avg" (vLLM's) is served as the sum divided by P, exact in BF16 for P = 1, 2, 4, 8. A call tpfuse
cannot serve goes to torch's own kernel, and the reason is logged once (logger "tpfuse.symm_mem", WARNING):
reduce_op other than "sum" or "avg", scatter_dim or gather_dim other than 0, a dtype
other than BF16 (FP16, FP32), a GPU other than Hopper (sm_90) or tpfuse's library not loadable, a group of
more than 8 ranks, an N or K (per rank) not a multiple of 8, rows that do not divide over the group, A not
contiguous (torch's async-TP pass makes it so for dim 0) or a B that is neither contiguous K x N nor the
transpose view of a contiguous N x K weight, data not 16-byte aligned. The scaled FP8 variants
(fused_*_scaled_*) are not overridden: they always run torch's kernels.
"""

import logging
import threading
from typing import List, Optional

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import MAX_WORLD_SIZE, POINTER_ALIGNMENT, ROW_ALIGNMENT
from ._library import library
from .errors import TpfuseError

logger = logging.getLogger("tpfuse.symm_mem")

OPS = ("fused_matmul_reduce_scatter", "fused_all_gather_matmul")

_logged = set()
_logged_lock = threading.Lock()


def _fall_back(kind: str, detail: str) -> None:
    """Logs `detail` the first time a call falls back for reason `kind`."""
    with _logged_lock:
        if kind in _logged:
            return
        _logged.add(kind)
    logger.warning("tpfuse cannot serve this symm_mem call (%s): torch's own kernel runs it; further calls that "
                   "fall back for this reason are not logged", detail)


def _device_reason(device: torch.device) -> Optional[str]:
    """Why tpfuse cannot run on `device`, or None."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"gpu: the GPU is sm_{major}{minor}, tpfuse's kernels need Hopper (sm_90)"
    try:
        library()
    except TpfuseError as error:
        return f"library: tpfuse's library cannot be loaded: {error}"
    return None


def _k_by_n_reason(B: torch.Tensor, name: str) -> Optional[str]:
    if B.dim() != 2 or not (B.is_contiguous() or B.t().is_contiguous()):
        return (f"layout: {name} {tuple(B.shape)} with strides {B.stride()} is neither a contiguous K x N matrix nor "
                "the transpose view of a contiguous N x K weight")
    for extent, what in ((B.shape[1], "N"), (B.shape[0], "K")):
        if extent % ROW_ALIGNMENT != 0:
            return f"n_or_k: {name}'s {what} = {extent} is not a multiple of {ROW_ALIGNMENT}"
    return None


def _common_reason(A: torch.Tensor, Bs: List[torch.Tensor], dim: int, dim_name: str, group_size: int) -> Optional[str]:
    if dim != 0:
        return f"dim: {dim_name} = {dim}; tpfuse splits rows (dim 0) only"
    for name, tensor in (("A", A), *((f"B[{i}]", B) for i, B in enumerate(Bs))):
        if tensor.dtype != torch.bfloat16:
            return f"dtype: {name} is {tensor.dtype}; tpfuse takes BF16"
    if not 1 <= group_size <= MAX_WORLD_SIZE:
        return f"group: the group has {group_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}"
    if A.dim() < 2 or not A.is_contiguous():
        return f"layout: A {tuple(A.shape)} with strides {A.stride()} is not a contiguous matrix or batch of rows"
    for i, B in enumerate(Bs):
        reason = _k_by_n_reason(B, f"B[{i}]")
        if reason is not None:
            return reason
    for name, tensor in (("A", A), *((f"B[{i}]", B) for i, B in enumerate(Bs))):
        if tensor.data_ptr() % POINTER_ALIGNMENT != 0:
            return f"alignment: {name}'s data is not {POINTER_ALIGNMENT}-byte aligned"
    return _device_reason(A.device)


def matmul_reduce_scatter_reason(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                 group_name: str) -> Optional[str]:
    """Why tpfuse cannot serve this symm_mem.fused_matmul_reduce_scatter call ("kind: detail"), or None."""
    if reduce_op not in ("sum", "avg"):
        return f"reduce_op: reduce_op = {reduce_op!r}; tpfuse reduces with 'sum' (and 'avg' as the sum / P)"
    group_size = _resolve_process_group(group_name).size()
    reason = _common_reason(A, [B], scatter_dim, "scatter_dim", group_size)
    if reason is None and A.shape[0] % group_size != 0:
        reason = f"rows: A.shape[0] = {A.shape[0]} does not divide over the group's {group_size} ranks"
    return reason


def all_gather_matmul_reason(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int,
                             group_name: str) -> Optional[str]:
    """Why tpfuse cannot serve this symm_mem.fused_all_gather_matmul call ("kind: detail"), or None."""
    if len(Bs) == 0:
        return "empty: Bs is empty"
    return _common_reason(A, list(Bs), gather_dim, "gather_dim", _resolve_process_group(group_name).size())


def _torch_kernel(name: str):
    """torch's own CUDA kernel of symm_mem::<name>, looked up at the call."""
    import torch.distributed._symmetric_memory as symmetric_memory
    return getattr(symmetric_memory, f"_{name}")


def _fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                 group_name: str) -> torch.Tensor:
    reason = matmul_reduce_scatter_reason(A, B, reduce_op, scatter_dim, group_name)
    if reason is not None:
        _fall_back(*reason.split(": ", 1))
        return _torch_kernel("fused_matmul_reduce_scatter")(A, B, reduce_op, scatter_dim, group_name)
    out = torch.ops.tpfuse.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim, group_name)
    if reduce_op == "avg":
        # vLLM's async-TP pass asks for "avg". P is 1, 2, 4 or 8: dividing the BF16 sum by it only shifts the
        # exponent, so this is the average rounded once (short of BF16's subnormals).
        out.div_(_resolve_process_group(group_name).size())
    return out


def _fused_all_gather_matmul(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str, *,
                             return_A: bool = True):
    reason = all_gather_matmul_reason(A, Bs, gather_dim, group_name)
    if reason is not None:
        _fall_back(*reason.split(": ", 1))
        return _torch_kernel("fused_all_gather_matmul")(A, Bs, gather_dim, group_name, return_A=return_A)
    # Several Bs (SwiGLU's gate and up) share the one gather of A: the first is fused, the others use it.
    return torch.ops.tpfuse.fused_all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)


_KERNELS = {"fused_matmul_reduce_scatter": _fused_matmul_reduce_scatter,
            "fused_all_gather_matmul": _fused_all_gather_matmul}


class SymmMemOverride:
    """tpfuse registered as the `dispatch_key` kernel of torch's symm_mem ops (CUDA: where they run) while
    this is active. restore() (or leaving the `with` block) removes the registration, and torch's kernel
    is the one dispatched to again. Overrides on the same key nest: the registration is made by the first
    and removed when the last is restored."""

    _active = {}  # dispatch key -> [torch.library.Library, unrestored overrides, torch's keys in _impls]
    _lock = threading.Lock()

    def __init__(self, dispatch_key: str = "CUDA"):
        import torch.distributed._symmetric_memory  # noqa: F401 -- defines the symm_mem ops
        self.dispatch_key = dispatch_key
        self._restored = False
        with self._lock:
            entry = self._active.get(dispatch_key)
            if entry is None:
                keys = {f"symm_mem/{name}/{dispatch_key}" for name in OPS}
                torchs = keys & torch.library._impls  # torch registered its CUDA kernels from Python
                lib = torch.library.Library("symm_mem", "IMPL")  # noqa: TOR901 -- removed by restore()
                # Torch before 2.8 refuses a second Python kernel on a key it has on record (later ones
                # override by default): forget torch's keys while ours is registered; restore() puts
                # them back.
                torch.library._impls.difference_update(torchs)
                for name in OPS:
                    lib.impl(name, _KERNELS[name], dispatch_key)
                entry = self._active[dispatch_key] = [lib, 0, torchs]
            entry[1] += 1

    def restore(self) -> None:
        """Gives the ops back to torch's kernel (once the last override on this key is restored)."""
        with self._lock:
            if self._restored:
                return
            self._restored = True
            entry = self._active[self.dispatch_key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._active[self.dispatch_key]
                entry[0]._destroy()
                # _destroy forgets these keys in torch.library's record of Python kernels, though torch's own
                # registration (the one now dispatched to again) is still there.
                torch.library._impls.update(entry[2])

    @property
    def active(self) -> bool:
        return not self._restored

    def __enter__(self) -> "SymmMemOverride":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def use_for_symm_mem() -> SymmMemOverride:
    """Makes tpfuse the CUDA kernel of torch.ops.symm_mem.fused_matmul_reduce_scatter and
    fused_all_gather_matmul (falling back to torch's kernel, logged once per reason, where it cannot serve
    a call). Returns the override: call .restore() to give the ops back to torch, or use it in a `with`."""
    return SymmMemOverride("CUDA")
