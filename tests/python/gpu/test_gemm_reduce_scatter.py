"""tpfuse.gemm_reduce_scatter on GPUs, at any world size: against the unfused path (docs/SPEC.md's 1.1x rule
and an exact mode), the batch (sequences) against the dim-0 path on the same rows, the bias against an FP64
reference, the drop-in (dims 0 and 1) and the symm_mem override on dim 1, CUDA graph replay, torch.compile,
1000 back-to-back calls of varying M, bad tensors, and tpfuse's own NCCL communicator. FP8 (E4M3) inputs,
tensorwise and rowwise, promoted and fast: the rule against torch._scaled_mm + reduce_scatter_tensor with the
exact product of the dequantized inputs as the reference, the exact mode, the batch, the bias, torch.compile,
the override of symm_mem.fused_scaled_matmul_reduce_scatter, bad tensors and a non-finite scale. Blockwise scales
(DeepSeek-V3's): the rule against torch._scaled_mm per 128 of K/P, scaled and summed, + reduce_scatter_tensor,
the op's path equal to the eager one, and the exact mode with each block's own power-of-2 scales."""

import random

import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory  # noqa: F401 -- registers torch.ops.symm_mem

import tpfuse
from tpfuse import _communicators
from tpfuse.checking import (assert_bit_for_bit, errors, fp8_blockwise_operands, fp8_blockwise_unfused_rows,
                             fp8_operands, fp8_reference_rows, fp8_unfused_rows, random_operands, reference_rows,
                             unfused_rows, weight_as_k_by_n)

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


# --- FP8 (E4M3) inputs: w is N x K/P ("nk"), K/P a multiple of 16, out BF16; torch._scaled_mm, the unfused
# path, needs N a multiple of 16 too ---

SCALINGS = ["tensorwise", "rowwise"]
FP8_SHAPES = [  # M (a multiple of 8 * P: any P up to 8 divides it), N, K/P
    (512, 1024, 256),
    (2048, 8192, 1024),
    (8 * 8 * 3, 80, 48),  # no whole tiles
]


def fp8_call(a, w, group, a_scale, w_scale, use_fast_accum=False, **keywords):
    return tpfuse.gemm_reduce_scatter(a, w, group, a_scale=a_scale, w_scale=w_scale, use_fast_accum=use_fast_accum,
                                      **keywords)


@pytest.mark.parametrize("use_fast_accum", [False, True])
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("m, n, k", FP8_SHAPES)
def test_fp8_within_the_rule_of_the_unfused_path(group, device, m, n, k, scaling, use_fast_accum):
    """Against the exact product of the dequantized inputs (FP64), each error at most 1.1x that of
    torch._scaled_mm (the same scales and accumulation) + reduce_scatter_tensor; reruns bit for bit."""
    a, w, a_scale, w_scale = fp8_operands(m, n, k, device, seed_of(group, m + n + k), scaling)
    out = torch.full((m // group.size(), n), float("nan"), dtype=torch.bfloat16, device=device)
    assert fp8_call(a, w, group, a_scale, w_scale, use_fast_accum, out=out) is out
    reference = fp8_reference_rows(a, w, a_scale, w_scale, group)
    fused = errors(out, reference, group)
    unfused = errors(fp8_unfused_rows(a, w, a_scale, w_scale, group, use_fast_accum), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"
    assert torch.equal(fp8_call(a, w, group, a_scale, w_scale, use_fast_accum), out)


@pytest.mark.parametrize("use_fast_accum", [False, True])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_small_integers_are_exact_and_reruns_bit_identical(group, device, scaling, use_fast_accum):
    """Dequantized entries in {-1, 0, 1}, power-of-2 scales (the same on every rank, odd ranks storing halves
    scaled by twice), K = 16 * (16 // P) * P <= 256: every output is exact in BF16, so bit for bit. At P = 1,
    K/P = 256 spans two of the promoted accumulation's 128-deep steps; N = 520 is a multiple of 8, not of 16."""
    p = group.size()
    m, n, k = 1024, 520, 16 * (16 // p)
    a, w, a_scale, w_scale = fp8_operands(m, n, k, device, seed_of(group, 8), scaling, small_integers=True,
                                          scale_seed=9, odd_rank=group.rank() % 2 == 1)
    first = fp8_call(a, w, group, a_scale, w_scale, use_fast_accum)
    assert_bit_for_bit(first, fp8_reference_rows(a, w, a_scale, w_scale, group), group.rank())
    for _ in range(3):
        assert torch.equal(fp8_call(a, w, group, a_scale, w_scale, use_fast_accum), first)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_batch_is_the_dim_0_path_on_the_rows_by_rank(group, device, scaling):
    """batch = 3 sequences: the dim-0 path on the rows (and a_scale's rows) reordered rank by rank gives the
    same bits."""
    p, batch, shard, n, k = group.size(), 3, 128, 1024, 256
    a, w, a_scale, w_scale = fp8_operands(batch * shard * p, n, k, device, seed_of(group, 55), scaling)
    out = fp8_call(a, w, group, a_scale, w_scale, batch=batch)
    rows = by_rank(a, batch, p)
    row_scales = by_rank(a_scale, batch, p) if scaling == "rowwise" else a_scale
    assert torch.equal(out, fp8_call(rows, w, group, row_scales, w_scale))
    reference = fp8_reference_rows(rows, w, row_scales, w_scale, group)
    assert errors(out, reference, group).within(
        errors(fp8_unfused_rows(rows, w, row_scales, w_scale, group), reference, group))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_bias_within_the_rule_of_scaled_mms(group, device, scaling):
    """The bias is added once, to the scaled and reduced rows, before the one rounding: against
    torch._scaled_mm with the bias on rank 0's partial only."""
    p, n, k = group.size(), 1024, 256
    a, w, a_scale, w_scale = fp8_operands(128 * p, n, k, device, seed_of(group, 56), scaling)
    bias = torch.randn(n, generator=torch.Generator(device=device).manual_seed(57), device=device).to(torch.bfloat16)
    out = fp8_call(a, w, group, a_scale, w_scale, bias=bias)
    reference = fp8_reference_rows(a, w, a_scale, w_scale, group, bias=bias)
    fused = errors(out, reference, group)
    scaled_mm = errors(fp8_unfused_rows(a, w, a_scale, w_scale, group, bias=bias), reference, group)
    assert fused.within(scaled_mm), f"fused {fused} against torch._scaled_mm {scaled_mm}"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_fp8_torch_compile(group, device, mode):
    m, n, k = 1024, 1024, 256
    a, w, a_scale, w_scale = fp8_operands(m, n, k, device, seed_of(group, 58), "rowwise")

    def layer(a, w, a_scale, w_scale):
        return torch.relu(fp8_call(a, w, group, a_scale, w_scale, use_fast_accum=True)).float() * 0.5

    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    eager = layer(a, w, a_scale, w_scale)
    for _ in range(3):  # reduce-overhead: warm-up runs, then CUDA graph replays
        assert torch.equal(compiled(a, w, a_scale, w_scale), eager)


def scaled_reduce_scatter_args(A, B, A_scale, B_scale, scatter_dim, group, output_shape=None, dim_after_reshape=None):
    """The arguments of symm_mem.fused_scaled_matmul_reduce_scatter without defaults, in the installed torch's
    schema (torch 2.7: scatter_dim; later: orig_scatter_dim, scatter_dim_after_maybe_reshape, output_shape)."""
    values = {"A": A, "B": B, "A_scale": A_scale, "B_scale": B_scale, "reduce_op": "sum", "scatter_dim": scatter_dim,
              "orig_scatter_dim": scatter_dim, "group_name": group.group_name,
              "scatter_dim_after_maybe_reshape": scatter_dim if dim_after_reshape is None else dim_after_reshape,
              "output_shape": [*A.shape[:-1], B.shape[1]] if output_shape is None else output_shape}
    schema = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default._schema
    return [values[argument.name] for argument in schema.arguments if not argument.has_default_value()]


LATER_SCHEMA = "output_shape" in [argument.name for argument in
                                  torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default._schema.arguments]


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("layout", ["contiguous", "token_major", "reshaped"])
def test_symm_mem_override_serves_the_fp8_reduce_scatter_on_dim_1(group, device, scaling, layout):
    """torch's FP8 op on [b, s, K/P] scattered along s: a contiguous A runs as the batch, a token-major one as a
    whole, and (later schema) Inductor's 2-D A with the output's shape; all served, within the rule of
    torch._scaled_mm + reduce_scatter_tensor on the same rows."""
    if layout == "reshaped" and not LATER_SCHEMA:
        pytest.skip("torch 2.7's schema has no output_shape")
    p, batch, shard, n, k = group.size(), 2, 128, 512, 256
    a, w, a_scale, w_scale = fp8_operands(batch * shard * p, n, k, device, seed_of(group, 59), scaling)
    rowwise = scaling == "rowwise"
    A, A_scale = a.view(batch, shard * p, k), a_scale.view(batch, shard * p, 1) if rowwise else a_scale
    if layout == "token_major":
        A = A.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "reshaped":
        args = scaled_reduce_scatter_args(a, w.t(), a_scale, w_scale, 1, group, output_shape=[batch, shard * p, n],
                                          dim_after_reshape=0)
    else:
        args = scaled_reduce_scatter_args(A, w.t(), A_scale, w_scale, 1, group)
    tpfuse.reset_stats()
    with tpfuse.use_for_symm_mem():
        out = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*args, out_dtype=torch.bfloat16)
    assert tpfuse.stats()["fused_scaled_matmul_reduce_scatter"] == {"served": 1, "fallbacks": {}}
    assert out.shape == (batch, shard, n) and out.is_contiguous() and out.dtype == torch.bfloat16
    rows = by_rank(a, batch, p)
    row_scales = by_rank(a_scale, batch, p) if rowwise else a_scale
    reference = fp8_reference_rows(rows, w, row_scales, w_scale, group)
    assert errors(out.view(-1, n), reference, group).within(
        errors(fp8_unfused_rows(rows, w, row_scales, w_scale, group), reference, group))


def test_fp8_bad_tensors_raise_and_the_next_call_works(group, device):
    p = group.size()
    a, w, a_scale, w_scale = fp8_operands(64 * p, 128, 64, device, seed_of(group, 60), "rowwise")
    with pytest.raises(tpfuse.InvalidArgumentError, match="a_scale is on cpu"):
        fp8_call(a, w, group, a_scale.cpu(), w_scale)
    with pytest.raises(tpfuse.InvalidArgumentError, match="they need a_scale and w_scale"):
        tpfuse.gemm_reduce_scatter(a, w, group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="w_scale has dtype torch.bfloat16"):
        fp8_call(a, w, group, a_scale, w_scale.to(torch.bfloat16))
    with pytest.raises(tpfuse.UnsupportedError, match="FP8 weights are N x K/P"):
        fp8_call(a, w.t().contiguous(), group, a_scale, w_scale, weight_layout="kn")
    out = fp8_call(a, w, group, a_scale, w_scale)
    reference = fp8_reference_rows(a, w, a_scale, w_scale, group)
    assert errors(out, reference, group).within(
        errors(fp8_unfused_rows(a, w, a_scale, w_scale, group), reference, group))


def test_fp8_non_finite_scale_gives_non_finite_rows_not_an_error(group, device):
    """Scales stay on the GPU (checking them would synchronize): a NaN scale on every rank makes every output
    NaN, and the call and the next one succeed."""
    p = group.size()
    a, w, a_scale, w_scale = fp8_operands(64 * p, 128, 64, device, seed_of(group, 61), "tensorwise")
    out = fp8_call(a, w, group, torch.full_like(a_scale, float("nan")), w_scale)
    torch.cuda.synchronize()
    tpfuse.status(group)
    assert torch.isnan(out).all()
    out = fp8_call(a, w, group, a_scale, w_scale)
    assert torch.isfinite(out).all()


# --- Blockwise scales (tpfuse.float8.quantize_blockwise's: a_scale (M, K/P/128), w_scale (ceil(N/128), K/P/128)):
# K/P a multiple of 128, promoted accumulation only ---

BLOCKWISE_SHAPES = [  # M (a multiple of 8 * P), N (a multiple of 16, for torch._scaled_mm), K/P
    (512, 1024, 256),
    (2048, 8192, 1024),
    (8 * 8 * 3, 208, 384),  # no whole tiles; w's last 128-row block partial
]


@pytest.mark.parametrize("m, n, k", BLOCKWISE_SHAPES)
def test_blockwise_within_the_rule_of_the_unfused_path(group, device, m, n, k):
    """Against the exact product of the dequantized inputs (FP64), each error at most 1.1x that of the unfused
    path (torch._scaled_mm of each 128 of K/P, scaled by its blocks' scales and summed in FP32, +
    reduce_scatter_tensor); the op's path gives the eager path's bits, and reruns bit for bit."""
    a, w, a_scale, w_scale = fp8_blockwise_operands(m, n, k, device, seed_of(group, m + n + k + 1))
    out = torch.full((m // group.size(), n), float("nan"), dtype=torch.bfloat16, device=device)
    assert fp8_call(a, w, group, a_scale, w_scale, out=out) is out
    reference = fp8_reference_rows(a, w, a_scale, w_scale, group, blockwise=True)
    fused = errors(out, reference, group)
    unfused = errors(fp8_blockwise_unfused_rows(a, w, a_scale, w_scale, group), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"
    assert torch.equal(fp8_call(a, w, group, a_scale, w_scale), out)
    assert torch.equal(torch.ops.tpfuse.gemm_reduce_scatter(a, w, "nk", group.group_name, None, 1, a_scale, w_scale,
                                                            False), out)


def test_blockwise_small_integers_are_exact_and_reruns_bit_identical(group, device):
    """Dequantized entries in {-1, 0, 1} stored as +-2^-t, each block's scale 2^t (t from -3 to 3 per row and 128
    of K/P, and per 128 x 128 block of w): the integer products come out only where every block meets its own
    scales, exact in BF16 up to 256, so bit for bit. K/P = 256 (two 128-blocks) at P = 1, 128 beyond; N = 520,
    w's last block 8 rows."""
    p = group.size()
    m, n, k = 1024, 520, 256 if p == 1 else 128
    a, w, a_scale, w_scale = fp8_blockwise_operands(m, n, k, device, seed_of(group, 62), small_integers=True)
    first = fp8_call(a, w, group, a_scale, w_scale)
    assert_bit_for_bit(first, fp8_reference_rows(a, w, a_scale, w_scale, group, blockwise=True), group.rank())
    for _ in range(3):
        assert torch.equal(fp8_call(a, w, group, a_scale, w_scale), first)


def test_blockwise_fast_accum_is_refused_and_the_next_call_works(group, device):
    p = group.size()
    a, w, a_scale, w_scale = fp8_blockwise_operands(64 * p, 256, 256, device, seed_of(group, 63))
    with pytest.raises(tpfuse.InvalidArgumentError, match="use_fast_accum=True with blockwise scales"):
        fp8_call(a, w, group, a_scale, w_scale, use_fast_accum=True)
    out = fp8_call(a, w, group, a_scale, w_scale)
    reference = fp8_reference_rows(a, w, a_scale, w_scale, group, blockwise=True)
    assert errors(out, reference, group).within(
        errors(fp8_blockwise_unfused_rows(a, w, a_scale, w_scale, group), reference, group))
