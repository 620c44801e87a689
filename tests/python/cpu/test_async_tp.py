"""torch's own async-TP pass (Inductor's micro-pipeline TP, torch._inductor.config._micro_pipeline_tp, as
TorchTitan turns it on) on a TorchTitan-shaped block, under tpfuse.use_for_symm_mem(), at simulated
P = 2, 4 and 8 (simulated_group.py; the override registered on the CPU key, a Hopper GPU assumed).

The block is a transformer layer with sequence parallelism on [b, s, h] activations sharded on dim 1
(TorchTitan's Shard(1)): attention's wq, wk, wv column-parallel on the gathered x and wo row-parallel,
then a SwiGLU MLP (w1, w3 column-parallel, w2 row-parallel), residuals around both. Integer-preserving
stand-ins replace softmax attention (q * k + v) and SiLU (relu), so that every value is a small integer:
outputs and gradients must equal a float64 single-device reference exactly.

What the pass fuses (checked with torch 2.7, 2.11, 2.13 and 2.15): the forward's two all-gathers and two
reduce-scatters along dim 1, from torch 2.7 (the floor) on; the backward's two all-gathers of the
gradient (which Inductor writes as slices and a cat) from torch 2.13 on. The backward's reduce-scatters
sum several matmuls (q, k, v; gate and up) and are never fused: torch's own reduce-scatter runs them
(the simulated group's), and torch 2.10 to 2.12 log "no producer matmul found for reduce scatter" for
them."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed._symmetric_memory as symmetric_memory
from torch.testing._internal.distributed.fake_pg import FakeStore

import tpfuse
from tpfuse import symm_mem
from simulated_group import SimulatedGroup

BF16 = torch.bfloat16
SIZES = [2, 4, 8]
BATCH, TOKENS_PER_RANK, HIDDEN, WIDTH_PER_RANK = 2, 2, 8, 8  # [b, s/P, h]; each rank's heads and MLP columns
EXACT_LIMIT = 256
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
FUSES_GRADIENT_ALL_GATHERS = (2, 13)  # the pass matches the slice/cat form of an all-gather from here on


def block(group, x, wq, wk, wv, wo, w1, w3, w2):
    """One rank's layer: x [b, s/P, h] its tokens; wq, wk, wv, w1, w3 its output rows, wo, w2 its input
    columns (nn.Linear's layout)."""
    X = funcol.all_gather_tensor_autograd(x, 1, group)
    attention = (X @ wq.t()) * (X @ wk.t()) + X @ wv.t()
    h = x + funcol.reduce_scatter_tensor_autograd(attention @ wo.t(), "sum", 1, group)
    H = funcol.all_gather_tensor_autograd(h, 1, group)
    return h + funcol.reduce_scatter_tensor_autograd(torch.relu(H @ w1.t()) * (H @ w3.t()) @ w2.t(), "sum", 1, group)


def reference_block(x, wq, wk, wv, wo, w1, w3, w2):
    """The same layer on one device, whole weights, float64."""
    h = x + ((x @ wq.t()) * (x @ wk.t()) + x @ wv.t()) @ wo.t()
    return h + (torch.relu(h @ w1.t()) * (h @ w3.t())) @ w2.t()


COLUMN, ROW = 0, 1  # the dimension along which a weight is split over the ranks
WEIGHTS = [("wq", COLUMN), ("wk", COLUMN), ("wv", COLUMN), ("wo", ROW), ("w1", COLUMN), ("w3", COLUMN), ("w2", ROW)]


def sparse_integers(*shape, generator, density):
    """Entries -1 or 1 with probability density, else 0."""
    values = torch.randint(0, 2, shape, generator=generator) * 2 - 1
    return (values * (torch.rand(shape, generator=generator) < density)).double()


class Case:
    """Whole float64 inputs, each rank's BF16 shards, and the reference output and gradients."""

    def __init__(self, p, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.p = p
        width = WIDTH_PER_RANK * p
        self.x = sparse_integers(BATCH, TOKENS_PER_RANK * p, HIDDEN, generator=generator, density=0.25)
        self.g = sparse_integers(BATCH, TOKENS_PER_RANK * p, HIDDEN, generator=generator, density=0.25)
        shapes = {COLUMN: (width, HIDDEN), ROW: (HIDDEN, width)}
        self.weights = [sparse_integers(*shapes[dim], generator=generator, density=0.125) for _, dim in WEIGHTS]
        leaves = [t.clone().requires_grad_() for t in (self.x, *self.weights)]
        self.out = reference_block(*leaves)
        (self.out * self.g).sum().backward()
        self.grads = [leaf.grad for leaf in leaves]
        for value in (self.out, *self.grads):
            assert value.abs().max() <= EXACT_LIMIT, "the test's premise: every value exact in BF16"

    def shard(self, tensor, dim, rank):
        return tensor.chunk(self.p, dim=dim)[rank]

    def inputs(self, rank):
        """This rank's x and weights, BF16 leaves that require grad."""
        shards = [self.shard(self.x, 1, rank)] + [self.shard(w, dim, rank) for w, (_, dim) in
                                                  zip(self.weights, WEIGHTS)]
        return [shard.to(BF16).requires_grad_() for shard in shards]

    def mismatches(self, rank, out, grads):
        names = ["out", "x.grad"] + [f"{name}.grad" for name, _ in WEIGHTS]
        expected = [self.shard(self.out, 1, rank), self.shard(self.grads[0], 1, rank)] + \
            [self.shard(grad, dim, rank) for grad, (_, dim) in zip(self.grads[1:], WEIGHTS)]
        return [f"rank {rank} {name}" for name, ours, reference in zip(names, [out, *grads], expected)
                if ours is None or not torch.equal(ours.double(), reference)]


@pytest.fixture(scope="module")
def groups():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield {2: dist.new_group(ranks=[0, 1]), 4: dist.new_group(ranks=[0, 1, 2, 3]), 8: dist.group.WORLD}
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=SIZES, ids=lambda p: f"P={p}")
def compiled_run(request, groups):
    """One training step of the block on every rank, compiled once under the pass: (case, each rank's
    (out, gradients), tpfuse.stats() of the step, the simulated launches, Dynamo's graphs compiled by the step)."""
    p, group = request.param, groups[request.param]
    case = Case(p)
    compiled = torch.compile(lambda *inputs: block(group, *inputs), fullgraph=True)

    def step(rank):
        inputs = case.inputs(rank)
        out = compiled(*inputs)
        (out.double() * case.shard(case.g, 1, rank)).sum().backward()
        return out, [tensor.grad for tensor in inputs]

    # Inductor's config.patch, not monkeypatch.setattr, whose undo deletes the option from the config module.
    with pytest.MonkeyPatch.context() as monkeypatch, torch._inductor.config.patch(_micro_pipeline_tp=True):
        monkeypatch.setattr(symm_mem, "_device_fallback", lambda device: None)
        monkeypatch.setattr(symm_mem, "_counts", type(symm_mem._counts)())
        sim = SimulatedGroup(group, monkeypatch)
        # symm_mem's test mode makes every group symm_mem-enabled, as TorchTitan's setup does on GPUs.
        with symm_mem.SymmMemOverride("CPU"), symmetric_memory._test_mode(), sim.torch_collectives():
            sim.rehearse(step)  # compiles forward and backward here, once
            tpfuse.reset_stats()
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            results = sim.run(step)
            compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        yield case, results, tpfuse.stats(), list(sim.launches), compiled_graphs


def test_every_fused_call_is_served_by_tpfuse_and_exact(compiled_run, record_property):
    case, results, stats, launches, compiled_graphs = compiled_run
    record_property("stats", stats)  # the step's tpfuse.stats(), in the JUnit XML
    assert compiled_graphs == 0, "the ranks ran the rehearsal's compiled code"
    for op in symm_mem.OPS:
        assert stats[op]["fallbacks"] == {}, (op, stats[op])
    # Per rank, the forward's two dim-1 all-gathers (wq/wk/wv and w1/w3) and two reduce-scatters (wo, w2).
    assert stats["fused_all_gather_matmul"]["served"] >= 2 * case.p
    assert stats["fused_matmul_reduce_scatter"]["served"] >= 2 * case.p
    assert {op for _, op in launches} == {"all_gather_gemm", "gemm", "gemm_reduce_scatter"}
    wrong = [name for rank, (out, grads) in enumerate(results) for name in case.mismatches(rank, out, grads)]
    assert wrong == []


def test_gradient_all_gathers_are_fused_too(compiled_run):
    if TORCH_VERSION < FUSES_GRADIENT_ALL_GATHERS:
        pytest.skip(f"torch {torch.__version__}'s async-TP pass leaves the backward's dim-1 all-gathers unfused "
                    "(their slice/cat form is matched from torch 2.13 on)")
    case, _, stats, _, _ = compiled_run
    # Per rank, the backward's all-gathers of wo's and w2's output gradients join the forward's two.
    assert stats["fused_all_gather_matmul"]["served"] == 4 * case.p
    assert stats["fused_matmul_reduce_scatter"]["served"] == 2 * case.p
