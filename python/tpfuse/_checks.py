"""Argument checks, made on the tensors' metadata before anything is launched, so they hold for fake
(meta) tensors under torch.compile too. The C++ library checks again; these give the message in
the caller's terms (tensor names, weight_layout)."""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ._library import ACCUMULATION_CODES, DTYPE_CODES, SCALING_CODES, WEIGHT_LAYOUT_CODES
from .errors import InvalidArgumentError, UnsupportedError

MAX_WORLD_SIZE = 8       # tpfuse::kMaxWorldSize: the ranks of one NVLink node
ROW_ALIGNMENT = 8        # BF16 rows must be whole 16-byte units
FP8_ROW_ALIGNMENT = 16   # and E4M3 rows too
POINTER_ALIGNMENT = 16   # bytes
SCALE_ALIGNMENT = 4      # bytes: the scales are FP32
MAX_EXTENT = 2**31 - 1   # the kernels index with 32 bits
SLAB_ROWS = 64           # the kernels' slab: with batch > 1 and P > 1, a rank's rows of a sequence are whole slabs
SCALE_BLOCK = 128        # tpfuse::kScaleBlock: the K extent of a blockwise scale, and the N extent of a weight's

BF16_CODE = DTYPE_CODES[torch.bfloat16]  # the C ABI's dtype of BF16 inputs
E4M3 = torch.float8_e4m3fn               # the FP8 inputs both ops serve
NO_SCALING = SCALING_CODES["none"]
ROWWISE = SCALING_CODES["rowwise"]
BLOCKWISE = SCALING_CODES["blockwise"]
PROMOTED = ACCUMULATION_CODES["promoted"]

_WEIGHT_SHAPES = {"nk": "N x K/P (nn.Linear's weight)", "kn": "K/P x N"}
_AG_WEIGHT_SHAPES = {"nk": "N/P x K (nn.Linear's weight)", "kn": "K x N/P"}


@dataclass(frozen=True)
class _OperandNames:
    """How an op's messages name its activations, their scale, their rows, the output columns and the reduction
    dimension."""

    operand: str
    scale: str
    rows: str
    columns: str
    depth: str


_RS_NAMES = _OperandNames("a", "a_scale", "M", "N", "K/P")
_AG_NAMES = _OperandNames("x", "x_scale", "M/P", "N/P", "K")


@dataclass(frozen=True)
class Problem:
    """One rank's reduce-scatter call: a is m x k_per_rank, `batch` sequences of m/batch rows one after the
    other; out is this rank's m/world_size x n rows: its 1/world_size of every sequence, sequence after
    sequence (batch 1: the rows split as a whole)."""

    m: int
    n: int
    k_per_rank: int
    world_size: int
    weight_layout: str
    batch: int = 1
    dtype_code: int = BF16_CODE      # the C ABI's code of a's and w's dtype (DTYPE_CODES)
    scaling: int = NO_SCALING        # FP8: how a_scale and w_scale apply (SCALING_CODES)
    accumulation: int = PROMOTED     # FP8: ACCUMULATION_CODES (use_fast_accum: fast)

    @property
    def rows_per_rank(self) -> int:
        return self.m // self.world_size

    @property
    def layout_code(self) -> int:
        return WEIGHT_LAYOUT_CODES[self.weight_layout]


@dataclass(frozen=True)
class AllGatherProblem:
    """One rank's all-gather call: x is this rank's m/world_size x k rows (its shard of each of `batch`
    sequences, sequence after sequence); y is m x n_per_rank, every sequence's rows gathered in rank order."""

    m: int
    n_per_rank: int
    k: int
    world_size: int
    weight_layout: str
    batch: int = 1
    dtype_code: int = BF16_CODE      # the C ABI's code of x's and w's dtype (DTYPE_CODES)
    scaling: int = NO_SCALING        # FP8: how x_scale and w_scale apply (SCALING_CODES)
    accumulation: int = PROMOTED     # FP8: ACCUMULATION_CODES (use_fast_accum: fast)


def _fail(message: str) -> None:
    raise InvalidArgumentError(message)


def _check_layout_and_group(weight_layout: str, world_size: int, weight_shapes: dict) -> None:
    if weight_layout not in WEIGHT_LAYOUT_CODES:
        _fail(f"weight_layout = {weight_layout!r} must be 'nk' (w is {weight_shapes['nk'].split(' (')[0]}, "
              f"nn.Linear's weight) or 'kn' (w is {weight_shapes['kn']})")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        _fail(f"the group has {world_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}")


def is_fp8(dtype: torch.dtype) -> bool:
    """Any of torch's 8-bit floating-point types (e4m3fn, e5m2, their fnuz variants, e8m0fnu)."""
    return dtype.is_floating_point and dtype.itemsize == 1


def _check_dimensions(named) -> None:
    for name, tensor in named:
        if tensor is not None and tensor.dim() != 2:
            _fail(f"{name} has {tensor.dim()} dimensions {tuple(tensor.shape)}; it must be a matrix")


def _check_operands(operand: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor], names: _OperandNames) -> int:
    """An op's activations (a or x) and w, both BF16 or both E4M3, and its BF16 out; returns the C ABI's code of
    the inputs' dtype. Another FP8 type (e5m2, ...) raises UnsupportedError."""
    for name, tensor in ((names.operand, operand), ("w", w)):
        if is_fp8(tensor.dtype) and tensor.dtype != E4M3:
            raise UnsupportedError(f"{name} has dtype {tensor.dtype}: tpfuse's FP8 inputs are {E4M3} only")
        if tensor.dtype not in (torch.bfloat16, E4M3):
            _fail(f"{name} has dtype {tensor.dtype}; tpfuse takes torch.bfloat16, or {E4M3} with scales "
                  f"({names.scale}, w_scale), and returns torch.bfloat16")
    if operand.dtype != w.dtype:
        _fail(f"{names.operand} has dtype {operand.dtype} and w {w.dtype}: both must be torch.bfloat16, or both "
              f"{E4M3}")
    if out is not None and out.dtype != torch.bfloat16:
        _fail(f"out has dtype {out.dtype}; tpfuse returns torch.bfloat16")
    _check_dimensions(((names.operand, operand), ("w", w), ("out", out)))
    return DTYPE_CODES[operand.dtype]


def _check_scale(name: str, scale: torch.Tensor) -> None:
    if scale.dtype != torch.float32:
        _fail(f"{name} has dtype {scale.dtype}; scales are torch.float32")
    if not scale.is_contiguous():
        _fail(f"{name} {tuple(scale.shape)} with strides {scale.stride()} is not contiguous")


def blockwise_scale_shapes(m: int, n: int, k: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """The shapes of blockwise scales for m x k activations and an n x k weight: one per row and 128 of K, and one
    per 128 x 128 block of the weight (a partial block where n or k is not a multiple of 128)."""
    k_blocks = -(-k // SCALE_BLOCK)
    return (m, k_blocks), (-(-n // SCALE_BLOCK), k_blocks)


def _check_scales(a_scale: Optional[torch.Tensor], w_scale: Optional[torch.Tensor], fp8: bool, m: int, n: int,
                  k: int, names: _OperandNames, form: Optional[int] = None) -> int:
    """The scaling (SCALING_CODES) of the activations' scale (a_scale or x_scale, `names.scale`) and w_scale:
    none for BF16 inputs. For E4M3 inputs the pair of shapes decides, in this order: one element each is
    tensorwise; a_scale one per row of the m rows of a or x and w_scale one per output column of the n is
    rowwise; either scale of its blockwise shape (2-D: a_scale (m, k/128), one per row and 128 of K; w_scale
    (ceil(n/128), k/128), one per 128 x 128 block of w) and not of its rowwise one is blockwise. No pair is
    both rowwise and blockwise: a blockwise w_scale has ceil(n/128) < n rows, so it is of a rowwise shape only as
    (1, n) where k/128 = n > 1, and a_scale then has n > 1 columns. Blockwise scales of one element each (m = 1,
    n and k at most 128) are tensorwise: in the reduce-scatter the same product; in the all-gather, this rank's
    x_scale then applies to every gathered row. `form`, where the activations' scales were made in a known one
    (quantize_all_gather_gemm's x_scale), decides instead, and w_scale must have that form's shape."""
    a_name, operands = names.scale, f"{names.operand} and w"
    if not fp8:
        for name, scale in ((a_name, a_scale), ("w_scale", w_scale)):
            if scale is not None:
                _fail(f"{name} is given, but {operands} are torch.bfloat16: scales are for {E4M3} inputs only")
        return NO_SCALING
    missing = [name for name, scale in ((a_name, a_scale), ("w_scale", w_scale)) if scale is None]
    if missing:
        _fail(f"{operands} are {E4M3}: they need {' and '.join(missing)} (torch.float32: one element each for "
              f"tensorwise scaling, {a_name} ({names.rows}, 1) and w_scale (1, {names.columns}) for rowwise, or "
              f"{a_name} ({names.rows}, {names.depth}/128) and w_scale (ceil({names.columns}/128), "
              f"{names.depth}/128) for blockwise)")
    _check_scale(a_name, a_scale)
    _check_scale("w_scale", w_scale)
    a_shape, w_shape = tuple(a_scale.shape), tuple(w_scale.shape)
    rowwise_a, rowwise_w = a_shape in ((m, 1), (m,)), w_shape in ((1, n), (n, 1), (n,))
    block_a, block_w = blockwise_scale_shapes(m, n, k)
    if form == BLOCKWISE:
        _check_blockwise_shapes(a_shape, w_shape, block_a, block_w, names)
        return BLOCKWISE
    if form == ROWWISE and not rowwise_w:
        _fail(f"w_scale has shape {w_shape}; with rowwise {a_name} {a_shape} it must be (1, {n}), ({n}, 1) or "
              f"({n},), one per output column ({names.columns})")
    if form is not None:
        return form
    if a_scale.numel() == 1 and w_scale.numel() == 1:
        return SCALING_CODES["tensorwise"]
    if rowwise_a and rowwise_w:
        return ROWWISE
    if a_shape == block_a and not rowwise_a or w_shape == block_w and not rowwise_w:
        _check_blockwise_shapes(a_shape, w_shape, block_a, block_w, names)
        return BLOCKWISE
    rowwise = f"rowwise scaling (tensorwise takes one element in each of {a_name} and w_scale)"
    if not rowwise_a:
        _fail(f"{a_name} has shape {a_shape}; with w_scale of {w_scale.numel()} elements it must be "
              f"({m}, 1) or ({m},), one per row of {names.operand} ({names.rows}): {rowwise}")
    _fail(f"w_scale has shape {w_shape}; with {a_name} of {a_scale.numel()} elements it must be "
          f"(1, {n}), ({n}, 1) or ({n},), one per output column ({names.columns}): {rowwise}")


def _check_blockwise_shapes(a_shape, w_shape, block_a, block_w, names: _OperandNames) -> None:
    """Blockwise scales: w_scale and a_scale (or x_scale) each of its blockwise shape."""
    a_name = names.scale
    if w_shape != block_w:
        _fail(f"w_scale has shape {w_shape}; with {a_name} {a_shape} (blockwise: one per row of {names.operand} and "
              f"128 of {names.depth}) it must be {block_w}, one per 128 x 128 block of w "
              f"(ceil({names.columns}/128) x {names.depth}/128)")
    if a_shape != block_a:
        _fail(f"{a_name} has shape {a_shape}; with w_scale {w_shape} (blockwise: one per 128 x 128 block of w) it must "
              f"be {block_a}, one per row of {names.operand} ({names.rows}) and 128 of {names.depth}")


def _check_blockwise(k: int, use_fast_accum: bool, names: _OperandNames) -> None:
    """Blockwise scales apply where each 128 of K is added into the FP32 sums: whole blocks, promoted."""
    if k % SCALE_BLOCK != 0:
        _fail(f"{names.depth} = {k} is not a multiple of {SCALE_BLOCK}: blockwise scales ({names.scale} "
              f"({names.rows}, {names.depth}/128), w_scale (ceil({names.columns}/128), {names.depth}/128)) cover "
              f"{SCALE_BLOCK} of {names.depth} each")
    if use_fast_accum:
        _fail("use_fast_accum=True with blockwise scales: they apply where each 128 of "
              f"{names.depth} is added into the FP32 sums (promoted accumulation), so use_fast_accum must be False")


def check_fast_accum(use_fast_accum: bool) -> None:
    """A flag: torch's dispatcher would refuse another type with its own error."""
    if not isinstance(use_fast_accum, bool):
        _fail(f"use_fast_accum = {use_fast_accum!r} must be True or False")


def _weight_columns(w: torch.Tensor, weight_layout: str, name: str, operand: torch.Tensor, operand_shape: str,
                    k_name: str, weight_shapes: dict) -> int:
    """The output columns of w, whose reduction dimension must be the operand's columns."""
    n, w_k = (w.shape[0], w.shape[1]) if weight_layout == "nk" else (w.shape[1], w.shape[0])
    k = operand.shape[1]
    if w_k != k:
        _fail(f"w {tuple(w.shape)} is not {weight_shapes[weight_layout]} for {name} {tuple(operand.shape)} "
              f"({operand_shape}): its {k_name} is {w_k}, {name}'s is {k} (weight_layout = {weight_layout!r})")
    return n


def _check_operands_contiguous(name: str, operand: torch.Tensor, operand_shape: str, w: torch.Tensor,
                               weight_layout: str, weight_shapes: dict) -> None:
    if not operand.is_contiguous():
        _fail(f"{name} {tuple(operand.shape)} with strides {operand.stride()} is not contiguous "
              f"(row-major {operand_shape})")
    if not w.is_contiguous():
        hint = " (for the transpose of an nn.Linear weight, pass the weight itself with weight_layout='nk')" \
            if weight_layout == "kn" and w.t().is_contiguous() else ""
        _fail(f"w {tuple(w.shape)} with strides {w.stride()} is not a contiguous {weight_shapes[weight_layout]} "
              f"matrix{hint}")


def _check_extents(extents, multiples_of_8, multiples_of_16=()) -> None:
    """Extents in range; those of BF16 rows multiples of 8 elements, those of E4M3 rows of 16 (whole 16 bytes)."""
    for name, extent in extents:
        if extent <= 0 or extent > MAX_EXTENT:
            _fail(f"{name} = {extent} must be in 1..{MAX_EXTENT}")
    for name, extent in multiples_of_8:
        if extent % ROW_ALIGNMENT != 0:
            _fail(f"{name} = {extent} is not a multiple of {ROW_ALIGNMENT} (BF16 rows must be multiples of 16 bytes)")
    for name, extent in multiples_of_16:
        if extent % FP8_ROW_ALIGNMENT != 0:
            _fail(f"{name} = {extent} is not a multiple of {FP8_ROW_ALIGNMENT} (FP8 rows must be multiples of 16 "
                  "bytes)")


def check_batch_count(batch: int) -> None:
    """A count of sequences: torch's dispatcher would refuse another type with its own error."""
    if isinstance(batch, bool) or not isinstance(batch, (int, torch.SymInt)) or batch < 1:
        _fail(f"batch = {batch!r} must be an integer of 1 or more (the number of sequences)")


def _check_shard_rows(batch: int, shard_rows: int, world_size: int) -> None:
    """Where batch > 1 and P > 1, a rank's rows of each sequence must be whole slabs: UnsupportedError
    (valid, but not served by the kernels)."""
    if batch > 1 and world_size > 1 and shard_rows % SLAB_ROWS != 0:
        raise UnsupportedError(
            f"batch = {batch}: each rank's share of a sequence is {shard_rows} rows; with batch > 1 tpfuse needs "
            f"a multiple of {SLAB_ROWS} rows (its kernels' slab)")


def _check_batch(batch: int, m: int, world_size: int) -> None:
    """a's m rows are `batch` sequences of equal length, each split evenly over the group."""
    check_batch_count(batch)
    if m % batch != 0:
        _fail(f"batch = {batch}: the M = {m} rows of a are not {batch} sequences of equal length")
    sequence_rows = m // batch
    if sequence_rows % world_size != 0:
        if batch == 1:
            _fail(f"M = {m} rows of a do not divide over the group's {world_size} ranks")
        _fail(f"batch = {batch}: each sequence has {sequence_rows} rows, which do not divide over the group's "
              f"{world_size} ranks")
    _check_shard_rows(batch, sequence_rows // world_size, world_size)


def _check_bias(bias: Optional[torch.Tensor], n: int, n_name: str) -> None:
    """None, or one BF16 entry per output column."""
    if bias is None:
        return
    if bias.dtype != torch.bfloat16:
        _fail(f"bias has dtype {bias.dtype}; tpfuse takes torch.bfloat16")
    if tuple(bias.shape) != (n,):
        _fail(f"bias has shape {tuple(bias.shape)}; it must be ({n},), one entry per output column ({n_name})")
    if not bias.is_contiguous():
        _fail(f"bias with strides {bias.stride()} is not contiguous")


def check_problem(a: torch.Tensor, w: torch.Tensor, weight_layout: str, world_size: int,
                  out: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, batch: int = 1,
                  a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                  use_fast_accum: bool = False) -> Problem:
    """The reduce-scatter's problem of a, w, out, bias, batch and, for E4M3 inputs, their scales (tensorwise,
    rowwise or blockwise) and accumulation, or an InvalidArgumentError naming the bad argument (UnsupportedError
    for an FP8 type other than E4M3, an FP8 weight stored K x N, and a batched shard that is not whole slabs)."""
    _check_layout_and_group(weight_layout, world_size, _WEIGHT_SHAPES)
    dtype_code = _check_operands(a, w, out, _RS_NAMES)
    fp8 = a.dtype == E4M3
    _check_fp8_layout(fp8, weight_layout, _WEIGHT_SHAPES)
    check_fast_accum(use_fast_accum)
    m, k_per_rank = a.shape
    n = _weight_columns(w, weight_layout, "a", a, "M x K/P", "K/P", _WEIGHT_SHAPES)
    _check_operands_contiguous("a", a, "M x K/P", w, weight_layout, _WEIGHT_SHAPES)
    # N counts BF16 output columns (and FP8 weight rows, whose length is K/P); K/P counts a's and w's row elements.
    k_rows = (("K/P", k_per_rank),)
    _check_extents((("M", m), ("N", n), ("K/P", k_per_rank)), (("N", n),) + (() if fp8 else k_rows),
                   k_rows if fp8 else ())
    scaling = _check_scales(a_scale, w_scale, fp8, m, n, k_per_rank, _RS_NAMES)
    if scaling == BLOCKWISE:
        _check_blockwise(k_per_rank, use_fast_accum, _RS_NAMES)
    _check_batch(batch, m, world_size)
    _check_bias(bias, n, "N")
    accumulation = ACCUMULATION_CODES["fast" if fp8 and use_fast_accum else "promoted"]
    problem = Problem(m, n, k_per_rank, world_size, weight_layout, batch, dtype_code, scaling, accumulation)
    if out is not None:
        if tuple(out.shape) != (problem.rows_per_rank, problem.n):
            _fail(f"out has shape {tuple(out.shape)}; this rank's rows are {problem.rows_per_rank} x {problem.n} "
                  f"(M/P x N)")
        if not out.is_contiguous():
            _fail(f"out with strides {out.stride()} is not contiguous")
    return problem


def _check_fp8_layout(fp8: bool, weight_layout: str, weight_shapes: dict) -> None:
    """FP8 weights are K-major (N x K, nn.Linear's), the one layout of the E4M3 kernels."""
    if fp8 and weight_layout != "nk":
        raise UnsupportedError(f"w: FP8 weights are {weight_shapes['nk']} only (weight_layout='nk'); "
                               f"weight_layout={weight_layout!r} is served for torch.bfloat16 inputs")


def check_all_gather_problem(x: torch.Tensor, w: torch.Tensor, weight_layout: str, world_size: int,
                             bias: Optional[torch.Tensor] = None, batch: int = 1,
                             x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                             use_fast_accum: bool = False, form: Optional[int] = None) -> AllGatherProblem:
    """The all-gather's problem of x, w, bias, batch and, for E4M3 inputs, their scales (tensorwise, rowwise or
    blockwise; `form` as _check_scales takes it) and accumulation, or an InvalidArgumentError naming the bad
    argument (UnsupportedError for an FP8 type other than E4M3, an FP8 weight stored K x N, and a batched shard
    that is not whole slabs). Rowwise and blockwise, x_scale holds this rank's rows' scales (the kernel gathers
    them with the rows)."""
    _check_layout_and_group(weight_layout, world_size, _AG_WEIGHT_SHAPES)
    dtype_code = _check_operands(x, w, None, _AG_NAMES)
    fp8 = x.dtype == E4M3
    _check_fp8_layout(fp8, weight_layout, _AG_WEIGHT_SHAPES)
    check_fast_accum(use_fast_accum)
    rows, k = x.shape
    n_per_rank = _weight_columns(w, weight_layout, "x", x, "M/P x K", "K", _AG_WEIGHT_SHAPES)
    _check_operands_contiguous("x", x, "M/P x K", w, weight_layout, _AG_WEIGHT_SHAPES)
    m = rows * world_size
    # N/P counts BF16 output columns (and FP8 weight rows, whose length is K); K counts x's and w's row elements.
    k_rows = (("K", k),)
    _check_extents((("M", m), ("N/P", n_per_rank), ("K", k)), (("N/P", n_per_rank),) + (() if fp8 else k_rows),
                   k_rows if fp8 else ())
    scaling = _check_scales(x_scale, w_scale, fp8, rows, n_per_rank, k, _AG_NAMES, form)
    if scaling == BLOCKWISE:
        _check_blockwise(k, use_fast_accum, _AG_NAMES)
    check_batch_count(batch)
    if rows % batch != 0:
        _fail(f"batch = {batch}: x's {rows} rows are not {batch} shards of equal length (this rank's rows of each "
              "sequence)")
    _check_shard_rows(batch, rows // batch, world_size)
    _check_bias(bias, n_per_rank, "N/P")
    accumulation = ACCUMULATION_CODES["fast" if fp8 and use_fast_accum else "promoted"]
    return AllGatherProblem(m, n_per_rank, k, world_size, weight_layout, batch, dtype_code, scaling, accumulation)


QUANTIZED_FORMS = ("rowwise", "blockwise")  # quantize_all_gather_gemm's scaling


def check_quantized_rows(x: torch.Tensor, scaling: str) -> None:
    """quantize_all_gather_gemm's x: BF16 rows to quantize, in one of QUANTIZED_FORMS (the rest is checked on their
    FP8 form)."""
    if scaling not in QUANTIZED_FORMS:
        _fail(f"scaling = {scaling!r} must be 'rowwise' (one power-of-2 scale per row, torchao's recipe) or "
              "'blockwise' (one scale per 1 x 128 tile, DeepSeek-V3's)")
    if x.dtype != torch.bfloat16:
        _fail(f"x has dtype {x.dtype}; quantize_all_gather_gemm quantizes torch.bfloat16 rows to {E4M3} (for FP8 x, "
              "call tpfuse.all_gather_gemm with x_scale)")
    _check_dimensions((("x", x),))


def _sharded_dim_batch(A: torch.Tensor, dim: int, dim_name: str) -> int:
    """The batch of A (..., K) split along dimension `dim`: the product of the dimensions before it (each
    sequence is A's rows from `dim` to the last but one)."""
    if not 0 <= dim < A.dim() - 1:
        _fail(f"{dim_name} = {dim}: tpfuse splits A {tuple(A.shape)} along one of its dimensions before the last "
              f"(0 to {A.dim() - 2})")
    return math.prod(A.shape[:dim])


def check_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                world_size: int) -> Tuple[torch.Tensor, torch.Tensor, str, int]:
    """symm_mem.fused_matmul_reduce_scatter's arguments as tpfuse's: a (M x K/P, a view of A), w and
    its weight_layout (B itself, or the nn.Linear weight that B is the transpose view of), and the batch
    that splits A's rows along scatter_dim. The op is a BF16 matmul: FP8 inputs take scales, which
    gemm_reduce_scatter has."""
    for name, tensor in (("A", A), ("B", B)):
        if is_fp8(tensor.dtype):
            _fail(f"{name} has dtype {tensor.dtype}: fused_matmul_reduce_scatter multiplies torch.bfloat16 matrices; "
                  f"for {E4M3} inputs call tpfuse.gemm_reduce_scatter with a_scale and w_scale")
    if reduce_op != "sum":
        _fail(f"reduce_op = {reduce_op!r}: tpfuse reduces with 'sum' only")
    if A.dim() < 2 or B.dim() != 2:
        _fail(f"A {tuple(A.shape)} must have 2 or more dimensions and B {tuple(B.shape)} 2")
    batch = _sharded_dim_batch(A, scatter_dim, "scatter_dim")
    if A.shape[scatter_dim] % world_size != 0:
        _fail(f"A.shape[{scatter_dim}] = {A.shape[scatter_dim]} does not divide over the group's {world_size} ranks")
    if not A.is_contiguous():
        _fail(f"A {tuple(A.shape)} with strides {A.stride()} is not contiguous")
    return A.view(-1, A.shape[-1]), *weight_of(B, "B"), batch


def weight_of(B: torch.Tensor, name: str) -> Tuple[torch.Tensor, str]:
    """A K x N operand of torch's symm_mem ops as tpfuse's w and weight_layout: B itself if stored so
    (kn), else the nn.Linear weight that B is the transpose view of (nk)."""
    if B.dim() == 2 and B.is_contiguous():
        return B, "kn"
    if B.dim() == 2 and B.t().is_contiguous():
        return B.t(), "nk"
    _fail(f"{name} {tuple(B.shape)} with strides {B.stride()} is neither a contiguous K x N matrix nor the "
          "transpose of a contiguous N x K one")


def check_fused_all_gather_matmul(A: torch.Tensor, Bs, gather_dim: int):
    """symm_mem.fused_all_gather_matmul's arguments as tpfuse's: x (the rows of A as a matrix), each B's w
    and weight_layout, and the batch that gathers A's rows along gather_dim. The op is a BF16 matmul: FP8
    inputs take scales, which all_gather_gemm has."""
    for name, tensor in (("A", A), *((f"Bs[{i}]", B) for i, B in enumerate(Bs))):
        if is_fp8(tensor.dtype):
            _fail(f"{name} has dtype {tensor.dtype}: fused_all_gather_matmul multiplies torch.bfloat16 matrices; "
                  f"for {E4M3} inputs call tpfuse.all_gather_gemm with x_scale and w_scale")
    if A.dim() < 2:
        _fail(f"A {tuple(A.shape)} must have 2 or more dimensions")
    batch = _sharded_dim_batch(A, gather_dim, "gather_dim")
    if not A.is_contiguous():
        _fail(f"A {tuple(A.shape)} with strides {A.stride()} is not contiguous")
    if len(Bs) == 0:
        _fail("Bs is empty: give one or more K x N weights")
    return A.view(-1, A.shape[-1]), [weight_of(B, f"Bs[{i}]") for i, B in enumerate(Bs)], batch


def check_placement(*named, scales=()) -> None:
    """Real tensors only, each (name, tensor), a None tensor skipped: 16-byte aligned data (the FP32 `scales`:
    4-byte), all on the first one's CUDA device."""
    named = [(name, tensor) for name, tensor in named if tensor is not None]
    scales = [(name, tensor) for name, tensor in scales if tensor is not None]
    for (name, tensor), alignment in [*((entry, POINTER_ALIGNMENT) for entry in named),
                                      *((entry, SCALE_ALIGNMENT) for entry in scales)]:
        if tensor.data_ptr() % alignment != 0:
            _fail(f"{name}'s data at 0x{tensor.data_ptr():x} is not {alignment}-byte aligned "
                  f"(a view at storage offset {tensor.storage_offset()})")
    first_name, first = named[0]
    for name, tensor in (*named, *scales):
        if tensor.device.type != "cuda":
            _fail(f"{name} is on {tensor.device}; tpfuse runs on CUDA devices")
        if tensor.device != first.device:
            _fail(f"{name} is on {tensor.device}, {first_name} on {first.device}: all tensors must be on one device")


# (weight_layout, world_size, a's shape, w's shape, batch, dtype, the scales' shapes, use_fast_accum) -> Problem,
# for contiguous a and w of one served dtype, and contiguous FP32 scales (or none)
_problems = {}
_MAX_CACHED = 4096
_F32 = torch.float32


def _plain_scale(scale: Optional[torch.Tensor]) -> bool:
    return scale is None or scale.dtype is _F32 and scale.is_contiguous()


def check_problem_cached(a: torch.Tensor, w: torch.Tensor, weight_layout: str, world_size: int,
                         out: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                         batch: int = 1, a_scale: Optional[torch.Tensor] = None,
                         w_scale: Optional[torch.Tensor] = None, use_fast_accum: bool = False) -> Problem:
    """check_problem, remembered per shape: its outcome (the problem with its dtype, scaling and accumulation
    codes) depends only on the shapes, dtypes, contiguity, layout, batch, world size, the scales' shapes and
    use_fast_accum, and the per-call part (out, bias) is checked each time."""
    dtype = a.dtype
    if dtype is not w.dtype or (dtype is not torch.bfloat16 and dtype is not E4M3) or not a.is_contiguous() or \
            not w.is_contiguous() or type(batch) is not int or type(use_fast_accum) is not bool or \
            not _plain_scale(a_scale) or not _plain_scale(w_scale):
        return check_problem(a, w, weight_layout, world_size, out, bias, batch, a_scale, w_scale, use_fast_accum)
    key = (weight_layout, world_size, a.shape, w.shape, batch, dtype, None if a_scale is None else a_scale.shape,
           None if w_scale is None else w_scale.shape, use_fast_accum)
    problem = _problems.get(key)
    if problem is None:
        problem = check_problem(a, w, weight_layout, world_size, batch=batch, a_scale=a_scale, w_scale=w_scale,
                                use_fast_accum=use_fast_accum)
        if len(_problems) >= _MAX_CACHED:
            _problems.clear()
        _problems[key] = problem
    if out is not None and (out.dtype is not torch.bfloat16 or out.shape != (problem.rows_per_rank, problem.n) or
                            not out.is_contiguous()) or \
            bias is not None and (bias.dtype is not torch.bfloat16 or bias.shape != (problem.n,) or
                                  not bias.is_contiguous()):
        check_problem(a, w, weight_layout, world_size, out, bias, batch, a_scale, w_scale, use_fast_accum)
    return problem
