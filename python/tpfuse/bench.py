"""python -m tpfuse.bench: docs/SPEC.md's sweep through PyTorch, one process per GPU under torchrun.

    torchrun --nproc-per-node=P -m tpfuse.bench [--json results.json]

Per shape, in one run and on the same rotated inputs: T_gemm (torch.mm), T_comm (NCCL's
reduce-scatter of the M x N partial: reduce_scatter_tensor on torch's buffers, and ncclReduceScatter
on buffers in NCCL symmetric windows, which take NCCL's symmetric kernels; T_comm the faster), T_seq
(both in sequence, on the faster path), T_fused for tpfuse and for
torch's async-TP (torch.ops.symm_mem.fused_matmul_reduce_scatter), and for each fused op
    E = (T_gemm + T_comm - T_fused) / T_comm,  E_hideable = the same over min(T_gemm, T_comm),
    speedup = T_seq / T_fused,
and, with checking on, docs/SPEC.md's rule: each of its errors at most 1.1x the unfused path's. Times are
medians of --iters iterations after --warmup, each iteration's time the slowest rank's; ranks are
aligned before each iteration, and a gate (a GPU sleep) holds the stream until the launches are
queued, so host launch time is not in the GPU times: it is reported on its own (host_*_us, the
slowest rank's median time to queue one call). K per rank is K / --tp (docs/SPEC.md: P = 8) at every world
size. The JSON has tpfuse_bench's schema plus the async-TP and host-time columns. Progress goes to
stderr, the table to stdout.

With --fp8 tensorwise|rowwise|blockwise (and --fast-accum, not with blockwise), each shape also runs with E4M3
inputs (a M x K/P, w the N x K/P weight) and FP32 scales, these calls interleaved in one loop: T_gemm_fp8
(torch._scaled_mm), T_seq_fp8 (it, then the reduce-scatter on T_seq's path), T_fused_fp8 (tpfuse),
T_async_tp_fp8 (torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter, torch's own kernel) and tpfuse's BF16
call again (T_fused_bf16: what FP8 buys); E, speedup and the rule as above, against torch._scaled_mm +
reduce_scatter_tensor and the exact product of the dequantized inputs. Blockwise scales (one per 1 x 128 tile of
a, one per 128 x 128 block of w) take torch._scaled_mm's blockwise form, and the rule's unfused path is its
tensorwise product of each 128 of K, scaled and summed (tpfuse.checking's). Torch's fused op, and with blockwise
scales torch._scaled_mm, run once before the loop: where one raises (or, the fused op, has no blockwise form or
would run tpfuse), its columns are left out and gemm_fp8_status or async_tp_fp8_status says why.
"""

import argparse
import ctypes
import datetime
import json
import math
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import tpfuse
from tpfuse import _library
from tpfuse._communicators import torch_nccl_comm
from tpfuse.checking import (ERROR_FACTOR, errors, fp8_blockwise_operands, fp8_blockwise_unfused_rows, fp8_operands,
                             fp8_reference_rows, fp8_unfused_rows, random_operands, reference_rows, unfused_rows,
                             weight_as_k_by_n)
from tpfuse.symm_mem import is_overridden

# docs/SPEC.md's shapes: the table the C++ benchmark is built from too.
_SHAPES = json.loads(pathlib.Path(__file__).with_name("shapes.json").read_text())
PROJECTIONS = [(p["name"], p["n"], p["k"]) for p in _SHAPES["row_parallel"]]  # name, N, K (total)
SWEEP_TOKENS = _SHAPES["tokens"]
TARGET_E = 0.9
MAX_INPUT_SETS = 8
GATE_MS = 2.0  # longer than any call's host launch time


@dataclass(frozen=True)
class Shape:
    proj: str
    m: int
    n: int
    k_per_rank: int


def projection_name(n: int, k_total: int) -> str:
    return next((name for name, pn, pk in PROJECTIONS if (pn, pk) == (n, k_total)), "custom")


def parse_shapes(text: str, tp: int) -> list:
    """'M,N,K_per_rank;...' or '' (the sweep: SWEEP_TOKENS x PROJECTIONS, K per rank = K / tp)."""
    if not text:
        return [Shape(name, m, n, k // tp) for name, n, k in PROJECTIONS for m in SWEEP_TOKENS]
    shapes = []
    for entry in text.split(";"):
        m, n, k = (int(field) for field in entry.split(","))
        shapes.append(Shape(projection_name(n, k * tp), m, n, k))
    return shapes


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tpfuse.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="", help="'M,N,K_per_rank;...' (default: docs/SPEC.md's 16 shapes)")
    parser.add_argument("--tp", type=int, default=8, help="P of docs/SPEC.md's K per rank = K / P (default 8)")
    parser.add_argument("--layout", choices=["kn", "nk"], default="kn", help="the weight's layout (default kn)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the error measures")
    parser.add_argument("--no-gate", dest="gate", action="store_false",
                        help="align ranks only by synchronizing (host launch time then counts in the GPU times)")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: drawn, and reported)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--git-commit", default=None, help="the commit to report (default: git's, in this folder)")
    parser.add_argument("--fp8", choices=["tensorwise", "rowwise", "blockwise"], default=None,
                        help="also time E4M3 inputs with FP32 scales of this scaling (the *_fp8 columns; blockwise: "
                             "one per 1 x 128 tile of a and per 128 x 128 block of w)")
    parser.add_argument("--fast-accum", action="store_true",
                        help="with --fp8 tensorwise or rowwise: the tensor cores' own accumulation "
                             "(torch._scaled_mm's use_fast_accum)")
    args = parser.parse_args(argv)
    if args.fast_accum and args.fp8 is None:
        parser.error("--fast-accum applies to the FP8 calls: give --fp8 tensorwise or --fp8 rowwise")
    if args.fast_accum and args.fp8 == "blockwise":
        parser.error("--fast-accum does not apply to --fp8 blockwise: blockwise scales apply where each 128 of K is "
                     "added into the FP32 sums (promoted accumulation), which fast accumulation skips")
    return args


class Run:
    """The process group, this rank's device, and the timing loop."""

    def __init__(self, args):
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", local_rank)
        torch.cuda.set_device(self.device)
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group("nccl", device_id=self.device)
        else:
            dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=self.device)
        self.group = dist.group.WORLD
        self.rank, self.world_size = self.group.rank(), self.group.size()
        self.args = args
        self.token = torch.zeros(1, device=self.device)
        self.gate_cycles = self._cycles_per_ms() * GATE_MS if args.gate else 0

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[tpfuse.bench] {message}", file=sys.stderr, flush=True)

    def _cycles_per_ms(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        torch.cuda._sleep(cycles // 10)  # warm-up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return cycles / start.elapsed_time(end)

    def align(self) -> None:
        dist.all_reduce(self.token, group=self.group)
        torch.cuda.synchronize()

    def time(self, call) -> tuple:
        """(GPU ms, host us) of call(i): medians over the iterations of the slowest rank's times."""
        return self.time_interleaved({"call": call})["call"]

    def time_interleaved(self, calls: dict) -> dict:
        """{name: (GPU ms, host us)} of each call(i), timed in turn in every iteration, each on the next i (the
        next input set): medians over the iterations of the slowest rank's times."""
        names = list(calls)
        events = {name: [] for name in names}
        host_s = {name: [] for name in names}
        for i in range(self.args.warmup + self.args.iters):
            for j, name in enumerate(names):
                self.align()
                if self.gate_cycles:
                    torch.cuda._sleep(int(self.gate_cycles))
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                queued = time.perf_counter()
                calls[name](i * len(names) + j)
                host = time.perf_counter() - queued
                end.record()
                if i >= self.args.warmup:
                    events[name].append((start, end))
                    host_s[name].append(host)
        torch.cuda.synchronize()
        gpu_ms = torch.tensor([[start.elapsed_time(end) for start, end in events[name]] for name in names],
                              device=self.device)
        dist.all_reduce(gpu_ms, op=dist.ReduceOp.MAX, group=self.group)  # each iteration's slowest rank
        host_us = torch.tensor([statistics.median(host_s[name]) * 1e6 for name in names], device=self.device)
        dist.all_reduce(host_us, op=dist.ReduceOp.MAX, group=self.group)
        return {name: (statistics.median(gpu_ms[j].tolist()), host_us[j].item()) for j, name in enumerate(names)}


def input_set_count(shape: Shape, world_size: int, fp8: bool, l2_bytes: int, free_bytes: int) -> int:
    """How many input sets to rotate: enough that each format's timed bytes (the BF16 inputs with the BF16
    partial, rows and fused out; with fp8 also the E4M3 inputs with the same outputs) over all sets are twice
    the L2 cache's, at most MAX_INPUT_SETS and a quarter of the free memory."""
    m, n, k, p = shape.m, shape.n, shape.k_per_rank, world_size
    outputs = 2 * (m * n + 2 * (m // p) * n)
    bf16_inputs, fp8_inputs = 2 * (m * k + k * n), m * k + k * n
    streamed = [bf16_inputs + outputs] + ([fp8_inputs + outputs] if fp8 else [])
    set_bytes = bf16_inputs + outputs + (fp8_inputs if fp8 else 0)
    return max(1, min(MAX_INPUT_SETS, max(math.ceil(2 * l2_bytes / size) for size in streamed),
                      free_bytes // 4 // set_bytes))


def input_seed(seed: int, shape_index: int, set_index: int, rank: int) -> int:
    return seed + 7919 * (shape_index * MAX_INPUT_SETS + set_index) + 104729 * rank


def input_sets(shape: Shape, run: Run, seed: int, shape_index: int) -> list:
    """Rotated input sets (a, w, partial, rows, fused out), enough to stream past the L2 cache (with --fp8,
    counting fp8_input_sets' too)."""
    m, n, k, p = shape.m, shape.n, shape.k_per_rank, run.world_size
    count = input_set_count(shape, p, run.args.fp8 is not None,
                            torch.cuda.get_device_properties(run.device).L2_cache_size,
                            torch.cuda.mem_get_info(run.device)[0])
    sets = []
    for s in range(count):
        a, w = random_operands(m, n, k, run.args.layout, run.device, input_seed(seed, shape_index, s, run.rank))
        partial = torch.empty(m, n, dtype=torch.bfloat16, device=run.device)
        rows = torch.empty(m // p, n, dtype=torch.bfloat16, device=run.device)
        sets.append((a, w, partial, rows, torch.full_like(rows, float("nan"))))
    return sets


def fp8_input_sets(shape: Shape, run: Run, seed: int, shape_index: int, count: int) -> list:
    """`count` rotated E4M3 input sets (a M x K/P, w N x K/P, a_scale, w_scale) of --fp8's scaling: normal
    values quantized with the scales that map each tensor's (rowwise: each row's; blockwise: each 1 x 128 tile's
    of a and 128 x 128 block's of w) largest magnitude to E4M3's; tensorwise scales one element each, rowwise
    a_scale (M, 1) and w_scale (1, N), blockwise a_scale (M, K/P/128) and w_scale (ceil(N/128), K/P/128),
    contiguous (tpfuse's form). They share the BF16 sets' partial, rows and fused out."""
    m, n, k = shape.m, shape.n, shape.k_per_rank

    def operands(s):
        set_seed = input_seed(seed, shape_index, s, run.rank)
        if run.args.fp8 == "blockwise":
            return fp8_blockwise_operands(m, n, k, run.device, set_seed)
        return fp8_operands(m, n, k, run.device, set_seed, run.args.fp8)

    return [operands(s) for s in range(count)]


class SymmetricWindows:
    """Every input set's partial and rows in one NCCL symmetric window (ncclMemAlloc,
    ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC) on torch's communicator of the group, so that
    ncclReduceScatter on them takes NCCL's symmetric kernels. Made and freed by every rank together.
    Where it cannot be made (a torch whose NCCL is not the one loaded, an NCCL before windows),
    `reason` says why and `partials` is empty."""

    WIN_COLL_SYMMETRIC = 0x01
    ALIGNMENT = 4096  # NCCL_WIN_REQUIRED_ALIGNMENT
    BFLOAT16, SUM = 9, 0  # ncclBfloat16, ncclSum

    def __init__(self, run: "Run", m: int, n: int, count: int):
        self.partials, self.rows, self.reason = [], [], ""
        self._nccl, self._comm, self._base, self._window = None, None, ctypes.c_void_p(), ctypes.c_void_p()
        comm = torch_nccl_comm(run.group, run.device)
        if comm is None:
            self.reason = "torch's NCCL communicator is not usable from tpfuse (another NCCL library)"
            return
        nccl = ctypes.CDLL(_library.library().nccl.path)
        if not hasattr(nccl, "ncclCommWindowRegister"):
            self.reason = "this NCCL has no symmetric windows (ncclCommWindowRegister)"
            return
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        self._nccl, self._comm = nccl, ctypes.c_void_p(comm)
        aligned = lambda size: (size + self.ALIGNMENT - 1) // self.ALIGNMENT * self.ALIGNMENT
        partial_bytes, rows_bytes = aligned(m * n * 2), aligned(m // run.world_size * n * 2)
        total = count * (partial_bytes + rows_bytes)
        self._call("ncclMemAlloc", ctypes.byref(self._base), ctypes.c_size_t(total))
        try:
            self._call("ncclCommWindowRegister", self._comm, self._base, ctypes.c_size_t(total),
                       ctypes.byref(self._window), ctypes.c_int(self.WIN_COLL_SYMMETRIC))
        except RuntimeError:
            self._nccl.ncclMemFree(self._base)  # the allocation goes with the failed registration
            raise
        memory = _DeviceMemory(self._base.value, total)
        whole = torch.as_tensor(memory, device=run.device).view(torch.bfloat16)  # int16 words as BF16
        for s in range(count):
            at = s * (partial_bytes + rows_bytes) // 2
            self.partials.append(whole[at:at + m * n].view(m, n))
            at += partial_bytes // 2
            self.rows.append(whole[at:at + m // run.world_size * n].view(m // run.world_size, n))

    def _call(self, name: str, *args) -> None:
        result = getattr(self._nccl, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name}: {self._nccl.ncclGetErrorString(result).decode()}")

    def reduce_scatter(self, s: int) -> None:
        """ncclReduceScatter of set s's partial into its rows, on the current stream."""
        self._call("ncclReduceScatter", ctypes.c_void_p(self.partials[s].data_ptr()),
                   ctypes.c_void_p(self.rows[s].data_ptr()), ctypes.c_size_t(self.rows[s].numel()),
                   ctypes.c_int(self.BFLOAT16), ctypes.c_int(self.SUM), self._comm,
                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))

    def free(self) -> None:
        """Every rank together, once the GPU is done with the buffers."""
        if self._window.value:
            torch.cuda.synchronize()
            self.partials, self.rows = [], []
            self._call("ncclCommWindowDeregister", self._comm, self._window)
            self._call("ncclMemFree", self._base)
            self._window = ctypes.c_void_p()


class _DeviceMemory:
    """Device memory torch.as_tensor can view, as 16-bit words (the CUDA array interface)."""

    def __init__(self, pointer: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size // 2,), "typestr": "<i2", "data": (pointer, False),
                                         "version": 3}


def efficiency(row: dict, t_fused: float, suffix: str, inputs: str = "") -> None:
    """E, E_hideable and speedup (+ suffix) of a fused time against T_gemm and T_seq of the inputs' format
    (inputs: "" BF16, "_fp8" E4M3) and T_comm."""
    t_gemm, t_seq = row[f"t_gemm{inputs}_ms"], row[f"t_seq{inputs}_ms"]
    hidden = t_gemm + row["t_comm_ms"] - t_fused
    row["E" + suffix] = hidden / row["t_comm_ms"]
    row["E_hideable" + suffix] = hidden / min(t_gemm, row["t_comm_ms"])
    row["speedup" + suffix] = t_seq / t_fused


def run_shape(shape: Shape, shape_index: int, run: Run, seed: int) -> dict:
    row = {"proj": shape.proj, "m": shape.m, "n": shape.n, "k_per_rank": shape.k_per_rank}
    if shape.m % run.world_size != 0:
        row.update(status=f"skipped: M not divisible by {run.world_size} GPUs", wrong=0, input_sets=0)
        return row
    sets = input_sets(shape, run, seed, shape_index)
    fp8_sets = fp8_input_sets(shape, run, seed, shape_index, len(sets)) if run.args.fp8 else []
    row["input_sets"] = len(sets)
    windows = SymmetricWindows(run, shape.m, shape.n, len(sets))
    try:
        return measure_shape(row, run, sets, fp8_sets, windows)
    finally:
        windows.free()


def torch_kernel_reason() -> str:
    """Why a call of torch.ops.symm_mem's ops would not time torch's own kernels ('' where it would)."""
    if is_overridden("CUDA"):
        return "tpfuse's override of torch's symm_mem ops (tpfuse.use_for_symm_mem) is on: the call would run tpfuse"
    return ""


def scaled_mm_scales(a_scale: torch.Tensor, w_scale: torch.Tensor, scaling: str) -> tuple:
    """scale_a and scale_b of torch._scaled_mm(a, w.t()) for tpfuse's a_scale and w_scale: the same tensors, but
    blockwise ones in the layouts torch._scaled_mm's blockwise form takes (it refuses others): a_scale (M, K/P/128)
    column-major, strides (1, M) (a copy), and w_scale transposed, (K/P/128, ceil(N/128)) with strides
    (1, K/P/128) (a view)."""
    if scaling != "blockwise":
        return a_scale, w_scale
    return a_scale.t().contiguous().t(), w_scale.t()


BLOCKWISE_ASYNC_TP_REASON = ("torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter has no blockwise form (it takes "
                             "tensorwise or rowwise scales)")


def torch_fp8_reduce_scatter_args(a: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
                                  group_name: str) -> list:
    """The arguments without defaults of torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter for
    torch._scaled_mm(a, w.t()) reduce-scattered along its rows, in the installed torch's schema (torch 2.7:
    scatter_dim; later: orig_scatter_dim, scatter_dim_after_maybe_reshape and output_shape)."""
    values = {"A": a, "B": w.t(), "A_scale": a_scale, "B_scale": w_scale, "reduce_op": "sum", "scatter_dim": 0,
              "orig_scatter_dim": 0, "scatter_dim_after_maybe_reshape": 0, "group_name": group_name,
              "output_shape": [a.shape[0], w.shape[0]]}
    schema = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default._schema
    return [values[argument.name] for argument in schema.arguments if not argument.has_default_value()]


def measure_shape(row: dict, run: Run, sets: list, fp8_sets: list, windows: SymmetricWindows) -> dict:
    layout, group, group_name = run.args.layout, run.group, run.group.group_name
    if windows.reason:
        row["note"] = f"no symmetric window: {windows.reason}"
        run.log(row["note"])
    seq_symmetric = False  # T_seq's reduce-scatter: the faster of the two, once both are timed

    def gemm(i, symmetric=False):
        a, w, partial, _, _ = sets[i % len(sets)]
        out = windows.partials[i % len(sets)] if symmetric else partial
        torch.mm(a, weight_as_k_by_n(w, layout), out=out)

    def comm_ring(i):
        _, _, partial, rows, _ = sets[i % len(sets)]
        dist.reduce_scatter_tensor(rows, partial, group=group)

    def comm_sym(i):
        windows.reduce_scatter(i % len(sets))

    def seq(i):
        gemm(i, seq_symmetric)
        (comm_sym if seq_symmetric else comm_ring)(i)

    def fused(i):
        a, w, _, _, out = sets[i % len(sets)]
        tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=layout, out=out)

    def async_tp(i):
        a, w, _, _, _ = sets[i % len(sets)]
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, weight_as_k_by_n(w, layout), "sum", 0, group_name)

    for s in range(len(windows.partials)):  # the partials the symmetric path reduces: the GEMM's
        gemm(s, symmetric=True)

    torch_reason = torch_kernel_reason()
    if torch_reason:
        row["async_tp_status"] = torch_reason
    wrong = 0
    if run.args.check:
        a, w, _, _, out = sets[0]
        reference = reference_rows(a, w, layout, group)
        unfused = errors(unfused_rows(a, w, layout, group), reference, group)
        row.update(unfused_max_rel=unfused.max_rel, unfused_norm_rel=unfused.norm_rel)
        wrong += unfused.nonfinite
        if windows.partials:
            windows.rows[0].fill_(float("nan"))
            comm_sym(0)
            measured = errors(windows.rows[0], reference, group)
            row.update(rs_sym_max_rel=measured.max_rel, rs_sym_norm_rel=measured.norm_rel)
            wrong += measured.nonfinite
        fused(0)
        measured = errors(out, reference, group)
        row.update(fused_max_rel=measured.max_rel, fused_norm_rel=measured.norm_rel,
                   rule="pass" if measured.within(unfused) else "FAIL")
        wrong += measured.nonfinite
        if "async_tp_status" not in row:
            try:
                measured = errors(async_tp(0), reference, group)
                row.update(async_tp_max_rel=measured.max_rel, async_tp_norm_rel=measured.norm_rel,
                           rule_async_tp="pass" if measured.within(unfused) else "FAIL")
            except Exception as error:  # torch's op may refuse a shape; tpfuse's columns still count
                row["async_tp_status"] = f"{type(error).__name__}: {error}"
    row["wrong"] = wrong

    row["t_gemm_ms"], row["host_gemm_us"] = run.time(gemm)
    row["t_comm_ring_ms"], row["host_comm_us"] = run.time(comm_ring)
    row["t_comm_ms"] = row["t_comm_ring_ms"]
    if windows.partials:
        row["t_comm_sym_ms"], _ = run.time(comm_sym)
        seq_symmetric = row["t_comm_sym_ms"] < row["t_comm_ring_ms"]
        row["t_comm_ms"] = min(row["t_comm_sym_ms"], row["t_comm_ring_ms"])
    row["seq_path"] = "sym" if seq_symmetric else "ring"
    for name, call in (("seq", seq), ("fused", fused)):
        row[f"t_{name}_ms"], row[f"host_{name}_us"] = run.time(call)
    efficiency(row, row["t_fused_ms"], "")
    if "async_tp_status" not in row:
        try:
            row["t_async_tp_ms"], row["host_async_tp_us"] = run.time(async_tp)
            efficiency(row, row["t_async_tp_ms"], "_async_tp")
            row["async_tp_status"] = "ok"
        except Exception as error:
            row["async_tp_status"] = f"{type(error).__name__}: {error}"
    if fp8_sets:
        partials = windows.partials if seq_symmetric else [partial for _, _, partial, _, _ in sets]
        measure_fp8(row, run, sets, fp8_sets, partials, comm_sym if seq_symmetric else comm_ring, fused)
    row["status"] = "ok"
    return row


def first_call(call) -> tuple:
    """(call(0), '') where it runs, (None, the error) where it raises: a torch call's trial before the loop."""
    try:
        return call(0), ""
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def measure_fp8(row: dict, run: Run, sets: list, fp8_sets: list, partials: list, comm, fused_bf16) -> None:
    """The *_fp8 columns: torch._scaled_mm into `partials` alone and followed by `comm` (T_seq's reduce-scatter
    of them), tpfuse's FP8 call, torch's fused_scaled_matmul_reduce_scatter and tpfuse's BF16 call (fused_bf16),
    interleaved in one loop; checked against the exact product of the dequantized inputs beside the unfused path
    (blockwise: tpfuse.checking's, from torch._scaled_mm's tensorwise product of each 128 of K). gemm_fp8_status
    and async_tp_fp8_status say why torch's columns are left out, or "ok"."""
    group, fast_accum, count = run.group, run.args.fast_accum, len(fp8_sets)
    blockwise = run.args.fp8 == "blockwise"
    mm_scales = [scaled_mm_scales(a_scale, w_scale, run.args.fp8) for _, _, a_scale, w_scale in fp8_sets]
    torch_args = [torch_fp8_reduce_scatter_args(*operands, group.group_name) for operands in fp8_sets]

    def gemm(i):
        a, w, _, _ = fp8_sets[i % count]
        torch._scaled_mm(a, w.t(), *mm_scales[i % count], out_dtype=torch.bfloat16, use_fast_accum=fast_accum,
                         out=partials[i % count])

    def seq(i):
        gemm(i)
        comm(i)

    def fused(i):
        a, w, a_scale, w_scale = fp8_sets[i % count]
        tpfuse.gemm_reduce_scatter(a, w, group, out=sets[i % count][4], a_scale=a_scale, w_scale=w_scale,
                                   use_fast_accum=fast_accum)

    def async_tp(i):
        return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*torch_args[i % count], out_dtype=torch.bfloat16,
                                                                     use_fast_accum=fast_accum)

    # A trial before the loop of torch's calls that may not run (torch._scaled_mm's blockwise form, which older torch
    # lacks, and torch's op): where one cannot run (or would not be torch's), its columns are left out.
    _, gemm_reason = first_call(gemm) if blockwise else (None, "")
    torch_reason, torch_rows = (BLOCKWISE_ASYNC_TP_REASON if blockwise else torch_kernel_reason()), None
    if not torch_reason:
        torch_rows, torch_reason = first_call(async_tp)
    wrong = 0
    if run.args.check:
        a, w, a_scale, w_scale = fp8_sets[0]
        reference = fp8_reference_rows(a, w, a_scale, w_scale, group, blockwise=blockwise)
        baseline = (fp8_blockwise_unfused_rows(a, w, a_scale, w_scale, group) if blockwise else
                    fp8_unfused_rows(a, w, a_scale, w_scale, group, fast_accum))
        unfused = errors(baseline, reference, group)
        row.update(unfused_fp8_max_rel=unfused.max_rel, unfused_fp8_norm_rel=unfused.norm_rel)
        wrong += unfused.nonfinite
        out = sets[0][4]
        out.fill_(float("nan"))
        fused(0)
        measured = errors(out, reference, group)
        row.update(fused_fp8_max_rel=measured.max_rel, fused_fp8_norm_rel=measured.norm_rel,
                   rule_fp8="pass" if measured.within(unfused) else "FAIL")
        wrong += measured.nonfinite
        if torch_rows is not None:
            measured = errors(torch_rows, reference, group)
            row.update(async_tp_fp8_max_rel=measured.max_rel, async_tp_fp8_norm_rel=measured.norm_rel,
                       rule_async_tp_fp8="pass" if measured.within(unfused) else "FAIL")
    row["wrong"] += wrong

    calls = {} if gemm_reason else {"gemm_fp8": gemm, "seq_fp8": seq}
    calls.update(fused_fp8=fused, fused_bf16=fused_bf16)
    if not torch_reason:
        calls["async_tp_fp8"] = async_tp
    for name, (gpu_ms, host_us) in run.time_interleaved(calls).items():
        row[f"t_{name}_ms"], row[f"host_{name}_us"] = gpu_ms, host_us
    if not gemm_reason:  # E and speedup need T_gemm_fp8 and T_seq_fp8
        efficiency(row, row["t_fused_fp8_ms"], "_fp8", "_fp8")
        if not torch_reason:
            efficiency(row, row["t_async_tp_fp8_ms"], "_async_tp_fp8", "_fp8")
    row["fused_fp8_over_bf16"] = row["t_fused_bf16_ms"] / row["t_fused_fp8_ms"]
    row["gemm_fp8_status"], row["async_tp_fp8_status"] = gemm_reason or "ok", torch_reason or "ok"


COLUMNS = [  # key, header, width, format ("s": text)
    ("proj", "proj", 23, "s"), ("m", "M", 6, "d"), ("n", "N", 6, "d"), ("k_per_rank", "K/P", 6, "d"),
    ("t_gemm_ms", "T_gemm(ms)", 10, ".4f"), ("t_comm_ring_ms", "T_ring(ms)", 10, ".4f"),
    ("t_comm_sym_ms", "T_sym(ms)", 9, ".4f"), ("t_comm_ms", "T_comm(ms)", 10, ".4f"), ("seq_path", "seq", 4, "s"),
    ("t_seq_ms", "T_seq(ms)", 10, ".4f"), ("t_fused_ms", "T_fused(ms)", 11, ".4f"),
    ("E", "E", 6, ".3f"), ("E_hideable", "E_hide", 6, ".3f"), ("speedup", "speedup", 7, ".3f"),
    ("t_async_tp_ms", "T_asyncTP(ms)", 13, ".4f"), ("E_async_tp", "E_aTP", 6, ".3f"),
    ("speedup_async_tp", "spd_aTP", 7, ".3f"), ("host_gemm_us", "host_mm(us)", 11, ".1f"),
    ("host_seq_us", "host_mm+rs(us)", 14, ".1f"), ("host_fused_us", "host_fus(us)", 12, ".1f"),
    ("host_async_tp_us", "host_aTP(us)", 12, ".1f"), ("rule", "rule", 4, "s"), ("rule_async_tp", "rule_aTP", 8, "s"),
    ("wrong", "#wrong", 6, "d"), ("status", "status", 0, "s")
]
FP8_COLUMNS = [  # --fp8's, before #wrong and status
    ("t_gemm_fp8_ms", "T_gemm_fp8(ms)", 14, ".4f"), ("t_seq_fp8_ms", "T_seq_fp8(ms)", 13, ".4f"),
    ("t_fused_fp8_ms", "T_fused_fp8(ms)", 15, ".4f"), ("E_fp8", "E_fp8", 6, ".3f"),
    ("E_hideable_fp8", "E_hide_fp8", 10, ".3f"), ("speedup_fp8", "speedup_fp8", 11, ".3f"),
    ("t_async_tp_fp8_ms", "T_asyncTP_fp8(ms)", 17, ".4f"), ("E_async_tp_fp8", "E_aTP_fp8", 9, ".3f"),
    ("speedup_async_tp_fp8", "spd_aTP_fp8", 11, ".3f"), ("t_fused_bf16_ms", "T_fused_bf16(ms)", 16, ".4f"),
    ("fused_fp8_over_bf16", "bf16/fp8", 8, ".3f"), ("host_fused_fp8_us", "host_fus_fp8(us)", 16, ".1f"),
    ("host_async_tp_fp8_us", "host_aTP_fp8(us)", 16, ".1f"), ("rule_fp8", "rule_fp8", 8, "s"),
    ("rule_async_tp_fp8", "rule_aTP_fp8", 12, "s")
]


def table_columns(fp8: bool) -> list:
    return COLUMNS[:-2] + FP8_COLUMNS + COLUMNS[-2:] if fp8 else COLUMNS


def table_line(row: dict, columns: list = COLUMNS) -> str:
    cells = []
    for key, _, width, form in columns:
        value = row.get(key)
        if value is None:
            cells.append("-".rjust(width))
        elif form == "s":
            cells.append(f"{value:<{width}}")
        else:
            cells.append(f"{value:>{width}{form}}")
    return "  " + " ".join(cells)


def header_line(columns: list = COLUMNS) -> str:
    return "# " + " ".join(f"{header:<{width}}" if form == "s" else f"{header:>{width}}"
                           for _, header, width, form in columns)


def finite_or_none(value):
    """JSON has no NaN or infinity: those become null, as in tpfuse_bench's JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_or_none(item) for item in value]
    return value


def geomean(values: list):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list, fp8: bool = False) -> dict:
    summary = {"shapes": len(rows)}
    fused_ops = [("", "fused", ""), ("_async_tp", "async_tp", "")]  # row suffix, name, inputs (efficiency's)
    if fp8:
        fused_ops += [("_fp8", "fused_fp8", "_fp8"), ("_async_tp_fp8", "async_tp_fp8", "_fp8")]
    for suffix, name, inputs in fused_ops:
        ran = [row for row in rows if ("E" + suffix) in row]
        bound = [row for row in ran if row["t_comm_ms"] <= row[f"t_gemm{inputs}_ms"]]
        prefix = suffix[1:] + "_" if suffix else ""
        summary[f"{name}_ran"] = len(ran)
        if suffix == inputs:
            summary[f"{prefix}compute_bound"] = len(bound)
        summary[f"{prefix}E_met"] = sum(row["E" + suffix] >= TARGET_E for row in bound)
        summary[f"{prefix}E_hideable_met"] = sum(row["E_hideable" + suffix] >= TARGET_E for row in ran)
        if bound:
            summary[f"{prefix}E_min"] = min(row["E" + suffix] for row in bound)
        if ran:
            summary[f"{prefix}E_hideable_min"] = min(row["E_hideable" + suffix] for row in ran)
            summary[f"{prefix}speedup_geomean"] = geomean([row["speedup" + suffix] for row in ran])
        summary[f"{prefix}rule_failures"] = sum(row.get("rule" + suffix) == "FAIL" for row in rows)
    ratios = [("fused_over_async_tp", "fused", "async_tp")]  # name, tpfuse's call, the call it is set against
    if fp8:
        ratios += [("fused_fp8_over_async_tp_fp8", "fused_fp8", "async_tp_fp8"),
                   ("fused_fp8_over_bf16", "fused_fp8", "fused_bf16")]
    for name, ours, other in ratios:  # T_other / T_ours over the shapes that timed both
        both = [row for row in rows if f"t_{other}_ms" in row and f"t_{ours}_ms" in row]
        if both:
            summary[f"{name}_geomean"] = geomean([row[f"t_{other}_ms"] / row[f"t_{ours}_ms"] for row in both])
    for inputs in ("", "_fp8") if fp8 else ("",):
        timed = [row for row in rows if f"host_fused{inputs}_us" in row and f"host_gemm{inputs}_us" in row]
        if timed:  # the host time of a tpfuse call beyond torch.mm's or torch._scaled_mm's (issue 41's budget: 10 us)
            summary[f"host_fused{inputs}_over_mm_us_max"] = max(
                row[f"host_fused{inputs}_us"] - row[f"host_gemm{inputs}_us"] for row in timed)
    summary["wrong"] = sum(row.get("wrong", 0) for row in rows)
    summary["failed"] = sum(not row.get("status", "").startswith(("ok", "skipped")) for row in rows)
    return summary


def loaded_library_version(prefix: str, query) -> str:
    """The version of the first loaded library whose file name starts with `prefix`, by query(dll)."""
    for path in _library.loaded_library_paths(prefix):
        try:
            return query(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    return "unknown"


def cuda_driver_version() -> str:
    def query(dll):
        version = ctypes.c_int()
        dll.cuDriverGetVersion(ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    return loaded_library_version("libcuda.so", query)


def cublas_version() -> str:
    def query(dll):
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            dll.cublasGetProperty(prop, ctypes.byref(value))
            parts.append(str(value.value))
        return ".".join(parts)
    return loaded_library_version("libcublas.so", query)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def meta(run: Run, args, seed: int) -> dict:
    nccl = tpfuse.nccl_info()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
        "gpu": torch.cuda.get_device_name(run.device),
        "gpu_count": run.world_size,
        "gpus_visible": torch.cuda.device_count(),
        "cuda_driver_api": cuda_driver_version(),
        "cuda_runtime": torch.version.cuda,
        "cublas": cublas_version(),
        "nccl": _library.version_string(nccl.runtime_version),
        "git_commit": args.git_commit or git_commit(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "nccl_library": nccl.path,
        "options": {"mode": "python", "warmup": args.warmup, "iters": args.iters, "check": args.check,
                    "shapes": args.shapes, "tp": args.tp, "layout": args.layout, "gpus": run.world_size,
                    "seed": seed, "gate": args.gate, "fp8": args.fp8, "fast_accum": args.fast_accum},
    }


def comparison(args) -> str:
    """What the run sets against what, for the summary line."""
    text = ("tpfuse.gemm_reduce_scatter against torch.mm + reduce_scatter_tensor and torch's "
            "fused_matmul_reduce_scatter")
    if args.fp8:
        accumulation = ", fast accumulation" if args.fast_accum else ""
        torch_fused = "" if args.fp8 == "blockwise" else ", torch's fused_scaled_matmul_reduce_scatter"
        text += (f"; on E4M3 inputs ({args.fp8} scales{accumulation}) against torch._scaled_mm + "
                 f"reduce_scatter_tensor{torch_fused} and tpfuse's BF16 call")
    return text


def main(argv=None) -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    args = parse_args(argv)
    shapes = parse_shapes(args.shapes, args.tp)
    run = Run(args)
    # async-TP's workspace: symmetric memory for the group (torch 2.11 needs it enabled explicitly).
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(run.group.group_name)
    seed_tensor = torch.tensor([args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")],
                               device=run.device)
    dist.broadcast(seed_tensor, src=0, group=run.group)
    seed = int(seed_tensor.item())
    info = meta(run, args, seed)
    notes = [
        f"tpfuse.bench {info['git_commit']} on {info['hostname']}, {run.world_size} x {info['gpu']}; torch "
        f"{info['torch']}, CUDA driver API {info['cuda_driver_api']}, runtime {info['cuda_runtime']}, cuBLAS "
        f"{info['cublas']}, NCCL {info['nccl']} ({info['nccl_library']})",
        f"layout {args.layout}, K per rank = K / {args.tp}, warmup {args.warmup}, iters {args.iters}, "
        f"{'check, ' if args.check else ''}{'gate' if args.gate else 'no gate'}, seed {seed}",
        "times in ms: median of the iterations, each the slowest rank's; E = (T_gemm + T_comm - T_fused) / T_comm, "
        "E_hideable = the same over min(T_gemm, T_comm), speedup = T_seq / T_fused; *_async_tp: the same for "
        "torch.ops.symm_mem.fused_matmul_reduce_scatter; host_*_us: time to queue one call (host_mm: torch.mm, "
        "host_mm+rs: torch.mm + reduce_scatter_tensor, host_fus: tpfuse.gemm_reduce_scatter)",
        f"rule: each of the fused op's errors (max and L2, relative to the FP32 reference reduce-scatter) <= "
        f"{ERROR_FACTOR}x the unfused path's (torch.mm + reduce_scatter_tensor)",
    ]
    if args.fp8:
        unfused = "torch._scaled_mm + reduce_scatter_tensor's"
        if args.fp8 == "blockwise":
            unfused = ("torch._scaled_mm's tensorwise product of each 128 of K, scaled and summed in FP32, + "
                       "reduce_scatter_tensor's")
        notes.append(
            f"*_fp8: E4M3 inputs (w N x K/P whatever the layout), {args.fp8} FP32 scales, use_fast_accum "
            f"{args.fast_accum}, timed interleaved in one loop: T_gemm_fp8 torch._scaled_mm, T_seq_fp8 it + T_seq's "
            "reduce-scatter, T_fused_fp8 tpfuse.gemm_reduce_scatter, *_async_tp_fp8 "
            "torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter, T_fused_bf16 tpfuse's BF16 call, "
            "fused_fp8_over_bf16 = T_fused_bf16 / T_fused_fp8; E_fp8 and speedup_fp8 as above with T_gemm_fp8 and "
            "T_seq_fp8; *_async_tp_fp8 left out where torch's op raises or has no form for the scales, T_gemm_fp8 and "
            "T_seq_fp8 where torch._scaled_mm refuses blockwise scales (async_tp_fp8_status, gemm_fp8_status: why); "
            f"rule_fp8: errors against the FP64 reference of the dequantized inputs <= {ERROR_FACTOR}x {unfused}")
    for note in notes:
        run.log(note)
    columns = table_columns(args.fp8 is not None)
    if run.rank == 0:
        print(header_line(columns), flush=True)
    rows = []
    for index, shape in enumerate(shapes):
        run.log(f"shape {index + 1}/{len(shapes)}: {shape.proj} M={shape.m} N={shape.n} K/P={shape.k_per_rank}")
        try:
            row = run_shape(shape, index, run, seed)
        except RuntimeError as error:  # a TpfuseError, or torch's (out of memory): the next shape still runs
            row = {"proj": shape.proj, "m": shape.m, "n": shape.n, "k_per_rank": shape.k_per_rank,
                   "wrong": 0, "status": f"{type(error).__name__}: {error}"}
        rows.append(row)
        if run.rank == 0:
            print(table_line(row, columns), flush=True)
        torch.cuda.empty_cache()
    summary = summarize(rows, args.fp8 is not None)
    run.log(f"summary of {comparison(args)}: " + ", ".join(
        f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}" for key, value in summary.items()))
    if run.rank == 0 and args.json:
        with open(args.json, "w") as file:
            json.dump(finite_or_none({"meta": info, "notes": notes, "results": rows, "summary": summary}), file,
                      indent=2)
            file.write("\n")
        run.log(f"wrote {args.json}")
    tpfuse.close()
    dist.destroy_process_group()
    rule_failures = summary["rule_failures"] + summary.get("fp8_rule_failures", 0)
    return 1 if rule_failures or summary["wrong"] or summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
