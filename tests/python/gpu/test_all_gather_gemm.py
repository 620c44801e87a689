"""tpfuse.all_gather_gemm on GPUs, at any world size: against the unfused path (docs/SPEC.md's 1.1x rule
and an exact mode), the gathered X it returns, reruns, and calls alternating with the reduce-scatter
on the communicator both share."""

import pytest
import torch

import tpfuse
from tpfuse.checking import (all_gather_reference, all_gather_unfused, errors, gathered_rows, random_operands,
                             reference_rows)

LAYOUTS = ["nk", "kn"]
SHAPES = [  # rows of x per rank (M/P), N/P, K
    (128, 1024, 256),
    (512, 2048, 1024),
    (3 * 8, 72, 40),  # no whole tiles
]


def seed_of(group, test_seed):
    return 1000 * test_seed + group.rank()


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
    # The second weight multiplies the gathered rows with tpfuse's GEMM (no second gather).
    reference = all_gather_reference(x_rows, up, "kn", group)
    assert errors(y_up.view(-1, 256), reference, group).within(
        errors(all_gather_unfused(x_rows, up, "kn", group), reference, group))
