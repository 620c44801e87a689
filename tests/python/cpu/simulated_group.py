"""A process group simulated on CPU: its P ranks are P threads of this process, and the points where
tpfuse's ops hand off to the library (_ops._launch, _launch_all_gather, _gemm) and tpfuse.autograd's plain
collectives compute, in plain torch, from every rank's tensors: the reduce-scatter sums every rank's
partial (FP64) and keeps this rank's rows, the all-gather stacks every rank's rows in rank order; the
launches do it per sequence (the C ABI's batch), scale FP8 products by the activations' scale times w_scale
(rowwise and blockwise, the all-gather gathers x_scale with the rows; blockwise, each 128 of K's products
by their own scales) and add the bias in FP64 before the one cast.
Everything above those points (the custom ops, their argument checks, the backward formulas, the layers)
is the package's own code."""

import contextlib
import contextvars
import threading

import torch

from tpfuse import _library, _ops
from tpfuse import autograd as tpfuse_autograd
from tpfuse.checking import weight_as_k_by_n


ROWWISE, BLOCKWISE = _library.SCALING_CODES["rowwise"], _library.SCALING_CODES["blockwise"]
SCALE_BLOCK = 128


def _blockwise_product(a, w_kn, a_scale, w_scale):
    """The FP64 product of E4M3 a (M x K) and w_kn (K x N) with blockwise scales: each 128 of K's products summed,
    times a_scale's column of that block (one per row) and w_scale's (one per 128 columns of the product)."""
    total = 0
    for block in range(a.shape[1] // SCALE_BLOCK):
        k = slice(block * SCALE_BLOCK, (block + 1) * SCALE_BLOCK)
        column_scales = w_scale[:, block].double().repeat_interleave(SCALE_BLOCK)[:w_kn.shape[1]]
        total = total + (a[:, k].double() @ w_kn[k].double()) * a_scale[:, block:block + 1].double() * column_scales
    return total


def _scaled(product, a_scale, w_scale):
    """An FP8 product (FP64) scaled as torch._scaled_mm scales it: by one element each, or by one scale per row
    and one per column; BF16 products (no scales) as they are."""
    if a_scale is None:
        return product
    tensorwise = a_scale.numel() == 1 and w_scale.numel() == 1
    product = product * (a_scale.double().reshape(()) if tensorwise else a_scale.double().reshape(-1, 1))
    return product * (w_scale.double().reshape(()) if tensorwise else w_scale.double().reshape(1, -1))


class SimulatedGroup:
    """Runs fn(rank) on P threads; collectives meet at a barrier. `rank_order` is the order in which the
    all-gather stacks the ranks' rows (range(P) is right; anything else is a deliberately wrong backend).

    torch.compile: compile once, in rehearse(), then run() every rank on the compiled code. Compiling in the
    rank threads instead goes wrong two ways: torch's config overrides (torch._inductor.config, from
    torch 2.15 on) are per thread, so a thread does not see the test's (run() gives each thread a copy of
    the caller's context, so they do), and P threads compiling the same function at once each compile it,
    serially under Dynamo's lock, behind ranks already waiting at a collective."""

    def __init__(self, group, monkeypatch, rank_order=None):
        self.size = group.size()
        self.rank_order = list(range(self.size)) if rank_order is None else list(rank_order)
        self._barrier = threading.Barrier(self.size, timeout=60)
        self._slots = [None] * self.size
        self._local = threading.local()
        self._rehearsing = False
        monkeypatch.setattr(_ops, "_launch", self._launch)
        monkeypatch.setattr(_ops, "_launch_all_gather", self._launch_all_gather)
        monkeypatch.setattr(_ops, "_gemm", self._gemm)
        monkeypatch.setattr(_ops, "check_placement", lambda *named, scales=(): None)  # CUDA placement: CPU tensors here
        monkeypatch.setattr(tpfuse_autograd, "gather_rows", lambda x, group_name, size: self.gather(x))
        monkeypatch.setattr(tpfuse_autograd, "reduce_scatter_rows", lambda x, group_name, size: self.reduce_scatter(x))
        self.launches = []  # (rank, op) of every simulated launch
        self.problems = []  # the Problem of every simulated reduce-scatter launch
        self.all_gather_problems = []  # the AllGatherProblem of every simulated all-gather launch

    @property
    def rank(self) -> int:
        return self._local.rank

    def _exchange(self, value):
        if self._rehearsing:
            return [value] * self.size
        self._slots[self.rank] = value
        self._barrier.wait()
        values = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return values

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:  # no exchange: traceable where torch.compile traces a backward calling it
            return x
        parts = self._exchange(x)
        return torch.cat([parts[r] for r in self.rank_order])

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.stack([part.double() for part in self._exchange(x)]).sum(0)
        rows = x.shape[0] // self.size
        return total[self.rank * rows:(self.rank + 1) * rows].to(x.dtype)

    @contextlib.contextmanager
    def torch_collectives(self):
        """Inside: torch's functional all-gather and reduce-scatter (the _c10d_functional ops that compiled
        graphs call, dim 0; the fake process group's own compute nothing) on CPU tensors are this group's,
        for the collectives a graph keeps unfused."""
        lib = torch.library.Library("_c10d_functional", "IMPL")  # noqa: TOR901 -- destroyed on leaving
        lib.impl("all_gather_into_tensor", lambda x, size, group_name: self.gather(x.contiguous()), "CPU")
        lib.impl("reduce_scatter_tensor", lambda x, op, size, group_name: self.reduce_scatter(x.contiguous()), "CPU")
        try:
            yield
        finally:
            lib._destroy()

    def _sequences(self, rows: torch.Tensor, batch: int) -> torch.Tensor:
        """rows (batch sequences one after the other) as (batch, P, S/P, columns): [i, d] is rank d's share
        of sequence i."""
        return rows.view(batch, self.size, -1, rows.shape[-1])

    def _launch(self, a, w, bias, out, problem, group_name, a_scale=None, w_scale=None):
        """The contract of tpfuse_gemm_reduce_scatter: this rank keeps its S/P rows of each of the batch
        sequences of the summed product (each rank's scaled by a_scale * w_scale: one element each, one per
        row of a and one per column, or blockwise per 128 of K), sequence after sequence, plus the bias, rounded
        once."""
        self.launches.append((self.rank, "gemm_reduce_scatter"))
        self.problems.append(problem)
        w_kn = weight_as_k_by_n(w, problem.weight_layout)
        if problem.scaling == BLOCKWISE:
            partial = _blockwise_product(a, w_kn, a_scale, w_scale)
        else:
            partial = _scaled(a.double() @ w_kn.double(), a_scale, w_scale)
        total = torch.stack(self._exchange(partial)).sum(0)
        rows = self._sequences(total, problem.batch)[:, self.rank].reshape(out.shape)
        out.copy_(rows if bias is None else rows + bias.double())

    def _launch_all_gather(self, x, w, bias, y, gathered_x, problem, group_name, x_scale=None, w_scale=None):
        """The contract of tpfuse_all_gather_gemm: each sequence's rows gathered in rank order, sequence
        after sequence (rowwise and blockwise, each row's x_scale with it), times w, scaled, plus the bias,
        rounded once."""
        self.launches.append((self.rank, "all_gather_gemm"))
        self.all_gather_problems.append(problem)
        per_row = problem.scaling in (ROWWISE, BLOCKWISE)
        # A row's scales travel as more columns of FP64 rows beside x's.
        rows = torch.cat([x.double(), x_scale.double().reshape(x.shape[0], -1)], dim=1) if per_row else x
        parts = self._exchange(rows)
        shards = [parts[r].view(problem.batch, -1, rows.shape[1]) for r in self.rank_order]
        gathered = torch.cat(shards, dim=1).view(problem.m, rows.shape[1])
        k = problem.k
        gathered, gathered_scale = (gathered[:, :k].to(x.dtype), gathered[:, k:]) if per_row else (gathered, x_scale)
        w_kn = weight_as_k_by_n(w, problem.weight_layout)
        if problem.scaling == BLOCKWISE:
            product = _blockwise_product(gathered, w_kn, gathered_scale, w_scale)
        else:
            product = _scaled(gathered.double() @ w_kn.double(), gathered_scale, w_scale)
        y.copy_(product if bias is None else product + bias.double())
        if gathered_x is not None:
            gathered_x.copy_(gathered)

    def _gemm(self, a, w, out, problem):
        self.launches.append((self.rank, "gemm"))
        out.copy_(a.double() @ weight_as_k_by_n(w, problem.weight_layout).double())

    def rehearse(self, fn):
        """fn(0) on this thread, every collective answered as if each rank held this rank's tensors: what
        fn compiles is compiled here, once, under this thread's config. The launches it makes are forgotten."""
        self._local.rank, self._rehearsing = 0, True
        try:
            return fn(0)
        finally:
            self._rehearsing = False
            self.launches.clear()
            self.problems.clear()
            self.all_gather_problems.clear()

    def run(self, fn):
        """[fn(0), ..., fn(P-1)], each on its own thread (P = 1: on this one), in a copy of this thread's
        context; the first exception is raised."""
        if self.size == 1:
            self._local.rank = 0
            return [fn(0)]
        results, errors = [None] * self.size, []

        def body(rank):
            self._local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as error:  # noqa: BLE001 -- re-raised below, after every thread ended
                errors.append(error)
                self._barrier.abort()  # the other ranks stop waiting for this one

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(body, rank))
                   for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        real = [error for error in errors if not isinstance(error, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return results
