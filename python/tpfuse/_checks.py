"""Argument checks, made on the tensors' metadata before anything is launched, so they hold for fake
(meta) tensors under torch.compile too. The C++ library checks again; these give the message in
the caller's terms (tensor names, weight_layout)."""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ._library import DTYPE_CODES, WEIGHT_LAYOUT_CODES
from .errors import InvalidArgumentError, UnsupportedError

MAX_WORLD_SIZE = 8       # tpfuse::kMaxWorldSize: the ranks of one NVLink node
ROW_ALIGNMENT = 8        # BF16 rows must be whole 16-byte units
POINTER_ALIGNMENT = 16   # bytes
MAX_EXTENT = 2**31 - 1   # the kernels index with 32 bits
SLAB_ROWS = 64           # the kernels' slab: with batch > 1 and P > 1, a rank's rows of a sequence are whole slabs

BF16_CODE = DTYPE_CODES[torch.bfloat16]  # the C ABI's dtype of BF16 inputs, the only ones served so far

_WEIGHT_SHAPES = {"nk": "N x K/P (nn.Linear's weight)", "kn": "K/P x N"}
_AG_WEIGHT_SHAPES = {"nk": "N/P x K (nn.Linear's weight)", "kn": "K x N/P"}


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
    dtype_code: int = BF16_CODE  # the C ABI's code of a's and w's dtype (DTYPE_CODES)

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
    dtype_code: int = BF16_CODE  # the C ABI's code of x's and w's dtype (DTYPE_CODES)


def _fail(message: str) -> None:
    raise InvalidArgumentError(message)


def _check_layout_and_group(weight_layout: str, world_size: int, weight_shapes: dict) -> None:
    if weight_layout not in WEIGHT_LAYOUT_CODES:
        _fail(f"weight_layout = {weight_layout!r} must be 'nk' (w is {weight_shapes['nk'].split(' (')[0]}, "
              f"nn.Linear's weight) or 'kn' (w is {weight_shapes['kn']})")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        _fail(f"the group has {world_size} ranks; tpfuse supports 1 to {MAX_WORLD_SIZE}")


def _check_matrices(inputs, outputs=()) -> int:
    """BF16 matrices, each (name, tensor) (an output of None is one not asked for); returns the C ABI's code
    of the inputs' dtype. FP8 inputs (e4m3, a dtype the C ABI names) raise UnsupportedError: no kernel
    serves them yet."""
    for name, tensor in inputs:
        if tensor.dtype == torch.float8_e4m3fn:
            raise UnsupportedError(f"{name} has dtype {tensor.dtype}: tpfuse does not serve FP8 inputs yet; it takes "
                                   "and returns torch.bfloat16")
    for name, tensor in (*inputs, *outputs):
        if tensor is not None and tensor.dtype != torch.bfloat16:
            _fail(f"{name} has dtype {tensor.dtype}; tpfuse takes and returns torch.bfloat16")
        if tensor is not None and tensor.dim() != 2:
            _fail(f"{name} has {tensor.dim()} dimensions {tuple(tensor.shape)}; it must be a matrix")
    return DTYPE_CODES[inputs[0][1].dtype]


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


def _check_extents(extents, multiples_of_8) -> None:
    for name, extent in extents:
        if extent <= 0 or extent > MAX_EXTENT:
            _fail(f"{name} = {extent} must be in 1..{MAX_EXTENT}")
    for name, extent in multiples_of_8:
        if extent % ROW_ALIGNMENT != 0:
            _fail(f"{name} = {extent} is not a multiple of {ROW_ALIGNMENT} (BF16 rows must be multiples of 16 bytes)")


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
                  out: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                  batch: int = 1) -> Problem:
    """The reduce-scatter's problem of a, w, out, bias and batch, or an InvalidArgumentError naming the bad
    argument (UnsupportedError for FP8 inputs and for a batched shard that is not whole slabs)."""
    _check_layout_and_group(weight_layout, world_size, _WEIGHT_SHAPES)
    dtype_code = _check_matrices((("a", a), ("w", w)), (("out", out),))
    m, k_per_rank = a.shape
    n = _weight_columns(w, weight_layout, "a", a, "M x K/P", "K/P", _WEIGHT_SHAPES)
    _check_operands_contiguous("a", a, "M x K/P", w, weight_layout, _WEIGHT_SHAPES)
    _check_extents((("M", m), ("N", n), ("K/P", k_per_rank)), (("N", n), ("K/P", k_per_rank)))
    _check_batch(batch, m, world_size)
    _check_bias(bias, n, "N")
    problem = Problem(m, n, k_per_rank, world_size, weight_layout, batch, dtype_code)
    if out is not None:
        if tuple(out.shape) != (problem.rows_per_rank, problem.n):
            _fail(f"out has shape {tuple(out.shape)}; this rank's rows are {problem.rows_per_rank} x {problem.n} "
                  f"(M/P x N)")
        if not out.is_contiguous():
            _fail(f"out with strides {out.stride()} is not contiguous")
    return problem


def check_all_gather_problem(x: torch.Tensor, w: torch.Tensor, weight_layout: str, world_size: int,
                             bias: Optional[torch.Tensor] = None, batch: int = 1) -> AllGatherProblem:
    """The all-gather's problem of x, w, bias and batch, or an InvalidArgumentError naming the bad argument
    (UnsupportedError for FP8 inputs and for a batched shard that is not whole slabs)."""
    _check_layout_and_group(weight_layout, world_size, _AG_WEIGHT_SHAPES)
    dtype_code = _check_matrices((("x", x), ("w", w)))
    rows, k = x.shape
    n_per_rank = _weight_columns(w, weight_layout, "x", x, "M/P x K", "K", _AG_WEIGHT_SHAPES)
    _check_operands_contiguous("x", x, "M/P x K", w, weight_layout, _AG_WEIGHT_SHAPES)
    m = rows * world_size
    _check_extents((("M", m), ("N/P", n_per_rank), ("K", k)), (("N/P", n_per_rank), ("K", k)))
    check_batch_count(batch)
    if rows % batch != 0:
        _fail(f"batch = {batch}: x's {rows} rows are not {batch} shards of equal length (this rank's rows of each "
              "sequence)")
    _check_shard_rows(batch, rows // batch, world_size)
    _check_bias(bias, n_per_rank, "N/P")
    return AllGatherProblem(m, n_per_rank, k, world_size, weight_layout, batch, dtype_code)


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
    that splits A's rows along scatter_dim."""
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
    and weight_layout, and the batch that gathers A's rows along gather_dim."""
    if A.dim() < 2:
        _fail(f"A {tuple(A.shape)} must have 2 or more dimensions")
    batch = _sharded_dim_batch(A, gather_dim, "gather_dim")
    if not A.is_contiguous():
        _fail(f"A {tuple(A.shape)} with strides {A.stride()} is not contiguous")
    if len(Bs) == 0:
        _fail("Bs is empty: give one or more K x N weights")
    return A.view(-1, A.shape[-1]), [weight_of(B, f"Bs[{i}]") for i, B in enumerate(Bs)], batch


def check_placement(*named) -> None:
    """Real tensors only, each (name, tensor), a None tensor skipped: 16-byte aligned data, all on the
    first one's CUDA device."""
    named = [(name, tensor) for name, tensor in named if tensor is not None]
    for name, tensor in named:
        if tensor.data_ptr() % POINTER_ALIGNMENT != 0:
            _fail(f"{name}'s data at 0x{tensor.data_ptr():x} is not {POINTER_ALIGNMENT}-byte aligned "
                  f"(a view at storage offset {tensor.storage_offset()})")
    first_name, first = named[0]
    for name, tensor in named:
        if tensor.device.type != "cuda":
            _fail(f"{name} is on {tensor.device}; tpfuse runs on CUDA devices")
        if tensor.device != first.device:
            _fail(f"{name} is on {tensor.device}, {first_name} on {first.device}: all tensors must be on one device")


_problems = {}  # (weight_layout, world_size, a's shape, w's shape, batch) -> Problem, for BF16 contiguous a and w
_MAX_CACHED = 4096


def check_problem_cached(a: torch.Tensor, w: torch.Tensor, weight_layout: str, world_size: int,
                         out: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                         batch: int = 1) -> Problem:
    """check_problem, remembered per shape: its outcome (the problem with its dtype code) depends only on the
    shapes, dtypes, contiguity, layout, batch and world size, and the per-call part (out, bias) is checked
    each time."""
    if a.dtype is not torch.bfloat16 or w.dtype is not torch.bfloat16 or not a.is_contiguous() or \
            not w.is_contiguous() or type(batch) is not int:
        return check_problem(a, w, weight_layout, world_size, out, bias, batch)
    key = (weight_layout, world_size, a.shape, w.shape, batch)
    problem = _problems.get(key)
    if problem is None:
        problem = check_problem(a, w, weight_layout, world_size, batch=batch)
        if len(_problems) >= _MAX_CACHED:
            _problems.clear()
        _problems[key] = problem
    if out is not None and (out.dtype is not torch.bfloat16 or out.shape != (problem.rows_per_rank, problem.n) or
                            not out.is_contiguous()) or \
            bias is not None and (bias.dtype is not torch.bfloat16 or bias.shape != (problem.n,) or
                                  not bias.is_contiguous()):
        check_problem(a, w, weight_layout, world_size, out, bias, batch)
    return problem
