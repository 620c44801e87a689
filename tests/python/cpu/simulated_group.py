"""A process group simulated on CPU: its P ranks are P threads of this process, and the points where
tpfuse's ops hand off to the library (_ops._launch, _launch_all_gather, _gemm) and tpfuse.autograd's plain
collectives compute, in plain torch, from every rank's tensors: the reduce-scatter sums every rank's
partial (FP64) and keeps this rank's rows, the all-gather stacks every rank's rows in rank order; the
launches do it per sequence (the C ABI's batch) and add the bias in FP64 before the one cast.
Everything above those points (the custom ops, their argument checks, the backward formulas, the layers)
is the package's own code."""

import threading

import torch

from tpfuse import _ops
from tpfuse import autograd as tpfuse_autograd
from tpfuse.checking import weight_as_k_by_n


class SimulatedGroup:
    """Runs fn(rank) on P threads; collectives meet at a barrier. `rank_order` is the order in which the
    all-gather stacks the ranks' rows (range(P) is right; anything else is a deliberately wrong backend)."""

    def __init__(self, group, monkeypatch, rank_order=None):
        self.size = group.size()
        self.rank_order = list(range(self.size)) if rank_order is None else list(rank_order)
        self._barrier = threading.Barrier(self.size, timeout=60)
        self._slots = [None] * self.size
        self._local = threading.local()
        monkeypatch.setattr(_ops, "_launch", self._launch)
        monkeypatch.setattr(_ops, "_launch_all_gather", self._launch_all_gather)
        monkeypatch.setattr(_ops, "_gemm", self._gemm)
        monkeypatch.setattr(_ops, "check_placement", lambda *named: None)  # CUDA placement: CPU tensors here
        monkeypatch.setattr(tpfuse_autograd, "gather_rows", lambda x, group_name, size: self.gather(x))
        monkeypatch.setattr(tpfuse_autograd, "reduce_scatter_rows", lambda x, group_name, size: self.reduce_scatter(x))
        self.launches = []  # (rank, op) of every simulated launch

    @property
    def rank(self) -> int:
        return self._local.rank

    def _exchange(self, value):
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

    def _sequences(self, rows: torch.Tensor, batch: int) -> torch.Tensor:
        """rows (batch sequences one after the other) as (batch, P, S/P, columns): [i, d] is rank d's share
        of sequence i."""
        return rows.view(batch, self.size, -1, rows.shape[-1])

    def _launch(self, a, w, bias, out, problem, group_name):
        """The contract of tpfuse_gemm_reduce_scatter: this rank keeps its S/P rows of each of the batch
        sequences of the summed product, sequence after sequence, plus the bias, rounded once."""
        self.launches.append((self.rank, "gemm_reduce_scatter"))
        partial = a.double() @ weight_as_k_by_n(w, problem.weight_layout).double()
        total = torch.stack(self._exchange(partial)).sum(0)
        rows = self._sequences(total, problem.batch)[:, self.rank].reshape(out.shape)
        out.copy_(rows if bias is None else rows + bias.double())

    def _launch_all_gather(self, x, w, bias, y, gathered_x, problem, group_name):
        """The contract of tpfuse_all_gather_gemm: each sequence's rows gathered in rank order, sequence
        after sequence, times w, plus the bias, rounded once."""
        self.launches.append((self.rank, "all_gather_gemm"))
        parts = self._exchange(x)
        shards = [parts[r].view(problem.batch, -1, x.shape[1]) for r in self.rank_order]
        gathered = torch.cat(shards, dim=1).view(problem.m, problem.k)
        product = gathered.double() @ weight_as_k_by_n(w, problem.weight_layout).double()
        y.copy_(product if bias is None else product + bias.double())
        if gathered_x is not None:
            gathered_x.copy_(gathered)

    def _gemm(self, a, w, out, problem):
        self.launches.append((self.rank, "gemm"))
        out.copy_(a.double() @ weight_as_k_by_n(w, problem.weight_layout).double())

    def run(self, fn):
        """[fn(0), ..., fn(P-1)], each on its own thread (P = 1: on this one); the first exception is raised."""
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

        threads = [threading.Thread(target=body, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        real = [error for error in errors if not isinstance(error, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return results
