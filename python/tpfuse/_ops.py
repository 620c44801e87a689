"""The torch custom ops: tpfuse::gemm_reduce_scatter (returns this rank's rows) and
tpfuse::gemm_reduce_scatter_out (writes them into `out`). Their fake implementations check the
arguments and give the output's shape, so torch.compile traces them without a graph break; the real
ones launch on the caller's current CUDA stream, so they are CUDA-graph capturable."""

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import Problem, check_placement, check_problem
from ._communicators import communicator
from ._library import WEIGHT_LAYOUT_CODES, library


def _group_size(group_name: str) -> int:
    return _resolve_process_group(group_name).size()


def _launch(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, problem: Problem, group_name: str) -> None:
    check_placement(a, w, out)
    comm = communicator(_resolve_process_group(group_name), a.device)
    handle = comm.reserve(problem.m, problem.n)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    with torch.cuda.device(a.device):
        library().call("tpfuse_gemm_reduce_scatter", handle, problem.m, problem.n, problem.k_per_rank,
                       problem.world_size, WEIGHT_LAYOUT_CODES[problem.weight_layout], a.data_ptr(), w.data_ptr(),
                       out.data_ptr(), stream)


@torch.library.custom_op("tpfuse::gemm_reduce_scatter", mutates_args=())
def gemm_reduce_scatter(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str) -> torch.Tensor:
    problem = check_problem(a, w, weight_layout, _group_size(group_name))
    out = a.new_empty((problem.rows_per_rank, problem.n))
    _launch(a, w, out, problem, group_name)
    return out


@gemm_reduce_scatter.register_fake
def _(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str) -> torch.Tensor:
    problem = check_problem(a, w, weight_layout, _group_size(group_name))
    return a.new_empty((problem.rows_per_rank, problem.n))


@torch.library.custom_op("tpfuse::gemm_reduce_scatter_out", mutates_args=("out",))
def gemm_reduce_scatter_out(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                            out: torch.Tensor) -> None:
    problem = check_problem(a, w, weight_layout, _group_size(group_name), out)
    _launch(a, w, out, problem, group_name)


@gemm_reduce_scatter_out.register_fake
def _(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str, out: torch.Tensor) -> None:
    check_problem(a, w, weight_layout, _group_size(group_name), out)
