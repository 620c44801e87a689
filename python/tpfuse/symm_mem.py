"""tpfuse as the CUDA implementation of torch's symm_mem::fused_matmul_reduce_scatter,
symm_mem::fused_all_gather_matmul and their FP8 forms symm_mem::fused_scaled_matmul_reduce_scatter and
symm_mem::fused_all_gather_scaled_matmul, opt in:

    tpfuse.use_for_symm_mem()            # on until .restore() is called on what it returns
    with tpfuse.use_for_symm_mem(): ...  # on inside the block

Inductor's async-TP pass (torch._inductor.config._micro_pipeline_tp, as TorchTitan sets it) and vLLM's
replace all-gather + matmul and matmul + reduce-scatter with these ops; with the override on, their calls
run tpfuse's kernels, in eager and in compiled graphs alike, since it is the ops' CUDA kernel that is
replaced (the graphs, their Meta/fake implementations and their needs_fixed_stride_order tag stay torch's).
The results have the strides of torch's Meta implementation, which compiled graphs assert.

scatter_dim / gather_dim d may be any dimension of A but the last (TorchTitan's sequence sharding is d = 1
of [b, s, h]). Inductor's pass lays A out so that A.movedim(d, 0) is contiguous ("token-major"):
  - all-gather: the shard's token-major rows are gathered as a whole, and the outputs, A.movedim(d, 0)
    gathered, are torch's strides: no copy. A shard laid out otherwise is copied token-major once (this
    rank's rows), as torch's own kernel does.
  - reduce-scatter: a contiguous A is the kernels' batch (prod(A.shape[:d]) sequences): no copy. A
    token-major A is reduce-scattered as a whole, and this rank's rows (token-major) are copied into the
    contiguous result that torch's op returns.
reduce_op "avg" is served as the sum divided by P, exact in BF16 for P = 1, 2, 4, 8.

fused_scaled_matmul_reduce_scatter (FP8 e4m3 A and B, torch._scaled_mm's product reduce-scattered) has two
schemas: torch 2.7's (A, B, A_scale, B_scale, reduce_op, scatter_dim, group_name, ...) and the later one, where
A is the matrix _scaled_mm multiplied (A reshaped to 2-D by Inductor) and the product is viewed as
output_shape and scattered along orig_scatter_dim (scatter_dim_after_maybe_reshape only steers torch's own
kernel). Both mean torch's Meta implementation: _scaled_mm(A's rows, B, ...) viewed in the output's shape,
reduce-scattered along that dimension; tpfuse serves that, with A's rows in the output's shape as the BF16
reduce-scatter takes them. It serves B column-major (B.t() contiguous: an N x K weight, tpfuse's FP8 layout),
tensorwise scales (one element each) or rowwise ones (A_scale one per row of A, B_scale (1, N)), FP32, either
use_fast_accum, out_dtype torch.bfloat16, and no bias or result_scale.

A call tpfuse cannot serve goes to torch's own kernel, logged once per (op, reason) (logger
"tpfuse.symm_mem", WARNING); the reasons: reduce_op (not "sum" or "avg"), dim (the last dimension of A),
rows (A's scattered extent does not divide over the group), dtype (not BF16), group (more than 8 ranks),
layout (an A that is neither contiguous nor token-major for the reduce-scatter, or a B that is neither a
contiguous K x N matrix nor the transpose view of a contiguous N x K weight), n_or_k (not a multiple of 8),
alignment (data not 16-byte aligned), shard (a contiguous A of more than one sequence whose shard of a
sequence is not a multiple of 64 rows, on more than one rank), empty (no Bs), gpu (not Hopper), library
(tpfuse's library not loadable). The FP8 reduce-scatter's own: dtype (not e4m3 A and B), layout (a row-major
B), n_or_k (N not a multiple of 8, K of 16), scales (neither tensorwise nor rowwise, blockwise ones among them:
the op's schema cannot express them, though tpfuse.gemm_reduce_scatter takes them; not FP32, or on another device),
out_dtype (not BF16: None is A's dtype, FP8), bias (torch adds it to every rank's partial, P times in the
sum; tpfuse's kernels add a bias once), result_scale, shape (output_shape not the product's).

fused_all_gather_scaled_matmul (FP8 e4m3 A_shard and Bs; torch 2.7 and 2.15 define it alike, and the
override reads it by argument name, as the reduce-scatter) is torch's all-gather of A_shard along gather_dim,
then _scaled_mm of the gathered rows by each B with A_scale and that B's scale, bias, result_scale, out_dtype
and use_fast_accum; it returns (the gathered A, the products). tpfuse serves it as the BF16 all-gather: the
shard's token-major rows gathered as a whole, the outputs in torch's strides. It serves each B column-major (an
N x K weight), tensorwise scales (one element each: A_scale applies to every gathered row) or rowwise ones
(A_scale this rank's: A_shard's leading dimensions and 1, gathered with the rows; B_scale (1, N)), FP32, either
use_fast_accum, out_dtype torch.bfloat16, a BF16 bias of N entries (torch's _scaled_mm adds it to every row of
the product, and so do tpfuse's kernels) or none, and no result_scale. Each B is one fused call (later ones
gather A again, hidden behind their own GEMM; a rowwise A's gathered scales stay inside the kernel). Its own
fallback reasons: dtype (not e4m3 A and Bs), layout (a row-major B), n_or_k (N not a multiple of 8, K of 16),
alignment (a token-major A, a B or a bias), shape (a B whose K is not A's), scales (neither tensorwise nor this
rank's rowwise ones, blockwise ones among them, which the op's schema cannot express and tpfuse.all_gather_gemm
takes; a rowwise A_scale of every rank's rows (torch's replicated form), not FP32, or on another device),
out_dtype, bias (not BF16 of N entries), result_scale, arguments (lists of different lengths: torch's kernel
raises its error).
stats() counts the calls; is_overridden() says whether an override is on.
"""

import logging
import math
import threading
from collections import Counter
from typing import Dict, List, Optional, Tuple

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import E4M3, FP8_ROW_ALIGNMENT, MAX_WORLD_SIZE, POINTER_ALIGNMENT, ROW_ALIGNMENT, SLAB_ROWS
from ._library import library
from .errors import TpfuseError

logger = logging.getLogger("tpfuse.symm_mem")

# The symm_mem ops whose CUDA kernel the override replaces.
OPS = ("fused_matmul_reduce_scatter", "fused_all_gather_matmul", "fused_scaled_matmul_reduce_scatter",
       "fused_all_gather_scaled_matmul")

Fallback = Tuple[str, str]  # (reason, detail)

_counts = Counter()  # (op, "served" or a fallback reason) -> calls
_logged = set()      # (op, reason) already logged
_lock = threading.Lock()


def stats() -> Dict[str, dict]:
    """The calls of torch's symm_mem ops that reached the override so far, by op:
    {op: {"served": calls tpfuse ran, "fallbacks": {reason: calls passed to torch's kernel}}} for each
    op in OPS.

    Counted: every call that dispatches to the override's kernel while it is on (eager calls, and each
    run of a compiled graph's call, which is a Python call of the kernel). Not counted: replays of a
    captured CUDA graph (the kernels replay without Python), calls while the override is off, tpfuse's own
    functions and ops (tpfuse.gemm_reduce_scatter, ...), and tracing (fake tensors run torch's Meta
    implementation)."""
    with _lock:
        counts = dict(_counts)
    result = {}
    for op in OPS:
        fallbacks = {reason: calls for (name, reason), calls in counts.items() if name == op and reason != "served"}
        result[op] = {"served": counts.get((op, "served"), 0), "fallbacks": fallbacks}
    return result


def reset_stats() -> None:
    """Sets every count of stats() to zero (the log-once memory stays)."""
    with _lock:
        _counts.clear()


def _count(op: str, outcome: str) -> None:
    with _lock:
        _counts[(op, outcome)] += 1


def _fall_back(op: str, reason: str, detail: str) -> None:
    """Counts the call, and logs `detail` the first time `op` falls back for `reason`."""
    with _lock:
        _counts[(op, reason)] += 1
        if (op, reason) in _logged:
            return
        _logged.add((op, reason))
    logger.warning("tpfuse cannot serve this symm_mem.%s call (%s: %s): torch's own kernel runs it; further calls "
                   "of this op that fall back for this reason are not logged", op, reason, detail)


def _check_device(device: torch.device) -> Optional[Fallback]:
    """Why tpfuse cannot run on `device`, or None."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return "gpu", f"the GPU is sm_{major}{minor}, tpfuse's kernels need Hopper (sm_90)"
    try:
        library()
    except TpfuseError as error:
        return "library", f"tpfuse's library cannot be loaded: {error}"
    return None


_device_fallbacks = {}  # device -> _check_device(device): a process's GPUs and library do not change


def _device_fallback(device: torch.device) -> Optional[Fallback]:
    if device not in _device_fallbacks:
        _device_fallbacks[device] = _check_device(device)
    return _device_fallbacks[device]


def _operand_fallback(A: torch.Tensor, Bs: List[torch.Tensor], dim: int, dim_name: str,
                      group_size: int) -> Optional[Fallback]:
    """What the two ops have in common: the dimension, dtypes, the group, each B's layout and extents."""
    if A.dim() < 2 or not 0 <= dim < A.dim() - 1:
        return "dim", f"{dim_name} = {dim} of A {tuple(A.shape)}: tpfuse splits a dimension before A's last"
    for name, tensor in (("A", A), *((f"B[{i}]", B) for i, B in enumerate(Bs))):
        if tensor.dtype != torch.bfloat16:
            return "dtype", f"{name} is {tensor.dtype}; tpfuse takes BF16"
    if not 1 <= group_size <= MAX_WORLD_SIZE:
        return "group", f"the group has {group_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}"
    for i, B in enumerate(Bs):
        if B.dim() != 2 or not (B.is_contiguous() or B.t().is_contiguous()):
            return "layout", (f"B[{i}] {tuple(B.shape)} with strides {B.stride()} is neither a contiguous K x N "
                              "matrix nor the transpose view of a contiguous N x K weight")
        for extent, what in ((B.shape[1], "N"), (B.shape[0], "K")):
            if extent % ROW_ALIGNMENT != 0:
                return "n_or_k", f"B[{i}]'s {what} = {extent} is not a multiple of {ROW_ALIGNMENT}"
    return None


def _alignment_fallback(*named) -> Optional[Fallback]:
    for name, tensor in named:
        if tensor.data_ptr() % POINTER_ALIGNMENT != 0:
            return "alignment", f"{name}'s data is not {POINTER_ALIGNMENT}-byte aligned"
    return None


def _reduce_op_fallback(reduce_op: str) -> Optional[Fallback]:
    if reduce_op not in ("sum", "avg"):
        return "reduce_op", f"reduce_op = {reduce_op!r}; tpfuse reduces with 'sum' (and 'avg' as the sum / P)"
    return None


def matmul_reduce_scatter_fallback(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                   group_size: int) -> Optional[Fallback]:
    """Why tpfuse cannot serve this symm_mem.fused_matmul_reduce_scatter call (reason, detail), or None."""
    fallback = _reduce_op_fallback(reduce_op) or _operand_fallback(A, [B], scatter_dim, "scatter_dim", group_size)
    if fallback is not None:
        return fallback
    return _rows_fallback(A, scatter_dim, group_size) or _alignment_fallback(("A", A), ("B[0]", B)) or \
        _device_fallback(A.device)


def _rows_fallback(A: torch.Tensor, scatter_dim: int, group_size: int) -> Optional[Fallback]:
    """A's rows as the reduce-scatter takes them: its scattered extent divides over the group, and A is
    contiguous (the kernels' batch, in whole slabs) or token-major."""
    extent = A.shape[scatter_dim]
    if extent % group_size != 0:
        return "rows", f"A.shape[{scatter_dim}] = {extent} does not divide over the group's {group_size} ranks"
    if A.is_contiguous():
        batch, shard_rows = math.prod(A.shape[:scatter_dim]), math.prod(A.shape[scatter_dim:-1]) // group_size
        if batch > 1 and group_size > 1 and shard_rows % SLAB_ROWS != 0:
            return "shard", (f"A {tuple(A.shape)} is {batch} sequences whose share on each of the {group_size} ranks "
                             f"is {shard_rows} rows, not a multiple of {SLAB_ROWS} (the kernels' slab)")
    elif not A.movedim(scatter_dim, 0).is_contiguous():
        return "layout", (f"A {tuple(A.shape)} with strides {A.stride()} is neither contiguous nor contiguous with "
                          f"scatter_dim {scatter_dim} moved first")
    return None


def _arguments(op: str, args, kwargs) -> dict:
    """A call of symm_mem.<op> as {argument: value}, by the installed torch's schema (the dispatcher passes the
    arguments given, in the schema's order), defaults filled in."""
    return arguments_by_name(getattr(torch.ops.symm_mem, op).default._schema, args, kwargs)


def arguments_by_name(schema, args, kwargs) -> dict:
    """A call's arguments (positional ones in the schema's order) as {argument: value}, defaults filled in."""
    values = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(args):
            values[argument.name] = args[i]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        else:
            values[argument.name] = argument.default_value
    return values


def scaled_output_rows(values: dict) -> Tuple[Optional[Fallback], torch.Tensor, int]:
    """(fallback or None, A's rows in the shape of torch's output before the scatter, the scattered dimension).
    torch 2.7's schema passes A so (scatter_dim); the later one passes the matrix _scaled_mm multiplied (A
    reshaped to 2-D by Inductor), the output's shape and the output's dimension to scatter (orig_scatter_dim):
    the product's rows are A's rows in that shape."""
    A, B = values["A"], values["B"]
    if "scatter_dim" in values:
        return None, A, values["scatter_dim"]
    dim, output_shape = values["orig_scatter_dim"], values["output_shape"]
    if output_shape is None or A.dim() < 2 or B.dim() != 2:
        return None, A, dim
    leading = [int(extent) for extent in output_shape[:-1]]
    if len(output_shape) < 2 or output_shape[-1] != B.shape[1] or math.prod(leading) != math.prod(A.shape[:-1]):
        return ("shape", f"output_shape {list(output_shape)} is not the shape of the product of A {tuple(A.shape)} "
                         f"and B {tuple(B.shape)}"), A, dim
    if list(A.shape[:-1]) == leading:
        return None, A, dim
    if not A.is_contiguous():
        return ("layout", f"A {tuple(A.shape)} with strides {A.stride()} is not contiguous, and its rows are to be "
                          f"read in the output's shape {list(output_shape)}"), A, dim
    return None, A.view(*leading, A.shape[-1]), dim


def _scales_fallback(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor,
                     B_scale: torch.Tensor) -> Optional[Fallback]:
    """torch._scaled_mm's two scalings that tpfuse serves here: tensorwise (one element each) and rowwise (A_scale
    A's leading dimensions and 1, B_scale (1, N)); FP32 on A's device. Any other shapes fall back, blockwise ones
    too: the op cannot express them."""
    for name, scale in (("A_scale", A_scale), ("B_scale", B_scale)):
        if scale.dtype != torch.float32:
            return "scales", f"{name} is {scale.dtype}; tpfuse's scales are torch.float32"
        if scale.device != A.device:
            return "scales", f"{name} is on {scale.device}, A on {A.device}"
    if A_scale.numel() == 1 and B_scale.numel() == 1:
        return None
    rowwise = ((*A.shape[:-1], 1), (1, B.shape[1]))
    if (tuple(A_scale.shape), tuple(B_scale.shape)) != rowwise:
        return "scales", (f"A_scale {tuple(A_scale.shape)} and B_scale {tuple(B_scale.shape)} are neither one element "
                          f"each (tensorwise) nor rowwise: A_scale {rowwise[0]} and B_scale {rowwise[1]}")
    return None


def scaled_matmul_reduce_scatter_fallback(values: dict, group_size: int) -> Tuple[Optional[Fallback], torch.Tensor,
                                                                                   int]:
    """Why tpfuse cannot serve this symm_mem.fused_scaled_matmul_reduce_scatter call (values: its arguments by
    name), or None; and A's rows with the scattered dimension as scaled_output_rows gives them."""
    A, B = values["A"], values["B"]
    fallback = _reduce_op_fallback(values["reduce_op"])
    if fallback is None and values["bias"] is not None:
        fallback = "bias", ("torch adds the bias to every rank's partial product (P times in the sum); tpfuse's "
                            "kernels add a bias once, to the sum")
    if fallback is None and values["result_scale"] is not None:
        fallback = "result_scale", "result_scale is given; tpfuse takes none"
    if fallback is None and values["out_dtype"] != torch.bfloat16:
        out_dtype = values["out_dtype"]
        meaning = f" (A's dtype, {A.dtype})" if out_dtype is None else ""
        fallback = "out_dtype", f"out_dtype = {out_dtype}{meaning}; tpfuse's outputs are torch.bfloat16"
    if fallback is not None:
        return fallback, A, 0
    fallback, rows, dim = scaled_output_rows(values)
    if fallback is not None:
        return fallback, rows, dim
    return _scaled_operand_fallback(rows, B, values["A_scale"], values["B_scale"], dim, group_size, A), rows, dim


def _fp8_weight_fallback(name: str, B: torch.Tensor) -> Optional[Fallback]:
    """A K x N B as tpfuse's FP8 kernels take it: e4m3, column-major (an N x K weight), N a multiple of 8, K of 16."""
    if B.dtype != E4M3:
        return "dtype", f"{name} is {B.dtype}; tpfuse's FP8 kernels take {E4M3}"
    if B.dim() != 2 or not B.t().is_contiguous():
        return "layout", (f"{name} {tuple(B.shape)} with strides {B.stride()} is not column-major (the transpose view "
                          "of a contiguous N x K weight), the one layout of tpfuse's FP8 weights")
    n, k = B.shape[1], B.shape[0]
    if n % ROW_ALIGNMENT != 0:
        return "n_or_k", (f"{name}'s N = {n} is not a multiple of {ROW_ALIGNMENT} (BF16 output rows of whole 16 "
                          "bytes)")
    if k % FP8_ROW_ALIGNMENT != 0:
        return "n_or_k", f"{name}'s K = {k} is not a multiple of {FP8_ROW_ALIGNMENT} (FP8 rows of whole 16 bytes)"
    return None


def _scaled_operand_fallback(rows: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                             dim: int, group_size: int, A: torch.Tensor) -> Optional[Fallback]:
    if rows.dim() < 2 or not 0 <= dim < rows.dim() - 1:
        return "dim", f"scatter dimension {dim} of A {tuple(rows.shape)}: tpfuse splits a dimension before A's last"
    for name, tensor in (("A", A), ("B", B)):
        if tensor.dtype != E4M3:
            return "dtype", f"{name} is {tensor.dtype}; tpfuse's FP8 kernels take {E4M3}"
    if not 1 <= group_size <= MAX_WORLD_SIZE:
        return "group", f"the group has {group_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}"
    return _fp8_weight_fallback("B", B) or _scales_fallback(A, B, A_scale, B_scale) or _rows_fallback(rows, dim, group_size) or \
        _alignment_fallback(("A", rows), ("B", B)) or _device_fallback(A.device)


def all_gather_matmul_fallback(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int,
                               group_size: int) -> Optional[Fallback]:
    """Why tpfuse cannot serve this symm_mem.fused_all_gather_matmul call (reason, detail), or None."""
    if len(Bs) == 0:
        return "empty", "Bs is empty"
    fallback = _operand_fallback(A, list(Bs), gather_dim, "gather_dim", group_size)
    if fallback is not None:
        return fallback
    # A shard that is not token-major is copied (aligned); the Bs are used in place.
    tokens_in_place = A.movedim(gather_dim, 0).is_contiguous()
    named = [(f"B[{i}]", B) for i, B in enumerate(Bs)]
    return _alignment_fallback(*([("A", A)] if tokens_in_place else []), *named) or _device_fallback(A.device)


def symmetric_memory_module():
    """torch.distributed._symmetric_memory (imported at the first call: it defines the symm_mem ops)."""
    import torch.distributed._symmetric_memory as symmetric_memory
    return symmetric_memory


def _torch_kernel(name: str):
    """torch's own CUDA kernel of symm_mem::<name>, looked up at the call."""
    return getattr(symmetric_memory_module(), f"_{name}")


def _fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                 group_name: str) -> torch.Tensor:
    op = "fused_matmul_reduce_scatter"
    group_size = _resolve_process_group(group_name).size()
    fallback = matmul_reduce_scatter_fallback(A, B, reduce_op, scatter_dim, group_size)
    if fallback is not None:
        _fall_back(op, *fallback)
        return _torch_kernel(op)(A, B, reduce_op, scatter_dim, group_name)
    _count(op, "served")
    if A.is_contiguous():
        # Each sequence's rows one after the other: the kernels' batch, whose result is contiguous, as torch's.
        out = torch.ops.tpfuse.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim, group_name)
    else:
        # Token-major (Inductor's layout): this rank's tokens are one block of rows, whose copy in the
        # result's order is torch's contiguous result.
        tokens = torch.ops.tpfuse.fused_matmul_reduce_scatter(A.movedim(scatter_dim, 0), B, "sum", 0, group_name)
        out = tokens.movedim(0, scatter_dim).contiguous()
    if reduce_op == "avg":
        # P is 1, 2, 4 or 8: dividing the BF16 sum by it only shifts the exponent, so this is the average
        # rounded once (short of BF16's subnormals).
        out.div_(group_size)
    return out


def _fused_all_gather_matmul(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str, *,
                             return_A: bool = True):
    op = "fused_all_gather_matmul"
    fallback = all_gather_matmul_fallback(A, Bs, gather_dim, _resolve_process_group(group_name).size())
    if fallback is not None:
        _fall_back(op, *fallback)
        return _torch_kernel(op)(A, Bs, gather_dim, group_name, return_A=return_A)
    _count(op, "served")
    # torch's outputs are A.movedim(gather_dim, 0) gathered, moved back: the shard's token-major rows gathered
    # as a whole give them (Inductor's pass lays the shard out so; another layout is copied once). Several Bs
    # (SwiGLU's gate and up) share the one gather: the first is fused, the others use it.
    tokens = A.movedim(gather_dim, 0).contiguous()
    gathered, outs = torch.ops.tpfuse.fused_all_gather_matmul(tokens, Bs, 0, group_name, return_A=return_A)
    return (None if gathered is None else gathered.movedim(0, gather_dim)), [out.movedim(0, gather_dim) for out in outs]


def _fused_scaled_matmul_reduce_scatter(*args, **kwargs) -> torch.Tensor:
    op = "fused_scaled_matmul_reduce_scatter"
    values = _arguments(op, args, kwargs)
    group_name = values["group_name"]
    group_size = _resolve_process_group(group_name).size()
    fallback, rows, dim = scaled_matmul_reduce_scatter_fallback(values, group_size)
    if fallback is not None:
        _fall_back(op, *fallback)
        return _torch_kernel(op)(*args, **kwargs)
    _count(op, "served")
    B, a_scale, w_scale = values["B"], values["A_scale"], values["B_scale"]
    # As the BF16 op: a contiguous A is the kernels' batch; a token-major one is reduce-scattered as a whole,
    # and this rank's tokens are copied into torch's contiguous result.
    token_major = not rows.is_contiguous()
    ordered = rows.movedim(dim, 0) if token_major else rows
    if a_scale.numel() > 1 or w_scale.numel() > 1:
        # Rowwise: one scale per row of A in the order its rows are read, one per column of B.
        row_scales = a_scale.reshape(*rows.shape[:-1], 1)
        a_scale = (row_scales.movedim(dim, 0) if token_major else row_scales).reshape(-1).contiguous()
        w_scale = w_scale.reshape(-1).contiguous()
    shape = [*ordered.shape[:-1], B.shape[1]]
    shape[0 if token_major else dim] //= group_size
    out = torch.ops.tpfuse.gemm_reduce_scatter(ordered.reshape(-1, ordered.shape[-1]), B.t(), "nk", group_name, None,
                                               1 if token_major else math.prod(rows.shape[:dim]), a_scale, w_scale,
                                               values["use_fast_accum"]).view(shape)
    if token_major:
        out = out.movedim(0, dim).contiguous()
    if values["reduce_op"] == "avg":
        out.div_(group_size)  # exact: P is a power of 2, as for the BF16 op
    return out


def _is_shard_rowwise(A: torch.Tensor, A_scale: torch.Tensor) -> bool:
    """Whether A_scale holds one scale per row of this rank's A (torch's row-wise sharded mode; torch tests it
    before the tensorwise one, so a shard of one row with one scale is rowwise)."""
    return A_scale.dim() == A.dim() and A_scale.shape[:-1] == A.shape[:-1] and A_scale.shape[-1] == 1


def _scaled_all_gather_weight_fallback(i: int, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor,
                                       B_scale: torch.Tensor, bias: Optional[torch.Tensor],
                                       result_scale: Optional[torch.Tensor], out_dtype) -> Optional[Fallback]:
    """Why tpfuse cannot multiply the gathered A by Bs[i] as torch._scaled_mm would, or None."""
    fallback = _fp8_weight_fallback(f"B[{i}]", B)
    if fallback is not None:
        return fallback
    k, n = B.shape
    if k != A.shape[-1]:
        return "shape", f"B[{i}] {tuple(B.shape)} is K x N for K = {k}, and A's rows have {A.shape[-1]} elements"
    if result_scale is not None:
        return "result_scale", f"result_scales[{i}] is given; tpfuse takes none"
    if out_dtype != torch.bfloat16:
        meaning = f" (A's dtype, {A.dtype})" if out_dtype is None else ""
        return "out_dtype", f"out_dtypes[{i}] = {out_dtype}{meaning}; tpfuse's outputs are torch.bfloat16"
    if bias is not None and (bias.dtype != torch.bfloat16 or tuple(bias.shape) != (n,) or not bias.is_contiguous()
                             or bias.device != A.device):
        return "bias", (f"biases[{i}] {tuple(bias.shape)} of {bias.dtype} on {bias.device}: tpfuse adds a contiguous "
                        f"torch.bfloat16 bias of N = {n} entries on A's device")
    if B_scale.dtype != torch.float32 or B_scale.device != A.device:
        return "scales", f"B_scales[{i}] is {B_scale.dtype} on {B_scale.device}; tpfuse's scales are torch.float32 " \
                         f"on A's device ({A.device})"
    if _is_shard_rowwise(A, A_scale):
        if tuple(B_scale.shape) != (1, n):
            return "scales", (f"A_scale {tuple(A_scale.shape)} is rowwise, and B_scales[{i}] {tuple(B_scale.shape)} "
                              f"is not (1, {n}), one per output column")
    elif B_scale.numel() != 1:
        return "scales", (f"A_scale {tuple(A_scale.shape)} is one element (tensorwise), and B_scales[{i}] "
                          f"{tuple(B_scale.shape)} is not")
    return _alignment_fallback((f"B[{i}]", B), *(((f"biases[{i}]", bias),) if bias is not None else ()))


def all_gather_scaled_matmul_fallback(values: dict, group_size: int) -> Optional[Fallback]:
    """Why tpfuse cannot serve this symm_mem.fused_all_gather_scaled_matmul call (values: its arguments by name),
    or None."""
    A, Bs, A_scale, gather_dim = values["A"], values["Bs"], values["A_scale"], values["gather_dim"]
    lists = {name: values[name] for name in ("B_scales", "biases", "result_scales", "out_dtypes", "use_fast_accum")}
    if len(Bs) == 0:
        return "empty", "Bs is empty"
    if any(len(entries) != len(Bs) for entries in lists.values()):
        return "arguments", ", ".join(f"{len(entries)} {name}" for name, entries in lists.items()) + \
            f" for {len(Bs)} Bs"
    if A.dim() < 2 or not 0 <= gather_dim < A.dim() - 1:
        return "dim", f"gather_dim = {gather_dim} of A {tuple(A.shape)}: tpfuse splits a dimension before A's last"
    if A.dtype != E4M3:
        return "dtype", f"A is {A.dtype}; tpfuse's FP8 kernels take {E4M3}"
    if not 1 <= group_size <= MAX_WORLD_SIZE:
        return "group", f"the group has {group_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}"
    if A_scale.dtype != torch.float32 or A_scale.device != A.device:
        return "scales", f"A_scale is {A_scale.dtype} on {A_scale.device}; tpfuse's scales are torch.float32 on " \
                         f"A's device ({A.device})"
    if not _is_shard_rowwise(A, A_scale) and A_scale.numel() != 1:
        return "scales", (f"A_scale {tuple(A_scale.shape)} is neither one element (tensorwise) nor this rank's "
                          f"rowwise scales {(*A.shape[:-1], 1)} (a rowwise A_scale of every rank's rows is torch's "
                          "replicated form)")
    out_dtypes = symmetric_memory_module()._maybe_convert_scalar_types_to_dtypes(lists["out_dtypes"])
    for i, weight in enumerate(zip(Bs, lists["B_scales"], lists["biases"], lists["result_scales"], out_dtypes)):
        fallback = _scaled_all_gather_weight_fallback(i, A, weight[0], A_scale, *weight[1:])
        if fallback is not None:
            return fallback
    # A shard that is not token-major is copied (aligned); the Bs are used in place.
    tokens_in_place = A.movedim(gather_dim, 0).is_contiguous()
    return _alignment_fallback(*([("A", A)] if tokens_in_place else [])) or _device_fallback(A.device)


def _fused_all_gather_scaled_matmul(*args, **kwargs):
    op = "fused_all_gather_scaled_matmul"
    values = _arguments(op, args, kwargs)
    group_name = values["group_name"]
    fallback = all_gather_scaled_matmul_fallback(values, _resolve_process_group(group_name).size())
    if fallback is not None:
        _fall_back(op, *fallback)
        return _torch_kernel(op)(*args, **kwargs)
    _count(op, "served")
    A, A_scale, gather_dim = values["A"], values["A_scale"], values["gather_dim"]
    # As the BF16 op: the shard's token-major rows gathered as a whole give torch's outputs moved back; a rowwise
    # A_scale's rows move with A's.
    tokens = A.movedim(gather_dim, 0).contiguous()
    rowwise = _is_shard_rowwise(A, A_scale)
    x_scale = A_scale.movedim(gather_dim, 0).reshape(-1).contiguous() if rowwise else A_scale
    gathered_shape = [tokens.shape[0] * _resolve_process_group(group_name).size(), *tokens.shape[1:]]
    x = tokens.view(-1, tokens.shape[-1])
    gathered, outs = None, []
    for B, B_scale, bias, fast_accum in zip(values["Bs"], values["B_scales"], values["biases"],
                                           values["use_fast_accum"]):
        w_scale = B_scale.reshape(-1) if rowwise else B_scale
        if gathered is None:
            y, gathered = torch.ops.tpfuse.all_gather_gemm_gathered(x, B.t(), "nk", group_name, bias, 1, x_scale,
                                                                    w_scale, fast_accum)
        else:
            y = torch.ops.tpfuse.all_gather_gemm(x, B.t(), "nk", group_name, bias, 1, x_scale, w_scale, fast_accum)
        outs.append(y.view(*gathered_shape[:-1], B.shape[1]).movedim(0, gather_dim))
    return gathered.view(gathered_shape).movedim(0, gather_dim), outs


_KERNELS = {"fused_matmul_reduce_scatter": _fused_matmul_reduce_scatter,
            "fused_all_gather_matmul": _fused_all_gather_matmul,
            "fused_scaled_matmul_reduce_scatter": _fused_scaled_matmul_reduce_scatter,
            "fused_all_gather_scaled_matmul": _fused_all_gather_scaled_matmul}


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


def is_overridden(dispatch_key: str = "CUDA") -> bool:
    """Whether an override on `dispatch_key` is active now: calls of torch's symm_mem ops there reach tpfuse."""
    with SymmMemOverride._lock:
        return dispatch_key in SymmMemOverride._active


def use_for_symm_mem() -> SymmMemOverride:
    """Makes tpfuse the CUDA kernel of torch.ops.symm_mem.fused_matmul_reduce_scatter, fused_all_gather_matmul
    and their FP8 forms fused_scaled_matmul_reduce_scatter and fused_all_gather_scaled_matmul (falling back to
    torch's kernel, logged once per (op, reason), where it cannot serve a call). tpfuse.stats() counts the calls.
    Returns the override: call .restore() to give the ops back to torch, or use it in a `with`."""
    return SymmMemOverride("CUDA")
