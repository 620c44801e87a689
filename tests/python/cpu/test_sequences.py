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


# --- backward: the other op with the same batch; the bias's gradient ---

EXACT_LIMIT = 256  # integers up to 2^8 are exact in BF16


def leaves(tensors, requires_grad=True):
    return [tensor.clone().requires_grad_(requires_grad) for tensor in tensors]


def exact(reference: torch.Tensor) -> torch.Tensor:
    assert reference.abs().max() <= EXACT_LIMIT, "the test's premise: every reference value exact in BF16"
    return reference


def assert_grads_equal(ours, references):
    for name, (mine, reference) in zip(("first", "second", "third", "fourth"), zip(ours, references)):
        assert (mine is None) == (reference is None), name
        if mine is not None:
            assert torch.equal(mine.double(), exact(reference)), f"the {name} input's gradient"


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("input_grad", [True, False])
def test_gemm_reduce_scatter_backward_gathers_with_the_same_batch(groups, monkeypatch, p, batch, input_grad):
    s, k, n = SLAB * p, 8, 16
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    a, w, g = per_rank(p, batch * s, k, seed=20), per_rank(p, n, k, seed=21), per_rank(p, batch * s // p, n, seed=22)
    biases = per_rank(p, n, seed=23)

    def step(rank):
        a_r, (w_r, bias_r) = leaves([a[rank]], input_grad)[0], leaves([w[rank], biases[rank]])
        out = tpfuse.gemm_reduce_scatter(a_r, w_r, group, bias=bias_r, batch=batch)
        (out.double() * g[rank].double()).sum().backward()
        return a_r.grad, w_r.grad, bias_r.grad

    results = sim.run(step)
    A, W, B = leaves([t.double() for t in a]), leaves([t.double() for t in w]), leaves([t.double() for t in biases])
    partials = [(A[r] @ W[r].t()).view(batch, s, n) for r in range(p)]
    sum((reduce_scatter_reference(partials, 1, d, p, B[d]).reshape(-1, n) * g[d].double()).sum()
        for d in range(p)).backward()
    for rank, grads in enumerate(results):
        assert_grads_equal(grads, (A[rank].grad if input_grad else None, W[rank].grad, B[rank].grad))


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("return_gathered", [False, True])
def test_all_gather_gemm_backward_reduce_scatters_with_the_same_batch(groups, monkeypatch, p, batch,
                                                                      return_gathered):
    shard, k, n = SLAB, 16, 8
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    x, w, biases = per_rank(p, batch * shard, k, seed=24), per_rank(p, n, k, seed=25), per_rank(p, n, seed=26)
    g_y, g_gathered = per_rank(p, batch * shard * p, n, seed=27), per_rank(p, batch * shard * p, k, seed=28)

    def step(rank):
        x_r, w_r, bias_r = leaves([x[rank], w[rank], biases[rank]])
        if return_gathered:
            y, gathered = tpfuse.all_gather_gemm(x_r, w_r, group, return_gathered=True, bias=bias_r, batch=batch)
            loss = (y.double() * g_y[rank].double()).sum() + (gathered.double() * g_gathered[rank].double()).sum()
        else:
            y = tpfuse.all_gather_gemm(x_r, w_r, group, bias=bias_r, batch=batch)
            loss = (y.double() * g_y[rank].double()).sum()
        loss.backward()
        return x_r.grad, w_r.grad, bias_r.grad

    results = sim.run(step)
    X, W, B = leaves([t.double() for t in x]), leaves([t.double() for t in w]), leaves([t.double() for t in biases])
    gathered = torch.cat([part.view(batch, shard, k) for part in X], dim=1).view(-1, k)
    loss = sum(((gathered @ W[r].t() + B[r]) * g_y[r].double()).sum() for r in range(p))
    if return_gathered:
        loss = loss + sum((gathered * g_gathered[r].double()).sum() for r in range(p))
    loss.backward()
    for rank, grads in enumerate(results):
        assert_grads_equal(grads, (X[rank].grad, W[rank].grad, B[rank].grad))


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("leading, dim", DROP_IN_SHAPES)
@pytest.mark.parametrize("return_A", [False, True])
def test_drop_ins_backward_on_any_dimension(groups, monkeypatch, p, leading, dim, return_A):
    k, n = 8, 16
    shape = list(leading)
    shape[dim] *= p
    shard_shape = leading
    group, sim = groups[p], SimulatedGroup(groups[p], monkeypatch)
    A, weights = per_rank(p, *shape, k, seed=30), per_rank(p, n, k, seed=31)
    shards = per_rank(p, *shard_shape, k, seed=32)
    g_out, g_y = per_rank(p, *shard_shape, n, seed=33), per_rank(p, *shape, n, seed=34)

    def step(rank):
        A_r, w_r, shard_r = leaves([A[rank], weights[rank], shards[rank]])
        out = tpfuse.fused_matmul_reduce_scatter(A_r, w_r.t(), "sum", dim, group.group_name)
        gathered, (y,) = tpfuse.fused_all_gather_matmul(shard_r, [w_r.t()], dim, group.group_name, return_A=return_A)
        loss = (out.double() * g_out[rank].double()).sum() + (y.double() * g_y[rank].double()).sum()
        if return_A:
            loss = loss + gathered.double().sum()
        loss.backward()
        return A_r.grad, w_r.grad, shard_r.grad

    results = sim.run(step)
    A64, W, S = (leaves([t.double() for t in ts]) for ts in (A, weights, shards))
    partials = [A64[r] @ W[r].t() for r in range(p)]
    gathered = torch.cat(S, dim=dim)
    loss = sum((reduce_scatter_reference(partials, dim, d, p) * g_out[d].double()).sum() +
               ((gathered @ W[d].t()) * g_y[d].double()).sum() for d in range(p))
    if return_A:
        loss = loss + p * gathered.sum()
    loss.backward()
    for rank, grads in enumerate(results):
        assert_grads_equal(grads, (A64[rank].grad, W[rank].grad, S[rank].grad))
