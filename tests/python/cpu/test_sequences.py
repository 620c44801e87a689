"""Sharded sequences (the ops' batch, the drop-ins' scatter_dim / gather_dim past 0) and the bias, on a
simulated group (simulated_group.py) at P = 2, 4 and 8.

The references are torch's own definitions, in float64: a reduce-scatter along dim d keeps this rank's
chunk along d of the sum, an all-gather along d concatenates every rank's tensor along d. The simulated
launches are first checked against the C ABI's row formulas, written out index by index, so that the
other tests here (and test_symm_mem_override.py's) stand on a simulation that is right. Entries are small
integers: every value below is an integer of at most 256, exact in BF16, so BF16 results equal the
references exactly."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import tpfuse
from tpfuse._checks import AllGatherProblem, Problem
from simulated_group import SimulatedGroup

BF16 = torch.bfloat16
SIZES = [2, 4, 8]
SLAB = 64  # with batch > 1, a rank's rows of each sequence are whole slabs


@pytest.fixture(scope="module")
def groups():
    """Groups of 2, 4 and 8 ranks of a fake world of 8 (the simulation gives the threads their ranks)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield {2: dist.new_group(ranks=[0, 1]), 4: dist.new_group(ranks=[0, 1, 2, 3]), 8: dist.group.WORLD}
    dist.destroy_process_group()


def ints(*shape, seed):
    """BF16 entries in {-1, 0, 1}."""
    return torch.randint(-1, 2, shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


def per_rank(p, *shape, seed):
    return [ints(*shape, seed=100 * seed + rank) for rank in range(p)]


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("batch", [1, 3])
def test_simulated_launches_follow_the_c_abis_row_formulas(groups, monkeypatch, p, batch):
    s, k, n = 2 * p, 8, 8  # the launches themselves have no slab rule
    sim = SimulatedGroup(groups[p], monkeypatch)
    a, w, x = per_rank(p, batch * s, k, seed=1), per_rank(p, n, k, seed=2), per_rank(p, batch * s // p, k, seed=3)
    bias = ints(n, seed=4)

    def launch(rank):
        out = torch.empty(batch * s // p, n, dtype=BF16)
        y, gathered = torch.empty(batch * s, n, dtype=BF16), torch.empty(batch * s, k, dtype=BF16)
        sim._launch(a[rank], w[rank], bias, out, Problem(batch * s, n, k, p, "nk", batch), "")
        problem = AllGatherProblem(batch * s, n, k, p, "nk", batch)
        sim._launch_all_gather(x[rank], w[rank], bias, y, gathered, problem, "")
        return out, y, gathered

    results = sim.run(launch)
    reduced = sum(a[r].double() @ w[r].double().t() for r in range(p))
    shard = s // p
    for d, (out, y, gathered) in enumerate(results):
        for i in range(batch):
            for j in range(shard):
                # out row i*(s/P) + j is the reduced row i*s + d*(s/P) + j, plus the bias
                assert torch.equal(out[i * shard + j].double(), reduced[i * s + d * shard + j] + bias.double())
                for r in range(p):
                    # y row i*s + r*(s/P) + j is (x_r row i*(s/P) + j) @ w, plus the bias; gathered_x the same rows
                    assert torch.equal(gathered[i * s + r * shard + j], x[r][i * shard + j])
                    assert torch.equal(y[i * s + r * shard + j].double(),
                                       x[r][i * shard + j].double() @ w[d].double().t() + bias.double())


def reduce_scatter_reference(partials, dim, rank, p, bias=None):
    """torch's reduce-scatter along `dim` of the float64 sum of the partials: this rank's chunk, plus the bias."""
    rows = sum(partial.double() for partial in partials).chunk(p, dim=dim)[rank]
    return rows if bias is None else rows + bias.double()


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("use_out", [False, True])
def test_gemm_reduce_scatter_keeps_this_ranks_rows_of_every_sequence(groups, monkeypatch, p, batch, with_bias,
                                                                     use_out):
    s, k, n = SLAB * p, 8, 16
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    a, w = per_rank(p, batch * s, k, seed=5), per_rank(p, k, n, seed=6)
    bias = ints(n, seed=7) if with_bias else None

    def call(rank):
        out = torch.full((batch * s // p, n), float("nan"), dtype=BF16) if use_out else None
        return tpfuse.gemm_reduce_scatter(a[rank], w[rank], group, weight_layout="kn", out=out, bias=bias,
                                          batch=batch)

    partials = [(a[r].double() @ w[r].double()).view(batch, s, n) for r in range(p)]
    for rank, out in enumerate(sim.run(call)):
        assert torch.equal(out.double().view(batch, s // p, n), reduce_scatter_reference(partials, 1, rank, p, bias))


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("return_gathered", [False, True])
def test_all_gather_gemm_gathers_every_sequence_in_rank_order(groups, monkeypatch, p, batch, with_bias,
                                                             return_gathered):
    shard, k, n = SLAB, 16, 8
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    x, w = per_rank(p, batch * shard, k, seed=8), per_rank(p, n, k, seed=9)
    bias = ints(n, seed=10) if with_bias else None
    results = sim.run(lambda rank: tpfuse.all_gather_gemm(x[rank], w[rank], group, return_gathered=return_gathered,
                                                          bias=bias, batch=batch))
    gathered = torch.cat([part.double().view(batch, shard, k) for part in x], dim=1)  # all-gather along dim 1
    for rank, result in enumerate(results):
        y = result[0] if return_gathered else result
        expected = gathered @ w[rank].double().t() + (0 if bias is None else bias.double())
        assert torch.equal(y.double().view(batch, p * shard, n), expected)
        if return_gathered:
            assert torch.equal(result[1].double().view(batch, p * shard, k), gathered)


# A (..., K/P) and the dimension split over the ranks: rows of a sequence (the dimensions from it on but the
# last) a multiple of 64 * P where the batch (the dimensions before it) is more than 1.
DROP_IN_SHAPES = [((8, 3), 0), ((2, 64), 1), ((2, 16, 4), 1), ((3, 2, 64), 2), ((1, 4, 8), 1)]


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("leading, dim", DROP_IN_SHAPES)
def test_drop_ins_split_any_dimension_but_the_last(groups, monkeypatch, p, leading, dim):
    k, n = 8, 16
    shape = list(leading)
    shape[dim] *= p  # A's extent on the split dimension divides by P
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    A, weights = per_rank(p, *shape, k, seed=11), per_rank(p, n, k, seed=12)  # nn.Linear weights, used as B = w.t()
    ups = per_rank(p, k, 8, seed=13)  # a second B, stored K x N

    def call(rank):
        out = tpfuse.fused_matmul_reduce_scatter(A[rank], weights[rank].t(), "sum", dim, group.group_name)
        shard = A[rank].chunk(p, dim=dim)[0].contiguous() + rank  # this rank's shard of a tensor split along dim
        gathered, (y, y_up) = tpfuse.fused_all_gather_matmul(shard, [weights[rank].t(), ups[rank]], dim,
                                                              group.group_name)
        return out, shard, gathered, y, y_up

    results = sim.run(call)
    partials = [A[r].double() @ weights[r].double().t() for r in range(p)]
    shards = [shard for _, shard, _, _, _ in results]
    gathered = torch.cat([shard.double() for shard in shards], dim=dim)
    for rank, (out, _, gathered_A, y, y_up) in enumerate(results):
        assert torch.equal(out.double(), reduce_scatter_reference(partials, dim, rank, p))
        assert torch.equal(gathered_A.double(), gathered)
        assert torch.equal(y.double(), gathered @ weights[rank].double().t())
        assert torch.equal(y_up.double(), gathered @ ups[rank].double())
