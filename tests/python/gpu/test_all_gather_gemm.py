"""tpfuse.all_gather_gemm on GPUs, at any world size: against the unfused path (docs/SPEC.md's 1.1x rule
and an exact mode), the gathered X it returns, reruns, the batch (sequences) against the dim-0 path on the
same rows, the bias against an FP64 reference, the drop-in and the symm_mem override on dim 1, and calls
alternating with the reduce-scatter on the communicator both share."""

import pytest
import torch

import tpfuse
from tpfuse.checking import (all_gather_reference, all_gather_unfused, errors, gathered_rows, random_operands,
                             reference_rows, weight_as_k_by_n)

LAYOUTS = ["nk", "kn"]
SHAPES = [  # rows of x per rank (M/P), N/P, K
    (128, 1024, 256),
    (512, 2048, 1024),
    (3 * 8, 72, 40),  # no whole tiles
]


def seed_of(group, test_seed):
    return 1000 * test_seed + group.rank()


def by_sequence(rows: torch.Tensor, batch: int, p: int) -> torch.Tensor:
    """Rows gathered rank by rank (the dim-0 path's order: rank r's rows of every sequence, then r + 1's)
    reordered sequence by sequence, each sequence's rows in rank order: the batch path's order."""
    return rows.view(p, batch, -1, rows.shape[-1]).transpose(0, 1).reshape(rows.shape)


@pytest.mark.parametrize("weight_layout", LAYOUTS)
@pytest.mark.parametrize("rows, n, k", SHAPES)
def test_within_the_rule_of_the_unfused_path(group, device, rows, n, k, weight_layout):
    x, w = random_operands(rows, n, k, weight_layout, device, seed_of(group, rows + n + k))
    y = tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout)
    assert y.shape == (rows * group.size(), n)
    reference = all_gather_reference(x, w, weight_layout, group)
    fused = errors(y, reference, group)
    unfused = errors(all_gather_unfused(x, w, weight_layout, group), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"


@pytest.mark.parametrize("weight_layout", LAYOUTS)
def test_small_integers_are_exact_gathered_x_is_the_all_gather_and_reruns_bit_identical(group, device,
                                                                                       weight_layout):
    rows, n, k = 256, 512, 128  # entries in {-1, 0, 1}: |every sum| <= 128, exact in BF16
    x, w = random_operands(rows, n, k, weight_layout, device, seed_of(group, 7), small_integers=True)
    y, gathered = tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout, return_gathered=True)
    assert torch.equal(gathered, gathered_rows(x, group)), f"rank {group.rank()}: the gathered X differs"
    expected = all_gather_reference(x, w, weight_layout, group).to(torch.bfloat16)
    mismatches = (y != expected).nonzero()
    assert mismatches.numel() == 0, f"rank {group.rank()}: first wrong (row, column) {mismatches[0].tolist()}"
    for _ in range(3):
        assert torch.equal(tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout), y)


def test_calls_alternating_with_the_reduce_scatter_share_the_communicator(group, device):
    p = group.size()
    x, w_ag = random_operands(64, 256, 96, "nk", device, seed_of(group, 9), small_integers=True)
    a, w_rs = random_operands(64 * p, 128, 32, "kn", device, seed_of(group, 10), small_integers=True)
    ys, outs = [], []
    for _ in range(50):
        ys.append(tpfuse.all_gather_gemm(x, w_ag, group))
        outs.append(tpfuse.gemm_reduce_scatter(a, w_rs, group, weight_layout="kn"))
    torch.cuda.synchronize()
    tpfuse.status(group)
    expected_y = all_gather_reference(x, w_ag, "nk", group).to(torch.bfloat16)
    expected_out = reference_rows(a, w_rs, "kn", group).to(torch.bfloat16)
    for call, (y, out) in enumerate(zip(ys, outs)):
        assert torch.equal(y, expected_y), f"all-gather call {call}"
        assert torch.equal(out, expected_out), f"reduce-scatter call {call}"


def test_bad_tensors_raise_and_the_next_call_works(group, device):
    x, w = random_operands(64, 128, 64, "nk", device, seed_of(group, 31))
    with pytest.raises(tpfuse.InvalidArgumentError, match="w is on cpu"):
        tpfuse.all_gather_gemm(x, w.cpu(), group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="is not 16-byte aligned"):
        storage = torch.empty(x.numel() + 1, dtype=torch.bfloat16, device=device)
        tpfuse.all_gather_gemm(storage[1:].view_as(x), w, group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="Bs\\[1\\] is on cpu"):
        tpfuse.fused_all_gather_matmul(x, [w.t(), w.t().cpu()], 0, group.group_name)
    y = tpfuse.all_gather_gemm(x, w, group)
    reference = all_gather_reference(x, w, "nk", group)
    assert errors(y, reference, group).within(errors(all_gather_unfused(x, w, "nk", group), reference, group))


@pytest.mark.parametrize("return_A", [True, False])
def test_drop_in_takes_nn_linear_weights_in_place(group, device, return_A):
    k = 512
    q = torch.nn.Linear(k, 768, bias=False, device=device, dtype=torch.bfloat16).requires_grad_(False)
    up = torch.randn(k, 256, device=device, dtype=torch.bfloat16)  # a K x N matrix as stored
    x = torch.randn(16, 4, k, device=device, dtype=torch.bfloat16)
    gathered, (y_q, y_up) = tpfuse.fused_all_gather_matmul(x, [q.weight.t(), up], 0, group.group_name,
                                                           return_A=return_A)
    rows = 16 * group.size()
    assert y_q.shape == (rows, 4, 768) and y_up.shape == (rows, 4, 256)
    x_rows = x.view(-1, k)
    if return_A:
        assert gathered.shape == (rows, 4, k) and torch.equal(gathered.view(-1, k), gathered_rows(x_rows, group))
    else:
        assert gathered is None
    assert torch.equal(y_q.view(-1, 768), tpfuse.all_gather_gemm(x_rows, q.weight, group))
    reference_q = all_gather_reference(x_rows, q.weight, "nk", group)
    assert errors(y_q.view(-1, 768), reference_q, group).within(
        errors(all_gather_unfused(x_rows, q.weight, "nk", group), reference_q, group))
    # The second weight multiplies the gathered rows with tpfuse's GEMM (no second gather).
    reference = all_gather_reference(x_rows, up, "kn", group)
    assert errors(y_up.view(-1, 256), reference, group).within(
        errors(all_gather_unfused(x_rows, up, "kn", group), reference, group))


@pytest.mark.parametrize("weight_layout", LAYOUTS)
def test_batch_is_the_dim_0_path_in_sequence_order(group, device, weight_layout):
    """x holds this rank's 128 rows of each of 3 sequences: Y and the gathered X are the dim-0 path's rows on
    the same x, reordered sequence by sequence, bit for bit; the drop-in's gather_dim 1 of [3, 128, K] too."""
    p, batch, shard, n, k = group.size(), 3, 128, 1024, 256
    x, w = random_operands(batch * shard, n, k, weight_layout, device, seed_of(group, 61))
    y, gathered = tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout, return_gathered=True, batch=batch)
    y_rows, gathered_by_rank = tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout, return_gathered=True)
    assert torch.equal(y, by_sequence(y_rows, batch, p))
    assert torch.equal(gathered, by_sequence(gathered_by_rank, batch, p))
    A, (drop_in,) = tpfuse.fused_all_gather_matmul(x.view(batch, shard, k), [weight_as_k_by_n(w, weight_layout)], 1,
                                                   group.group_name)
    assert torch.equal(A.view(-1, k), gathered) and torch.equal(drop_in.view(-1, n), y)
    reference = by_sequence(all_gather_reference(x, w, weight_layout, group), batch, p)
    unfused = by_sequence(all_gather_unfused(x, w, weight_layout, group), batch, p)
    assert errors(y, reference, group).within(errors(unfused, reference, group))


@pytest.mark.parametrize("weight_layout", LAYOUTS)
@pytest.mark.parametrize("batch", [1, 2])
def test_bias_within_the_rule_of_nn_linears(group, device, weight_layout, batch):
    p, n, k = group.size(), 1024, 256
    x, w = random_operands(batch * 128, n, k, weight_layout, device, seed_of(group, 62))
    bias = torch.randn(n, generator=torch.Generator(device=device).manual_seed(63), device=device).to(torch.bfloat16)
    y = tpfuse.all_gather_gemm(x, w, group, weight_layout=weight_layout, bias=bias, batch=batch)
    X = by_sequence(gathered_rows(x, group), batch, p)
    W = weight_as_k_by_n(w, weight_layout)
    reference = X.double() @ W.double() + bias.double()  # FP64
    fused = errors(y, reference, group)
    linear = errors(torch.nn.functional.linear(X, W.t(), bias), reference, group)
    assert fused.within(linear), f"fused {fused} against nn.functional.linear {linear}"


@pytest.mark.parametrize("layout", ["contiguous", "token_major"])
def test_symm_mem_override_serves_gather_dim_1(group, device, layout):
    """TorchTitan's all-gather along the sequence of [b, s/P, h], gate and up sharing it: served, with torch's
    token-major outputs, within the rule."""
    p, batch, shard, n, k = group.size(), 2, 64, 512, 256
    x, w = random_operands(batch * shard, n, k, "nk", device, seed_of(group, 64))
    _, up = random_operands(8, n, k, "kn", device, seed_of(group, 65))
    A = x.view(batch, shard, k)
    if layout == "token_major":
        A = A.transpose(0, 1).contiguous().transpose(0, 1)
    tpfuse.reset_stats()
    with tpfuse.use_for_symm_mem():
        gathered, (y, y_up) = torch.ops.symm_mem.fused_all_gather_matmul(A, [w.t(), up], 1, group.group_name)
    assert tpfuse.stats()["fused_all_gather_matmul"] == {"served": 1, "fallbacks": {}}
    assert y.shape == (batch, shard * p, n) and y.transpose(0, 1).is_contiguous()
    X = torch.cat([part.view(batch, shard, k) for part in gathered_rows(x, group).chunk(p)], dim=1)
    assert torch.equal(gathered, X)
    for out, weight, layout_name in ((y, w, "nk"), (y_up, up, "kn")):
        rows = X.reshape(-1, k)
        reference = rows.float() @ weight_as_k_by_n(weight, layout_name).float()
        unfused = torch.mm(rows, weight_as_k_by_n(weight, layout_name))
        assert errors(out.reshape(-1, n), reference, group).within(errors(unfused, reference, group))
