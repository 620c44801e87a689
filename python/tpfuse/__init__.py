"""tpfuse for PyTorch: the fused GEMM + reduce-scatter of a row-parallel linear layer, and the fused
all-gather + GEMM of a column-parallel one.

    out = tpfuse.gemm_reduce_scatter(a, w, group)   # a: M x K/P, w: N x K/P (nn.Linear's weight)
    y = tpfuse.all_gather_gemm(x, w, group)          # x: M/P x K, w: N/P x K; y: M x N/P

One process per GPU, BF16 in and out; both also take FP8 (torch.float8_e4m3fn) inputs with FP32 scales,
tensorwise, rowwise or blockwise, and quantize_all_gather_gemm quantizes BF16 rows to FP8 on their own rank
first.
Rank r of `group` holds a_r and w_r; every rank gets its M/P rows of sum_r a_r @ w_r^T; with
all_gather_gemm, every rank gets (x_0; x_1; ...) @ w_r^T.
Both take an optional bias and a batch (sequences whose rows each rank holds 1/P of: torch's collectives
along dim 1 of [batch, s, ...]). `fused_matmul_reduce_scatter` and `fused_all_gather_matmul` are drop-ins
for torch.ops.symm_mem's ops of those names (reduce_op "sum"; any scatter_dim / gather_dim but the last).
All are torch custom ops (torch.ops.tpfuse.*): traceable by torch.compile, capturable in CUDA graphs, run
on the current stream. Every failure raises a TpfuseError subclass carrying the library's message.
"""

from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import _communicators, _ops  # _ops registers the torch.ops.tpfuse custom ops
from ._communicators import close, status, workspace_bytes
from ._checks import check_batch_count, check_fast_accum
from ._library import NcclInfo, library
from .errors import (CudaError, InternalError, InvalidArgumentError, NcclError, PeerTimeoutError, StatusCode,
                     TpfuseError, UnsupportedError, tpfuse_error_of)

# Training and the compilers: the ops' backward passes (registered by importing tpfuse.autograd), the
# parallel linear layers (tpfuse.nn), FP8 quantization (tpfuse.float8), the opt-in Inductor pass
# (tpfuse.inductor, imported at its first use: it imports Inductor, seconds that a process which does not
# compile should not pay) and the opt-in override of torch's symm_mem ops.
from . import autograd, float8, nn  # noqa: E402,F401
from .symm_mem import SymmMemOverride, reset_stats, stats, use_for_symm_mem  # noqa: E402

__all__ = [
    "gemm_reduce_scatter", "fused_matmul_reduce_scatter", "all_gather_gemm", "fused_all_gather_matmul",
    "quantize_all_gather_gemm", "close", "status", "check",
    "reserve", "workspace_bytes", "nccl_info", "tpfuse_error_of",
    "TpfuseError", "InvalidArgumentError", "UnsupportedError", "CudaError", "NcclError", "PeerTimeoutError",
    "InternalError", "StatusCode",
    "autograd", "float8", "nn", "use_for_symm_mem", "SymmMemOverride", "stats", "reset_stats",
]

Group = Union[dist.ProcessGroup, str, None]


def _resolve_group(group_name: str) -> dist.ProcessGroup:
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        return _resolve_process_group(group_name)
    except (KeyError, ValueError, RuntimeError) as error:
        raise InvalidArgumentError(f"group = {group_name!r} names no process group") from error


def _group_name(group: Group) -> str:
    if isinstance(group, str):
        return group
    if group is None:
        group = dist.group.WORLD
        if group is None:
            raise InvalidArgumentError("no process group: call torch.distributed.init_process_group first, "
                                       "or pass the group")
    return group.group_name


def gemm_reduce_scatter(a: torch.Tensor, w: torch.Tensor, group: Group = None, *, weight_layout: str = "nk",
                        out: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, batch: int = 1,
                        a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                        use_fast_accum: bool = False) -> torch.Tensor:
    """This rank's M/P x N rows (BF16) of the sum over the group's P ranks of a @ W (+ bias).

    a: M x K/P, contiguous BF16 (this rank's K-slice of the activations).
    w: this rank's K-slice of the weight, contiguous BF16: N x K/P with weight_layout="nk"
       (nn.Linear's weight, as stored), K/P x N with weight_layout="kn".
    FP8: a and w both torch.float8_e4m3fn, w N x K/P ("nk") only, K/P a multiple of 16, with FP32 scales on
       a's device: each rank's product is (a @ W) * a_scale * w_scale in FP32 before the bias, the reduction
       and the one rounding to BF16. Tensorwise: a_scale and w_scale one element each; rowwise: a_scale one
       per row of a ((M, 1) or (M,)), w_scale one per output column ((1, N), (N, 1) or (N,)); blockwise
       (DeepSeek-V3's, tpfuse.float8.quantize_blockwise): a_scale (M, K/P/128), one per row and 128 of K/P,
       w_scale (ceil(N/128), K/P/128), one per 128 x 128 block of w, both row-major, each applied to its
       block's partial sums; K/P a multiple of 128, use_fast_accum False. Scales are not read on the host: a
       non-finite scale gives non-finite outputs, not an error.
       use_fast_accum: the tensor cores' own accumulation (torch._scaled_mm's flag) instead of adding
       their partial sums into FP32 every 128 of K/P. The FP8 call has no backward pass.
    group: a ProcessGroup (its NCCL backend) or its name; None is the default group.
    out: optional M/P x N BF16 tensor to write (and return).
    bias: optional N BF16 entries, added once to the reduced rows before their one rounding to BF16.
    batch: a's rows are `batch` sequences of S = M/batch rows, one after the other, and this rank keeps
       its S/P rows of each (torch's reduce-scatter along dim 1 of a [batch, S, N] tensor); 1 splits the
       rows as a whole.
    S must divide by P (with batch > 1 and P > 1, S/P must be a multiple of 64: else UnsupportedError),
    N and K/P must be multiples of 8, and every rank calls with the same shapes.
    """
    group_name = _group_name(group)
    if _ops.eager_allowed(a, w, out, bias, a_scale, w_scale):
        return _ops.gemm_reduce_scatter_eager(a, w, weight_layout, group_name, out, bias, batch, a_scale, w_scale,
                                              use_fast_accum)
    check_batch_count(batch)
    check_fast_accum(use_fast_accum)
    if out is None:
        return torch.ops.tpfuse.gemm_reduce_scatter(a, w, weight_layout, group_name, bias, batch, a_scale, w_scale,
                                                    use_fast_accum)
    torch.ops.tpfuse.gemm_reduce_scatter_out(a, w, weight_layout, group_name, out, bias, batch, a_scale, w_scale,
                                             use_fast_accum)
    return out


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: str) -> torch.Tensor:
    """Drop-in for torch.ops.symm_mem.fused_matmul_reduce_scatter: reduce_scatter_tensor(A @ B, ...).

    A: (..., K/P), contiguous BF16; B: K/P x N, contiguous or the transpose view of a contiguous
    N x K/P nn.Linear weight (used in place). reduce_op must be "sum"; scatter_dim any dimension of A
    but the last, whose extent must divide by the group's size (a scatter_dim past 0 is the batch of
    gemm_reduce_scatter: no copy). Returns A's shape with A.shape[scatter_dim] / P and N last.
    """
    return torch.ops.tpfuse.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)


def all_gather_gemm(x: torch.Tensor, w: torch.Tensor, group: Group = None, *, weight_layout: str = "nk",
                    return_gathered: bool = False, bias: Optional[torch.Tensor] = None, batch: int = 1,
                    x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                    use_fast_accum: bool = False):
    """Y = the gathered X @ W (+ bias) (M x N/P, BF16): the rows of every rank's x, in rank order, times
    this rank's w. With return_gathered, returns (Y, the gathered X (M x K, x's dtype)).

    x: M/P x K, contiguous BF16 (this rank's rows of the activations).
    w: this rank's output columns of the weight, contiguous BF16: N/P x K with weight_layout="nk"
       (nn.Linear's weight, as stored), K x N/P with weight_layout="kn".
    FP8: x and w both torch.float8_e4m3fn, w N/P x K ("nk") only, K a multiple of 16, with FP32 scales on
       x's device: Y = (X @ W) * x_scale * w_scale in FP32 before the bias and the one rounding to BF16, as
       torch._scaled_mm scales its product. Tensorwise: x_scale and w_scale one element each (x_scale applies
       to every gathered row, as torch's fused_all_gather_scaled_matmul applies A_scale); rowwise: x_scale one
       per row of this rank's x ((M/P, 1) or (M/P,): the kernel gathers them with the rows), w_scale one per
       output column ((1, N/P), (N/P, 1) or (N/P,)); blockwise (DeepSeek-V3's, tpfuse.float8.quantize_blockwise):
       x_scale (M/P, K/128), one per row of this rank's x and 128 of K (gathered with the rows), w_scale
       (ceil(N/P/128), K/128), one per 128 x 128 block of w, both row-major, each applied to its block's partial
       sums; K a multiple of 128, use_fast_accum False. One element each is tensorwise, also where those are
       blockwise shapes (M/P = 1, K = 128, N/P at most 128). Scales are not read on the host: a non-finite scale
       gives non-finite outputs, not an error.
       use_fast_accum: the tensor cores' own accumulation (torch._scaled_mm's flag) instead of adding their
       partial sums into FP32 every 128 of K. The FP8 call has no backward pass.
    group: a ProcessGroup (its NCCL backend) or its name; None is the default group.
    bias: optional N/P BF16 entries, added to every row of Y before its one rounding to BF16.
    batch: x holds this rank's rows of `batch` sequences, one after the other, and the gathered X has
       each sequence's rows in rank order, sequence after sequence (torch's all-gather along dim 1 of a
       [batch, S/P, K] tensor); 1 gathers the rows as a whole. With batch > 1 and P > 1, x's rows of a
       sequence must be a multiple of 64 (else UnsupportedError).
    N/P and K must be multiples of 8, and every rank calls with the same shapes.
    """
    group_name = _group_name(group)
    check_batch_count(batch)
    check_fast_accum(use_fast_accum)
    if return_gathered:
        return torch.ops.tpfuse.all_gather_gemm_gathered(x, w, weight_layout, group_name, bias, batch, x_scale,
                                                         w_scale, use_fast_accum)
    return torch.ops.tpfuse.all_gather_gemm(x, w, weight_layout, group_name, bias, batch, x_scale, w_scale,
                                            use_fast_accum)


def quantize_all_gather_gemm(x: torch.Tensor, w: torch.Tensor, group: Group = None, *, w_scale: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, batch: int = 1, use_fast_accum: bool = False,
                             scaling: str = "rowwise") -> torch.Tensor:
    """all_gather_gemm of x's rows quantized on this rank: Y (M x N/P, BF16) = the gathered e4m3 rows @ W, scaled
    by their scales and w_scale, as a float8 recipe computes the gathered BF16 x quantized and multiplied. Bit for
    bit the same: each scale depends on one row's entries alone, so quantizing before the gather equals quantizing
    after it, and the gather moves half the bytes.

    x: M/P x K, contiguous BF16 (this rank's rows).
    w: N/P x K, contiguous torch.float8_e4m3fn (this rank's output columns, as nn.Linear stores its weight), K a
       multiple of 16.
    scaling: how x is quantized, and so what w_scale must be (FP32, row-major):
       "rowwise": one power-of-2 scale per row (tpfuse.float8.quantize_rowwise, torchao's rowwise recipe, whose
       product is torch._scaled_mm's); w_scale one per output column ((1, N/P), as torch._scaled_mm takes it,
       (N/P, 1) or (N/P,)).
       "blockwise": one scale per 1 x 128 tile of K (tpfuse.float8.quantize_blockwise, DeepSeek-V3's); w_scale
       (ceil(N/P/128), K/128), one per 128 x 128 block of w (quantize_blockwise(weight, WEIGHT_BLOCK)'s); K a
       multiple of 128, use_fast_accum False.
    bias, batch, use_fast_accum, group: as all_gather_gemm's. No backward pass.
    """
    group_name = _group_name(group)
    check_batch_count(batch)
    check_fast_accum(use_fast_accum)
    return torch.ops.tpfuse.quantize_all_gather_gemm(x, w, w_scale, group_name, bias, batch, use_fast_accum, scaling)


def fused_all_gather_matmul(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str, *,
                            return_A: bool = True) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """Drop-in for torch.ops.symm_mem.fused_all_gather_matmul: (the gathered A if return_A, else None,
    [the gathered A @ B for B in Bs]).

    A: (..., K), contiguous BF16, this rank's shard, gathered along gather_dim (any dimension but the
    last; past 0 it is the batch of all_gather_gemm: no copy).
    Bs: K x N_i each, contiguous or the transpose view of a contiguous N_i x K nn.Linear weight (used in
    place). The first B is the fused call; later ones multiply the A it gathered (tpfuse's GEMM).
    """
    return torch.ops.tpfuse.fused_all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)


def reserve(group: Group = None, max_m: int = 0, max_n: int = 0, max_k: int = 0, *,
            timeout: Optional[float] = None, device: Optional[torch.device] = None) -> None:
    """Makes (or grows) the group's communicator ahead of its calls: workspace for reduce-scatter calls
    up to max_m x max_n and all-gather calls up to max_m x max_k (4 * max_m * max(max_n, max_k) bytes,
    on this rank's GPU), and timeout (seconds; default: the process group's own) for every wait on a
    peer. Collective: every rank of the group calls it with the same arguments, outside CUDA graph
    capture. device: the GPU of the calls (default: the current one)."""
    group_name = _group_name(group)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    _communicators.reserve(_resolve_group(group_name), device, max_m, max_n, max_k, timeout)


def check(group: Group = None) -> None:
    """Raises PeerTimeoutError if any call of `group` (None: all groups) so far, eager or replayed in
    a CUDA graph, waited in vain for a peer. Cheap (it reads host memory the GPU writes, no
    synchronization): call it once per step, since a graph replay cannot raise by itself."""
    status(group)


def nccl_info() -> NcclInfo:
    """Which NCCL library the process runs, its version and that of tpfuse's build (loads the library)."""
    return library().nccl


def __getattr__(name: str):
    if name == "inductor":
        import importlib
        return importlib.import_module(".inductor", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
