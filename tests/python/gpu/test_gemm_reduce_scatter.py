"""tpfuse.gemm_reduce_scatter on GPUs, at any world size: against the unfused path (docs/SPEC.md's 1.1x rule
and an exact mode), the batch (sequences) against the dim-0 path on the same rows, the bias against an FP64
reference, the drop-in (dims 0 and 1) and the symm_mem override on dim 1, CUDA graph replay, torch.compile,
1000 back-to-back calls of varying M, bad tensors, and tpfuse's own NCCL communicator."""

import random

import pytest
import torch
import torch.distributed as dist

import tpfuse
from tpfuse import _communicators
from tpfuse.checking import errors, random_operands, reference_rows, unfused_rows, weight_as_k_by_n

LAYOUTS = ["nk", "kn"]
SHAPES = [  # M (a multiple of 8 * P: any P up to 8 divides it), N, K/P
    (512, 1024, 256),
    (2048, 8192, 1024),
    (8 * 8 * 3, 72, 40),  # no whole tiles
]


def seed_of(group, test_seed):
    return 1000 * test_seed + group.rank()


def by_rank(rows: torch.Tensor, batch: int, p: int) -> torch.Tensor:
    """The rows of `batch` sequences, each split over the P ranks, reordered rank by rank: rank d's block is
    its share of every sequence, so the dim-0 path on these rows computes what the batch path does."""
    return rows.view(batch, p, -1, rows.shape[-1]).transpose(0, 1).reshape(rows.shape)


@pytest.mark.parametrize("weight_layout", LAYOUTS)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_within_the_rule_of_the_unfused_path(group, device, m, n, k, weight_layout):
    a, w = random_operands(m, n, k, weight_layout, device, seed_of(group, m + n + k))
    out = torch.full((m // group.size(), n), float("nan"), dtype=torch.bfloat16, device=device)
    assert tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout, out=out) is out
    reference = reference_rows(a, w, weight_layout, group)
    fused = errors(out, reference, group)
    unfused = errors(unfused_rows(a, w, weight_layout, group), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"


@pytest.mark.parametrize("weight_layout", LAYOUTS)
def test_small_integers_are_exact_and_reruns_bit_identical(group, device, weight_layout):
    m, n, k = 1024, 512, 32  # |every partial| <= 32 and |every sum| <= 256: exact in BF16
    a, w = random_operands(m, n, k, weight_layout, device, seed_of(group, 7), small_integers=True)
    first = tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout)
    expected = reference_rows(a, w, weight_layout, group).to(torch.bfloat16)
    mismatches = (first != expected).nonzero()
    assert mismatches.numel() == 0, f"rank {group.rank()}: first wrong (row, column) {mismatches[0].tolist()}"
    for _ in range(3):
        assert torch.equal(tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout), first)


def test_drop_in_takes_an_nn_linear_weight_in_place(group, device):
    p, n, k = group.size(), 1024, 512
    linear = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16).requires_grad_(False)
    x = torch.randn(4 * p, 64, k, device=device, dtype=torch.bfloat16)
    out = tpfuse.fused_matmul_reduce_scatter(x, linear.weight.t(), "sum", 0, group.group_name)
    assert out.shape == (4, 64, n)
    a = x.view(-1, k)
    expected = tpfuse.gemm_reduce_scatter(a, linear.weight, group, weight_layout="nk")
    assert torch.equal(out.view(-1, n), expected)
    reference = reference_rows(a, linear.weight, "nk", group)
    assert errors(out.view(-1, n), reference, group).within(
        errors(unfused_rows(a, linear.weight, "nk", group), reference, group))


def test_uses_the_nccl_communicator_of_the_process_group(group, device):
    a, w = random_operands(512, 256, 64, "nk", device, seed_of(group, 3))
    tpfuse.gemm_reduce_scatter(a, w, group)
    assert _communicators.communicator(group, device).uses_torch_comm, \
        "torch's ProcessGroupNCCL gave no communicator pointer: tpfuse made its own"


def test_cuda_graph_replay_reads_the_inputs_of_each_replay(group, device):
    m, n, k = 1024, 2048, 512
    a, w = random_operands(m, n, k, "nk", device, seed_of(group, 11))
    tpfuse.gemm_reduce_scatter(a, w, group)  # sizes the receive buffers outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tpfuse.gemm_reduce_scatter(a, w, group)
    for replay in range(3):
        fresh_a, _ = random_operands(m, n, k, "nk", device, seed_of(group, 100 + replay))
        a.copy_(fresh_a)
        graph.replay()
        reference = reference_rows(a, w, "nk", group)
        assert errors(out, reference, group).within(errors(unfused_rows(a, w, "nk", group), reference, group))
    tpfuse.status(group)


def test_buffers_cannot_grow_inside_capture(group, device):
    a, w = random_operands(256, 256, 64, "nk", device, seed_of(group, 12))
    tpfuse.gemm_reduce_scatter(a, w, group)
    comm = _communicators.communicator(group, device)
    bigger = 2 * comm.max_m + 8 * group.size()
    big_a, _ = random_operands(bigger, 256, 64, "nk", device, seed_of(group, 13))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(tpfuse.InvalidArgumentError, match="cannot grow during CUDA graph capture"):
        with torch.cuda.graph(graph):
            tpfuse.gemm_reduce_scatter(big_a, w, group)
    out = tpfuse.gemm_reduce_scatter(big_a, w, group)  # outside capture it grows
    reference = reference_rows(big_a, w, "nk", group)
    assert errors(out, reference, group).within(errors(unfused_rows(big_a, w, "nk", group), reference, group))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile(group, device, mode):
    m, n, k = 1024, 1024, 256
    a, w = random_operands(m, n, k, "nk", device, seed_of(group, 21))

    def layer(a, w):
        return torch.relu(tpfuse.gemm_reduce_scatter(a, w, group)).float() * 0.5

    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    eager = layer(a, w)
    expected = torch.relu(reference_rows(a, w, "nk", group)) * 0.5
    unfused = errors(torch.relu(unfused_rows(a, w, "nk", group)).float() * 0.5, expected, group)
    for _ in range(3):  # reduce-overhead: warm-up runs, then CUDA graph replays
        out = compiled(a, w)
        assert torch.equal(out, eager)
        assert errors(out, expected, group).within(unfused)


@pytest.mark.parametrize("weight_layout", LAYOUTS)
def test_batch_is_the_dim_0_path_on_the_rows_by_rank(group, device, weight_layout):
    """batch = 3 sequences of S rows: each rank keeps its S/P rows of each, which the dim-0 path computes from
    the same rows reordered rank by rank, bit for bit; the drop-in's scatter_dim 1 of [3, S, K/P] too."""
    p, batch, shard, n, k = group.size(), 3, 128, 1024, 256
    a, w = random_operands(batch * shard * p, n, k, weight_layout, device, seed_of(group, 51))
    out = tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout, batch=batch)
    rows = by_rank(a, batch, p)
    assert torch.equal(out, tpfuse.gemm_reduce_scatter(rows, w, group, weight_layout=weight_layout))
    B = weight_as_k_by_n(w, weight_layout)
    drop_in = tpfuse.fused_matmul_reduce_scatter(a.view(batch, shard * p, k), B, "sum", 1, group.group_name)
    assert drop_in.shape == (batch, shard, n) and torch.equal(drop_in.view(-1, n), out)
    reference = reference_rows(rows, w, weight_layout, group)
    assert errors(out, reference, group).within(errors(unfused_rows(rows, w, weight_layout, group), reference, group))


def linear_rows(a: torch.Tensor, w: torch.Tensor, weight_layout: str, bias: torch.Tensor, group) -> torch.Tensor:
    """torch's path with a bias: nn.functional.linear (cuBLAS adds the bias before its one rounding) on this
    rank's partial, the bias on rank 0's only, then reduce_scatter_tensor; at P = 1 nn.functional.linear itself."""
    partial = torch.nn.functional.linear(a, weight_as_k_by_n(w, weight_layout).t(), bias if group.rank() == 0 else None)
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows


@pytest.mark.parametrize("weight_layout", LAYOUTS)
@pytest.mark.parametrize("batch", [1, 2])
def test_bias_within_the_rule_of_nn_linears(group, device, weight_layout, batch):
    p, n, k = group.size(), 1024, 256
    a, w = random_operands(batch * 128 * p, n, k, weight_layout, device, seed_of(group, 52))
    bias = torch.randn(n, generator=torch.Generator(device=device).manual_seed(53), device=device).to(torch.bfloat16)
    out = tpfuse.gemm_reduce_scatter(a, w, group, weight_layout=weight_layout, bias=bias, batch=batch)
    rows = by_rank(a, batch, p)
    partial = rows.double() @ weight_as_k_by_n(w, weight_layout).double()
    reference = partial.new_empty(partial.shape[0] // p, n)
    dist.reduce_scatter_tensor(reference, partial, group=group)
    reference += bias.double()  # FP64
    fused = errors(out, reference, group)
    linear = errors(linear_rows(rows, w, weight_layout, bias, group), reference, group)
    assert fused.within(linear), f"fused {fused} against nn.functional.linear {linear}"


@pytest.mark.parametrize("layout", ["contiguous", "token_major"])
def test_symm_mem_override_serves_scatter_dim_1(group, device, layout):
    """TorchTitan's reduce-scatter along the sequence of [b, s, h]: contiguous A runs as the batch, Inductor's
    token-major A (A.movedim(1, 0) contiguous) as a whole; both served, within the rule."""
    p, batch, shard, n, k = group.size(), 2, 128, 512, 256
    a, w = random_operands(batch * shard * p, n, k, "nk", device, seed_of(group, 54))
    A = a.view(batch, shard * p, k)
    if layout == "token_major":
        A = A.transpose(0, 1).contiguous().transpose(0, 1)
    tpfuse.reset_stats()
    with tpfuse.use_for_symm_mem():
        out = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, w.t(), "sum", 1, group.group_name)
    assert tpfuse.stats()["fused_matmul_reduce_scatter"] == {"served": 1, "fallbacks": {}}
    assert out.shape == (batch, shard, n) and out.is_contiguous()
    rows = by_rank(a, batch, p)
    reference = reference_rows(rows, w, "nk", group)
    assert errors(out.view(-1, n), reference, group).within(
        errors(unfused_rows(rows, w, "nk", group), reference, group))


def test_a_thousand_back_to_back_calls_of_varying_m(group, device):
    p, n, k = group.size(), 256, 32  # small integers: exact up to P = 8
    sizes = random.Random(5).choices([8 * p * i for i in range(1, 65)] + [p, 3 * p, 37 * p], k=1000)
    inputs = {m: random_operands(m, n, k, "kn", device, seed_of(group, m), small_integers=True) for m in set(sizes)}
    kept = {}
    for call, m in enumerate(sizes):
        out = tpfuse.gemm_reduce_scatter(*inputs[m], group, weight_layout="kn")
        if call % 50 == 0:
            kept[call] = out
    torch.cuda.synchronize()
    tpfuse.status(group)
    for call, out in kept.items():
        a, w = inputs[sizes[call]]
        assert torch.equal(out, reference_rows(a, w, "kn", group).to(torch.bfloat16)), f"call {call}, M {sizes[call]}"


def test_bad_tensors_raise_and_the_next_call_works(group, device):
    p = group.size()
    a, w = random_operands(64 * p, 128, 64, "nk", device, seed_of(group, 31))
    with pytest.raises(tpfuse.InvalidArgumentError, match="a has dtype torch.float32"):
        tpfuse.gemm_reduce_scatter(a.float(), w, group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="w is on cpu"):
        tpfuse.gemm_reduce_scatter(a, w.cpu(), group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="is not 16-byte aligned"):
        storage = torch.empty(a.numel() + 1, dtype=torch.bfloat16, device=device)
        tpfuse.gemm_reduce_scatter(storage[1:].view_as(a), w, group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="is not a contiguous K/P x N matrix"):
        tpfuse.gemm_reduce_scatter(a, weight_as_k_by_n(w, "nk"), group, weight_layout="kn")
    with pytest.raises(tpfuse.InvalidArgumentError, match="is not a multiple of 8"):
        tpfuse.gemm_reduce_scatter(a[:, :60].contiguous(), w[:, :60].contiguous(), group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="reduce_op = 'avg'"):
        tpfuse.fused_matmul_reduce_scatter(a, w.t(), "avg", 0, group.group_name)
    out = tpfuse.gemm_reduce_scatter(a, w, group)
    reference = reference_rows(a, w, "nk", group)
    assert errors(out, reference, group).within(errors(unfused_rows(a, w, "nk", group), reference, group))


def test_own_nccl_communicator_where_torchs_is_unavailable(group, device, monkeypatch):
    tpfuse.close(group)
    monkeypatch.setattr(_communicators, "torch_nccl_comm", lambda group, device: None)
    try:
        a, w = random_operands(512, 1024, 128, "kn", device, seed_of(group, 41))
        out = tpfuse.gemm_reduce_scatter(a, w, group, weight_layout="kn")
        assert not _communicators.communicator(group, device).uses_torch_comm
        reference = reference_rows(a, w, "kn", group)
        assert errors(out, reference, group).within(errors(unfused_rows(a, w, "kn", group), reference, group))
    finally:
        torch.cuda.synchronize()
        tpfuse.close(group)
