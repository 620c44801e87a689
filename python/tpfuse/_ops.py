"""The torch custom ops: tpfuse::gemm_reduce_scatter (returns this rank's rows),
tpfuse::gemm_reduce_scatter_out (writes them into `out`), tpfuse::fused_matmul_reduce_scatter
(the schema of symm_mem::fused_matmul_reduce_scatter), and the all-gather's tpfuse::all_gather_gemm
(returns Y), tpfuse::all_gather_gemm_gathered (Y and the gathered X) and
tpfuse::fused_all_gather_matmul (the schema of symm_mem::fused_all_gather_matmul). All but the drop-ins
take an optional bias (added before the output's one rounding) and a batch: a's rows are `batch`
sequences, and each rank holds its 1/P of every sequence (torch's reduce-scatter and all-gather along
dim 1 of [batch, s, ...]); the drop-ins derive the batch from scatter_dim / gather_dim. The reduce-scatter's
gemm_reduce_scatter and gemm_reduce_scatter_out also take FP8 (E4M3) a and w with their FP32 scales
(a_scale, w_scale: tensorwise, rowwise or blockwise) and use_fast_accum, and so do the all-gather's
all_gather_gemm and all_gather_gemm_gathered (x_scale, w_scale: tensorwise, rowwise or blockwise); their output
is BF16 whatever the inputs (the gathered X is x's dtype). tpfuse::quantize_all_gather_gemm takes this rank's BF16
rows, quantizes them to E4M3 on this rank, rowwise (tpfuse.float8.quantize_rowwise, torchao's rowwise recipe) or
with scaling='blockwise' per 1 x 128 tile (tpfuse.float8.quantize_blockwise, DeepSeek-V3's), and runs the FP8
all-gather with their scales.
Their fake implementations check the arguments and give the output's shape, so torch.compile traces them
without a graph break; the real ones launch on the caller's current CUDA stream, so they are CUDA-graph capturable."""

import operator
from typing import List, Optional, Tuple

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import (AllGatherProblem, Problem, check_all_gather_problem, check_fused_all_gather_matmul,
                      check_matmul_reduce_scatter, check_placement, check_problem, check_problem_cached,
                      check_quantized_rows)
from ._communicators import _by_name, communicator
from ._library import ACCUMULATION_CODES, SCALING_CODES, WEIGHT_LAYOUT_CODES, library
from .float8 import quantize_blockwise, quantize_rowwise

_NO_SCALING, _PROMOTED = SCALING_CODES["none"], ACCUMULATION_CODES["promoted"]  # BF16 inputs' codes


def _group_size(group_name: str) -> int:
    return _resolve_process_group(group_name).size()


def _data_ptr(tensor: Optional[torch.Tensor]) -> Optional[int]:
    return None if tensor is None else tensor.data_ptr()


def _launch(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor, problem: Problem,
            group_name: str, a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None) -> None:
    check_placement(("a", a), ("w", w), ("bias", bias), ("out", out), scales=(("a_scale", a_scale),
                                                                              ("w_scale", w_scale)))
    comm = communicator(_resolve_process_group(group_name), a.device)
    handle = comm.reserve(problem.m, problem.n)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    with torch.cuda.device(a.device):
        library().call("tpfuse_gemm_reduce_scatter", handle, problem.m, problem.n, problem.k_per_rank,
                       problem.world_size, problem.layout_code, problem.dtype_code, problem.scaling,
                       problem.accumulation, problem.batch, a.data_ptr(), w.data_ptr(), _data_ptr(a_scale),
                       _data_ptr(w_scale), _data_ptr(bias), out.data_ptr(), stream)


# The schemas are spelled out: an `int` annotation would make batch a SymInt.
@torch.library.custom_op("tpfuse::gemm_reduce_scatter", mutates_args=(),
                         schema="(Tensor a, Tensor w, str weight_layout, str group_name, Tensor? bias=None, "
                                "int batch=1, Tensor? a_scale=None, Tensor? w_scale=None, bool use_fast_accum=False) "
                                "-> Tensor")
def gemm_reduce_scatter(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                        bias: Optional[torch.Tensor] = None, batch: int = 1, a_scale: Optional[torch.Tensor] = None,
                        w_scale: Optional[torch.Tensor] = None, use_fast_accum: bool = False) -> torch.Tensor:
    problem = check_problem(a, w, weight_layout, _group_size(group_name), None, bias, batch, a_scale, w_scale,
                            use_fast_accum)
    out = a.new_empty((problem.rows_per_rank, problem.n), dtype=torch.bfloat16)
    _launch(a, w, bias, out, problem, group_name, a_scale=a_scale, w_scale=w_scale)
    return out


@gemm_reduce_scatter.register_fake
def _(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str, bias: Optional[torch.Tensor] = None,
      batch: int = 1, a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
      use_fast_accum: bool = False) -> torch.Tensor:
    problem = check_problem(a, w, weight_layout, _group_size(group_name), None, bias, batch, a_scale, w_scale,
                            use_fast_accum)
    return a.new_empty((problem.rows_per_rank, problem.n), dtype=torch.bfloat16)


@torch.library.custom_op("tpfuse::gemm_reduce_scatter_out", mutates_args=("out",),
                         schema="(Tensor a, Tensor w, str weight_layout, str group_name, Tensor(a!) out, "
                                "Tensor? bias=None, int batch=1, Tensor? a_scale=None, Tensor? w_scale=None, "
                                "bool use_fast_accum=False) -> ()")
def gemm_reduce_scatter_out(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                            out: torch.Tensor, bias: Optional[torch.Tensor] = None, batch: int = 1,
                            a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                            use_fast_accum: bool = False) -> None:
    problem = check_problem(a, w, weight_layout, _group_size(group_name), out, bias, batch, a_scale, w_scale,
                            use_fast_accum)
    _launch(a, w, bias, out, problem, group_name, a_scale=a_scale, w_scale=w_scale)


@gemm_reduce_scatter_out.register_fake
def _(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str, out: torch.Tensor,
      bias: Optional[torch.Tensor] = None, batch: int = 1, a_scale: Optional[torch.Tensor] = None,
      w_scale: Optional[torch.Tensor] = None, use_fast_accum: bool = False) -> None:
    check_problem(a, w, weight_layout, _group_size(group_name), out, bias, batch, a_scale, w_scale, use_fast_accum)


def _drop_in_problem(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str):
    """a (A's rows), w, the problem, and the output's shape: A's with its scatter_dim split and N last."""
    world_size = _group_size(group_name)
    a, w, weight_layout, batch = check_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, world_size)
    out_shape = [*A.shape[:-1], B.shape[1]]
    out_shape[scatter_dim] //= world_size
    return a, w, check_problem(a, w, weight_layout, world_size, batch=batch), out_shape


# The schema is spelled out to be symm_mem's exactly (an `int` annotation would make scatter_dim a SymInt).
# A scatter_dim past 0 is a batch: A's rows, sequence after sequence, each split over the ranks.
@torch.library.custom_op("tpfuse::fused_matmul_reduce_scatter", mutates_args=(),
                         schema="(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor")
def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: str) -> torch.Tensor:
    a, w, problem, out_shape = _drop_in_problem(A, B, reduce_op, scatter_dim, group_name)
    out = A.new_empty(out_shape)
    _launch(a, w, None, out.view(problem.rows_per_rank, problem.n), problem, group_name)
    return out


@fused_matmul_reduce_scatter.register_fake
def _(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str) -> torch.Tensor:
    return A.new_empty(_drop_in_problem(A, B, reduce_op, scatter_dim, group_name)[3])


def _launch_all_gather(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor,
                       gathered_x: Optional[torch.Tensor], problem: AllGatherProblem, group_name: str,
                       x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None) -> None:
    check_placement(("x", x), ("w", w), ("bias", bias), ("y", y), ("gathered_x", gathered_x),
                    scales=(("x_scale", x_scale), ("w_scale", w_scale)))
    comm = communicator(_resolve_process_group(group_name), x.device)
    handle = comm.reserve(problem.m, problem.n_per_rank, problem.k)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    with torch.cuda.device(x.device):
        library().call("tpfuse_all_gather_gemm", handle, problem.m, problem.n_per_rank, problem.k,
                       problem.world_size, WEIGHT_LAYOUT_CODES[problem.weight_layout], problem.dtype_code,
                       problem.scaling, problem.accumulation, problem.batch, x.data_ptr(), w.data_ptr(),
                       _data_ptr(x_scale), _data_ptr(w_scale), _data_ptr(bias), y.data_ptr(),
                       _data_ptr(gathered_x), stream)


def _all_gather_outputs(x: torch.Tensor, problem: AllGatherProblem, gathered: bool):
    """Y (M x N/P, BF16 whatever x's dtype) and, if asked for, the gathered X (M x K, x's dtype)."""
    y = x.new_empty((problem.m, problem.n_per_rank), dtype=torch.bfloat16)
    return (y, x.new_empty((problem.m, problem.k))) if gathered else y


@torch.library.custom_op("tpfuse::all_gather_gemm", mutates_args=(),
                         schema="(Tensor x, Tensor w, str weight_layout, str group_name, Tensor? bias=None, "
                                "int batch=1, Tensor? x_scale=None, Tensor? w_scale=None, bool use_fast_accum=False) "
                                "-> Tensor")
def all_gather_gemm(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                    bias: Optional[torch.Tensor] = None, batch: int = 1, x_scale: Optional[torch.Tensor] = None,
                    w_scale: Optional[torch.Tensor] = None, use_fast_accum: bool = False) -> torch.Tensor:
    problem = check_all_gather_problem(x, w, weight_layout, _group_size(group_name), bias, batch, x_scale, w_scale,
                                       use_fast_accum)
    y = _all_gather_outputs(x, problem, gathered=False)
    _launch_all_gather(x, w, bias, y, None, problem, group_name, x_scale=x_scale, w_scale=w_scale)
    return y


@all_gather_gemm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str, bias: Optional[torch.Tensor] = None,
      batch: int = 1, x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
      use_fast_accum: bool = False) -> torch.Tensor:
    problem = check_all_gather_problem(x, w, weight_layout, _group_size(group_name), bias, batch, x_scale, w_scale,
                                       use_fast_accum)
    return _all_gather_outputs(x, problem, gathered=False)


@torch.library.custom_op("tpfuse::all_gather_gemm_gathered", mutates_args=(),
                         schema="(Tensor x, Tensor w, str weight_layout, str group_name, Tensor? bias=None, "
                                "int batch=1, Tensor? x_scale=None, Tensor? w_scale=None, bool use_fast_accum=False) "
                                "-> (Tensor, Tensor)")
def all_gather_gemm_gathered(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                             bias: Optional[torch.Tensor] = None, batch: int = 1,
                             x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                             use_fast_accum: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    problem = check_all_gather_problem(x, w, weight_layout, _group_size(group_name), bias, batch, x_scale, w_scale,
                                       use_fast_accum)
    y, gathered_x = _all_gather_outputs(x, problem, gathered=True)
    _launch_all_gather(x, w, bias, y, gathered_x, problem, group_name, x_scale=x_scale, w_scale=w_scale)
    return y, gathered_x


@all_gather_gemm_gathered.register_fake
def _(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str, bias: Optional[torch.Tensor] = None,
      batch: int = 1, x_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
      use_fast_accum: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    problem = check_all_gather_problem(x, w, weight_layout, _group_size(group_name), bias, batch, x_scale, w_scale,
                                       use_fast_accum)
    return _all_gather_outputs(x, problem, gathered=True)


def _quantized(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, group_name: str,
               bias: Optional[torch.Tensor], batch: int, use_fast_accum: bool, scaling: str):
    """x's rows quantized (e4m3, their rowwise or blockwise scales) and the FP8 all-gather's problem in that
    form."""
    check_quantized_rows(x, scaling)
    x_fp8, x_scale = quantize_blockwise(x) if scaling == "blockwise" else quantize_rowwise(x)
    problem = check_all_gather_problem(x_fp8, w, "nk", _group_size(group_name), bias, batch, x_scale, w_scale,
                                       use_fast_accum, form=SCALING_CODES[scaling])
    return x_fp8, x_scale, problem


@torch.library.custom_op("tpfuse::quantize_all_gather_gemm", mutates_args=(),
                         schema="(Tensor x, Tensor w, Tensor w_scale, str group_name, Tensor? bias=None, int batch=1, "
                                "bool use_fast_accum=False, str scaling=\"rowwise\") -> Tensor")
def quantize_all_gather_gemm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, group_name: str,
                             bias: Optional[torch.Tensor] = None, batch: int = 1, use_fast_accum: bool = False,
                             scaling: str = "rowwise") -> torch.Tensor:
    x_fp8, x_scale, problem = _quantized(x, w, w_scale, group_name, bias, batch, use_fast_accum, scaling)
    y = _all_gather_outputs(x_fp8, problem, gathered=False)
    _launch_all_gather(x_fp8, w, bias, y, None, problem, group_name, x_scale=x_scale, w_scale=w_scale)
    return y


@quantize_all_gather_gemm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, group_name: str, bias: Optional[torch.Tensor] = None,
      batch: int = 1, use_fast_accum: bool = False, scaling: str = "rowwise") -> torch.Tensor:
    x_fp8, _, problem = _quantized(x, w, w_scale, group_name, bias, batch, use_fast_accum, scaling)
    return _all_gather_outputs(x_fp8, problem, gathered=False)


def _all_gather_drop_in(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str):
    """x and, per B, its w and problem; the gathered A's shape (A's with gather_dim times P); each output's
    shape."""
    world_size = _group_size(group_name)
    x, weights, batch = check_fused_all_gather_matmul(A, Bs, gather_dim)
    problems = [(w, check_all_gather_problem(x, w, layout, world_size, batch=batch)) for w, layout in weights]
    gathered_shape = list(A.shape)
    gathered_shape[gather_dim] *= world_size
    return x, problems, gathered_shape, [(*gathered_shape[:-1], p.n_per_rank) for _, p in problems]


def _gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, problem: AllGatherProblem) -> None:
    """out = a @ w with tpfuse's per-rank GEMM (a: the gathered m x k rows, in the problem's order)."""
    stream = torch.cuda.current_stream(a.device).cuda_stream
    with torch.cuda.device(a.device):
        library().call("tpfuse_gemm", problem.m, problem.n_per_rank, problem.k,
                       WEIGHT_LAYOUT_CODES[problem.weight_layout], problem.dtype_code, _NO_SCALING, _PROMOTED,
                       a.data_ptr(), w.data_ptr(), None, None, out.data_ptr(), stream)


# symm_mem's schema exactly. The first B is the fused call, which also gives the gathered A; every
# later B multiplies that gathered A with the per-rank GEMM (A is gathered once). A gather_dim past 0 is
# a batch: each sequence's rows gathered in rank order, sequence after sequence.
@torch.library.custom_op("tpfuse::fused_all_gather_matmul", mutates_args=(),
                         schema="(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) "
                                "-> (Tensor?, Tensor[])")
def fused_all_gather_matmul(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str, *,
                            return_A: bool = True) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    x, problems, gathered_shape, out_shapes = _all_gather_drop_in(A, Bs, gather_dim, group_name)
    # Every weight's placement before the first launch, so that a bad one launches nothing.
    check_placement(("A", x), *((f"Bs[{i}]", w) for i, (w, _) in enumerate(problems)))
    gathered = A.new_empty(gathered_shape) if return_A or len(Bs) > 1 else None
    outs = []
    for i, ((w, problem), shape) in enumerate(zip(problems, out_shapes)):
        out = A.new_empty(shape)
        y = out.view(problem.m, problem.n_per_rank)
        gathered_x = None if gathered is None else gathered.view(problem.m, problem.k)
        if i == 0:
            _launch_all_gather(x, w, None, y, gathered_x, problem, group_name)
        else:
            _gemm(gathered_x, w, y, problem)
        outs.append(out)
    return (gathered if return_A else None), outs


@fused_all_gather_matmul.register_fake
def _(A: torch.Tensor, Bs: List[torch.Tensor], gather_dim: int, group_name: str, *,
      return_A: bool = True) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    _, _, gathered_shape, out_shapes = _all_gather_drop_in(A, Bs, gather_dim, group_name)
    return (A.new_empty(gathered_shape) if return_A else None), [A.new_empty(shape) for shape in out_shapes]


# The eager path: tpfuse.gemm_reduce_scatter called on plain CUDA tensors, outside tracing, autograd and
# dispatch modes, calls the C ABI directly instead of going through the custom op's dispatch. It does
# what the op does (the same checks, cached per shape; the same communicator and capture bookkeeping),
# with torch's C-level look-ups of the current device and stream.
_current_device = getattr(torch._C, "_cuda_getDevice", None)  # None: a torch without CUDA
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_BF16 = torch.bfloat16
# Tensors on other devices (meta tensors) go through the op and its fake implementation. (An attribute getter:
# tensor.device.type would cost a few hundred nanoseconds.)
_on_eager_device = operator.attrgetter("is_cuda")


def eager_allowed(first: torch.Tensor, *tensors) -> bool:
    """Whether a call on these tensors may skip the custom op: plain tensors, the first on a CUDA
    device, nothing tracing or intercepting the call, no gradient to record."""
    if _current_device is None or _is_compiling() or _dispatch_modes() or _function_modes() or \
            not _on_eager_device(first):
        return False
    tensors = (first, *tensors)
    grad = torch.is_grad_enabled()
    for tensor in tensors:
        if tensor is not None and (type(tensor) is not _Tensor or (grad and tensor.requires_grad)):
            return False
    return True


def gemm_reduce_scatter_eager(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                              out: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None, batch: int = 1,
                              a_scale: Optional[torch.Tensor] = None, w_scale: Optional[torch.Tensor] = None,
                              use_fast_accum: bool = False) -> torch.Tensor:
    """The eager path of tpfuse.gemm_reduce_scatter (eager_allowed(a, w, out, bias, a_scale, w_scale) holds)."""
    device = a.device
    comm = _by_name.get((group_name, device.index))
    problem = check_problem_cached(a, w, weight_layout, comm.group_size if comm else _group_size(group_name), out,
                                   bias, batch, a_scale, w_scale, use_fast_accum)
    if out is None:
        out = torch.empty((problem.rows_per_rank, problem.n), dtype=_BF16, device=device)
    a_ptr, w_ptr, out_ptr = a.data_ptr(), w.data_ptr(), out.data_ptr()
    bias_ptr = 0 if bias is None else bias.data_ptr()
    if a_scale is None:
        a_scale_ptr = w_scale_ptr = 0
        scales_elsewhere = False
    else:  # check_problem_cached has checked both scales are given
        a_scale_ptr, w_scale_ptr = a_scale.data_ptr(), w_scale.data_ptr()
        scales_elsewhere = a_scale.device != device or w_scale.device != device
    if (a_ptr | w_ptr | out_ptr | bias_ptr) % 16 or (a_scale_ptr | w_scale_ptr) % 4 or scales_elsewhere or \
            w.device != device or out.device != device or (bias is not None and bias.device != device):
        check_placement(("a", a), ("w", w), ("bias", bias), ("out", out), scales=(("a_scale", a_scale),
                                                                                  ("w_scale", w_scale)))
    if comm is None or problem.m > comm.max_m or problem.n > comm.max_n:
        comm = comm or communicator(_resolve_process_group(group_name), device)
        handle = comm.reserve(problem.m, problem.n)
    else:
        handle = comm.handle
        if _capturing():
            comm.captured = True
    index = device.index
    lib = library()
    function = lib.functions["tpfuse_gemm_reduce_scatter"]
    args = (handle, problem.m, problem.n, problem.k_per_rank, problem.world_size, problem.layout_code,
            problem.dtype_code, problem.scaling, problem.accumulation, problem.batch, a_ptr, w_ptr, a_scale_ptr,
            w_scale_ptr, bias_ptr, out_ptr, _current_stream(index))
    if _current_device() == index:
        status = function(*args)
    else:
        with torch.cuda.device(index):
            status = function(*args)
    if status:
        raise lib.error(status)
    return out
