"""tpfuse.all_gather_gemm on GPUs, at any world size: against the unfused path (docs/SPEC.md's 1.1x rule
and an exact mode), the gathered X it returns, reruns, the batch (sequences) against the dim-0 path on the
same rows, the bias against an FP64 reference, the drop-in and the symm_mem override on dim 1, and calls
alternating with the reduce-scatter on the communicator both share. FP8 (E4M3) inputs, tensorwise and
rowwise, promoted and fast: the rule against all_gather_into_tensor + torch._scaled_mm with the exact product
of the dequantized inputs as the reference, the exact mode, the batch, the bias, torch.compile, the override of
symm_mem.fused_all_gather_scaled_matmul (dims 0 and 1, two Bs), bad tensors, a non-finite scale;
quantize_all_gather_gemm bit for bit against quantizing the gathered BF16 rows, and Inductor's graph of
torchao's rowwise recipe rewritten onto it by tpfuse.inductor's pass. Blockwise scales (DeepSeek-V3's): the rule
against all_gather_into_tensor + torch._scaled_mm per 128 of K, scaled and summed, the exact mode with each tile's
and block's own power-of-2 scales, the batch, bad arguments, and quantize_all_gather_gemm's blockwise form as its
rowwise one."""

import pytest
import torch
import torch.distributed._functional_collectives as funcol
import torch.distributed._symmetric_memory  # noqa: F401 -- registers torch.ops.symm_mem

import tpfuse
from tpfuse.checking import (all_gather_reference, all_gather_unfused, assert_bit_for_bit, dequantized, errors,
                             fp8_all_gather_reference, fp8_all_gather_unfused, fp8_blockwise_all_gather_unfused,
                             fp8_blockwise_operands, fp8_operands, gathered_rows, random_operands, reference_rows,
                             weight_as_k_by_n)
from tpfuse.float8 import quantize_blockwise, quantize_rowwise

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


# --- FP8 (E4M3) inputs: w is N/P x K ("nk"), K a multiple of 16, Y BF16; torch._scaled_mm, the unfused path,
# needs N/P a multiple of 16 too ---

SCALINGS = ["tensorwise", "rowwise"]
FP8_SHAPES = [  # rows of x per rank (M/P), N/P, K
    (128, 1024, 256),
    (512, 2048, 1024),
    (3 * 8, 80, 48),  # no whole tiles
]


def fp8_call(x, w, group, x_scale, w_scale, use_fast_accum=False, **keywords):
    return tpfuse.all_gather_gemm(x, w, group, x_scale=x_scale, w_scale=w_scale, use_fast_accum=use_fast_accum,
                                  **keywords)


@pytest.mark.parametrize("use_fast_accum", [False, True])
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("rows, n, k", FP8_SHAPES)
def test_fp8_within_the_rule_of_the_unfused_path(group, device, rows, n, k, scaling, use_fast_accum):
    """Against the exact product of the dequantized gathered rows (FP64), each error at most 1.1x that of
    all_gather_into_tensor + torch._scaled_mm (the same scales and accumulation); the gathered X is every rank's
    e4m3 rows, bit for bit; reruns bit for bit."""
    x, w, x_scale, w_scale = fp8_operands(rows, n, k, device, seed_of(group, rows + n + k), scaling)
    y, gathered = fp8_call(x, w, group, x_scale, w_scale, use_fast_accum, return_gathered=True)
    assert y.shape == (rows * group.size(), n) and y.dtype == torch.bfloat16
    assert gathered.dtype == torch.float8_e4m3fn and torch.equal(gathered.view(torch.uint8),
                                                                 gathered_rows(x, group).view(torch.uint8))
    reference = fp8_all_gather_reference(x, w, x_scale, w_scale, group)
    fused = errors(y, reference, group)
    unfused = errors(fp8_all_gather_unfused(x, w, x_scale, w_scale, group, use_fast_accum), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"
    assert torch.equal(fp8_call(x, w, group, x_scale, w_scale, use_fast_accum), y)


@pytest.mark.parametrize("use_fast_accum", [False, True])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_small_integers_are_exact_and_reruns_bit_identical(group, device, scaling, use_fast_accum):
    """Dequantized entries in {-1, 0, 1}, power-of-2 scales (odd ranks storing halves scaled by twice: rowwise,
    each rank's row scales travel with its rows; tensorwise, this rank's scale applies to every gathered row),
    K = 256 (two of the promoted accumulation's 128-deep steps): every output is exact in BF16, so bit for bit.
    N/P = 520 is a multiple of 8, not of 16."""
    rows, n, k = 256, 520, 256
    x, w, x_scale, w_scale = fp8_operands(rows, n, k, device, seed_of(group, 8), scaling, small_integers=True,
                                          scale_seed=9, odd_rank=group.rank() % 2 == 1)
    first = fp8_call(x, w, group, x_scale, w_scale, use_fast_accum)
    assert_bit_for_bit(first, fp8_all_gather_reference(x, w, x_scale, w_scale, group), group.rank())
    for _ in range(3):
        assert torch.equal(fp8_call(x, w, group, x_scale, w_scale, use_fast_accum), first)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_batch_is_the_dim_0_path_in_sequence_order(group, device, scaling):
    """x (and rowwise, x_scale) holds this rank's 128 rows of each of 3 sequences: Y and the gathered X are the
    dim-0 path's on the same x, reordered sequence by sequence, bit for bit."""
    p, batch, shard, n, k = group.size(), 3, 128, 1024, 256
    x, w, x_scale, w_scale = fp8_operands(batch * shard, n, k, device, seed_of(group, 55), scaling)
    y, gathered = fp8_call(x, w, group, x_scale, w_scale, return_gathered=True, batch=batch)
    y_rows, gathered_by_rank = fp8_call(x, w, group, x_scale, w_scale, return_gathered=True)
    assert torch.equal(y, by_sequence(y_rows, batch, p))
    assert torch.equal(gathered.view(torch.uint8), by_sequence(gathered_by_rank.view(torch.uint8), batch, p))
    reference = by_sequence(fp8_all_gather_reference(x, w, x_scale, w_scale, group), batch, p)
    unfused = by_sequence(fp8_all_gather_unfused(x, w, x_scale, w_scale, group), batch, p)
    assert errors(y, reference, group).within(errors(unfused, reference, group))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_bias_within_the_rule_of_scaled_mms(group, device, scaling):
    """The bias is added in FP32 to every scaled row before the one rounding: against torch._scaled_mm's bias."""
    n, k = 1024, 256
    x, w, x_scale, w_scale = fp8_operands(128, n, k, device, seed_of(group, 56), scaling)
    bias = torch.randn(n, generator=torch.Generator(device=device).manual_seed(57), device=device).to(torch.bfloat16)
    y = fp8_call(x, w, group, x_scale, w_scale, bias=bias)
    reference = fp8_all_gather_reference(x, w, x_scale, w_scale, group, bias=bias)
    fused = errors(y, reference, group)
    scaled_mm = errors(fp8_all_gather_unfused(x, w, x_scale, w_scale, group, bias=bias), reference, group)
    assert fused.within(scaled_mm), f"fused {fused} against torch._scaled_mm {scaled_mm}"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_fp8_torch_compile(group, device, mode):
    x, w, x_scale, w_scale = fp8_operands(256, 1024, 256, device, seed_of(group, 58), "rowwise")

    def layer(x, w, x_scale, w_scale):
        return torch.relu(fp8_call(x, w, group, x_scale, w_scale, use_fast_accum=True)).float() * 0.5

    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    eager = layer(x, w, x_scale, w_scale)
    for _ in range(3):  # reduce-overhead: warm-up runs, then CUDA graph replays
        assert torch.equal(compiled(x, w, x_scale, w_scale), eager)


def scaled_all_gather_args(A, Bs, A_scale, B_scales, gather_dim, group, biases):
    """The arguments of symm_mem.fused_all_gather_scaled_matmul in the installed torch's schema: BF16 out,
    promoted sums, no result scale."""
    values = {"A": A, "Bs": Bs, "A_scale": A_scale, "B_scales": B_scales, "gather_dim": gather_dim,
              "group_name": group.group_name, "biases": biases, "result_scales": [None] * len(Bs),
              "out_dtypes": [torch.bfloat16] * len(Bs), "use_fast_accum": [False] * len(Bs)}
    schema = torch.ops.symm_mem.fused_all_gather_scaled_matmul.default._schema
    return [values[argument.name] for argument in schema.arguments]


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("gather_dim, layout", [(0, "contiguous"), (1, "contiguous"), (1, "token_major")])
def test_symm_mem_override_serves_the_fp8_all_gather(group, device, scaling, gather_dim, layout):
    """torch's FP8 all-gather of [b, s/P, K] along the batch or the sequence, two Bs (the second with a bias):
    served, the gathered A bit for bit, the outputs in torch's layout, each within the rule of
    all_gather_into_tensor + torch._scaled_mm on the same rows."""
    p, batch, shard, n, k = group.size(), 2, 64, 512, 256
    x, w, x_scale, w_scale = fp8_operands(batch * shard, n, k, device, seed_of(group, 59), scaling)
    _, up, _, up_scale = fp8_operands(8, 256, k, device, seed_of(group, 60), scaling)
    bias = torch.randn(256, generator=torch.Generator(device=device).manual_seed(61), device=device).to(torch.bfloat16)
    rowwise = scaling == "rowwise"
    A, A_scale = x.view(batch, shard, k), x_scale.view(batch, shard, 1) if rowwise else x_scale
    if layout == "token_major":
        A = A.transpose(0, 1).contiguous().transpose(0, 1)
        A_scale = A_scale.transpose(0, 1).contiguous().transpose(0, 1) if rowwise else A_scale
    tpfuse.reset_stats()
    with tpfuse.use_for_symm_mem():
        gathered, (y, y_up) = torch.ops.symm_mem.fused_all_gather_scaled_matmul(*scaled_all_gather_args(
            A, [w.t(), up.t()], A_scale, [w_scale, up_scale], gather_dim, group, [None, bias]))
    assert tpfuse.stats()["fused_all_gather_scaled_matmul"] == {"served": 1, "fallbacks": {}}

    # The rows gathered rank by rank, in the gathered A's order (along dim 1: sequence by sequence).
    def in_order(rows):
        if gather_dim == 0:
            return rows
        return rows.view(p, batch, shard, -1).transpose(0, 1).reshape(rows.shape)

    X = in_order(gathered_rows(x, group))
    X_scale = in_order(gathered_rows(x_scale, group)) if rowwise else x_scale
    assert torch.equal(gathered.reshape(-1, k).view(torch.uint8), X.view(torch.uint8))
    for out, weight, scale, out_bias in ((y, w, w_scale, None), (y_up, up, up_scale, bias)):
        columns = weight.shape[0]
        expected_shape = [batch, shard, columns]
        expected_shape[gather_dim] *= p
        assert list(out.shape) == expected_shape and out.dtype == torch.bfloat16
        assert out.movedim(gather_dim, 0).is_contiguous()  # torch's layout: token-major along the gathered dim
        reference = dequantized(X, X_scale) @ dequantized(weight, scale).t()
        if out_bias is not None:
            reference = reference + out_bias.double()
        unfused = torch._scaled_mm(X, weight.t(), X_scale, scale, bias=out_bias, out_dtype=torch.bfloat16)
        assert errors(out.reshape(-1, columns), reference, group).within(errors(unfused, reference, group))


@pytest.mark.parametrize("scaling", ["rowwise", "blockwise"])
def test_quantize_all_gather_gemm_is_bit_identical_to_quantizing_the_gathered_rows(group, device, scaling):
    """Each rank quantizes its BF16 rows (rowwise: torchao's recipe; blockwise: per 1 x 128 tile, DeepSeek-V3's
    scales) and the FP8 all-gather multiplies them: the same bits as gathering the BF16 rows, quantizing them all,
    and running the FP8 all-gather on this rank's share of them; within the rule of the unfused path on the
    quantized gathered rows (torch._scaled_mm, torchao's; blockwise, per 128 of K); reruns bit for bit."""
    blockwise = scaling == "blockwise"
    quantize = quantize_blockwise if blockwise else quantize_rowwise
    rows, n, k = 256, 1024, 512
    generator = torch.Generator(device=device).manual_seed(seed_of(group, 62))
    x = (torch.randn(rows, k, generator=generator, device=device) * 3).to(torch.bfloat16)
    if blockwise:
        _, w, _, w_scale = fp8_blockwise_operands(8, n, k, device, seed_of(group, 63))
    else:
        _, w, _, w_scale = fp8_operands(8, n, k, device, seed_of(group, 63), "rowwise")
    y = tpfuse.quantize_all_gather_gemm(x, w, group, w_scale=w_scale, scaling=scaling)
    all_rows, all_scales = quantize(gathered_rows(x, group))
    mine = slice(group.rank() * rows, (group.rank() + 1) * rows)
    x8, x_scale = quantize(x)
    assert torch.equal(x8.view(torch.uint8), all_rows[mine].view(torch.uint8)) and torch.equal(x_scale,
                                                                                              all_scales[mine])
    assert torch.equal(y, fp8_call(x8, w, group, x_scale, w_scale))
    reference = fp8_all_gather_reference(x8, w, x_scale, w_scale, group, blockwise=blockwise)
    if blockwise:
        unfused = fp8_blockwise_all_gather_unfused(x8, w, x_scale, w_scale, group)
    else:
        unfused = torch._scaled_mm(all_rows, w.t(), all_scales, w_scale, out_dtype=torch.bfloat16)
    assert errors(y, reference, group).within(errors(unfused, reference, group))
    for _ in range(2):
        assert torch.equal(tpfuse.quantize_all_gather_gemm(x, w, group, w_scale=w_scale, scaling=scaling), y)


def test_inductor_pass_runs_torchaos_rowwise_recipe_on_tpfuse(group, device):
    """The recipe (gather BF16 rows, quantize them rowwise, torch._scaled_mm), compiled with tpfuse.inductor's
    pass: the compiled layer gives quantize_all_gather_gemm's bits."""
    rows, n, k = 256, 1024, 512
    generator = torch.Generator(device=device).manual_seed(seed_of(group, 64))
    x = torch.randn(rows, k, generator=generator, device=device).to(torch.bfloat16)
    _, w, _, w_scale = fp8_operands(8, n, k, device, seed_of(group, 65), "rowwise")

    def layer(x, w, w_scale):
        gathered, scales = quantize_rowwise(funcol.all_gather_tensor(x, 0, group))
        return torch._scaled_mm(gathered, w.t(), scales, w_scale, out_dtype=torch.bfloat16)

    installed = tpfuse.inductor.install_float8_all_gather_pass()
    try:
        torch._dynamo.reset()
        y = torch.compile(layer, fullgraph=True)(x, w, w_scale)
    finally:
        installed.uninstall()
        torch._dynamo.reset()
    assert torch.equal(y, tpfuse.quantize_all_gather_gemm(x, w, group, w_scale=w_scale))


def test_fp8_bad_tensors_raise_and_the_next_call_works(group, device):
    x, w, x_scale, w_scale = fp8_operands(64, 128, 64, device, seed_of(group, 66), "rowwise")
    with pytest.raises(tpfuse.InvalidArgumentError, match="x_scale is on cpu"):
        fp8_call(x, w, group, x_scale.cpu(), w_scale)
    with pytest.raises(tpfuse.InvalidArgumentError, match="they need x_scale and w_scale"):
        tpfuse.all_gather_gemm(x, w, group)
    with pytest.raises(tpfuse.InvalidArgumentError, match="w_scale has dtype torch.bfloat16"):
        fp8_call(x, w, group, x_scale, w_scale.to(torch.bfloat16))
    with pytest.raises(tpfuse.UnsupportedError, match="FP8 weights are N/P x K"):
        fp8_call(x, w.t().contiguous(), group, x_scale, w_scale, weight_layout="kn")
    with pytest.raises(tpfuse.UnsupportedError, match="x has dtype torch.float8_e5m2"):
        fp8_call(x.to(torch.float8_e5m2), w.to(torch.float8_e5m2), group, x_scale, w_scale)
    y = fp8_call(x, w, group, x_scale, w_scale)
    reference = fp8_all_gather_reference(x, w, x_scale, w_scale, group)
    assert errors(y, reference, group).within(errors(fp8_all_gather_unfused(x, w, x_scale, w_scale, group),
                                                     reference, group))


def test_fp8_non_finite_scale_gives_non_finite_rows_not_an_error(group, device):
    """Scales stay on the GPU (checking them would synchronize): a NaN scale on every rank makes every output
    NaN, and the call and the next one succeed."""
    x, w, x_scale, w_scale = fp8_operands(64, 128, 64, device, seed_of(group, 67), "tensorwise")
    y = fp8_call(x, w, group, torch.full_like(x_scale, float("nan")), w_scale)
    torch.cuda.synchronize()
    tpfuse.status(group)
    assert torch.isnan(y).all()
    assert torch.isfinite(fp8_call(x, w, group, x_scale, w_scale)).all()


# --- Blockwise scales (tpfuse.float8.quantize_blockwise's): x_scale (M/P, K/128), this rank's rows' (gathered with
# them), w_scale (ceil(N/P/128), K/128); K a multiple of 128, promoted accumulation only ---

BLOCKWISE_SHAPES = [  # rows of x per rank (M/P), N/P (a multiple of 16, for torch._scaled_mm), K
    (128, 1024, 256),
    (512, 2048, 1024),
    (3 * 8, 208, 384),  # no whole tiles; w's last 128-row block partial
]


@pytest.mark.parametrize("rows, n, k", BLOCKWISE_SHAPES)
def test_blockwise_within_the_rule_of_the_unfused_path(group, device, rows, n, k):
    """Against the exact product of the dequantized gathered rows (FP64, each tile and block times its scale), each
    error at most 1.1x that of the unfused path (all_gather_into_tensor of the rows and their scales, then
    torch._scaled_mm of each 128 of K, scaled by its blocks' scales and summed in FP32); the gathered X every rank's
    e4m3 rows, bit for bit; the op's path gives the function's bits, and reruns bit for bit."""
    x, w, x_scale, w_scale = fp8_blockwise_operands(rows, n, k, device, seed_of(group, rows + n + k + 1))
    y, gathered = fp8_call(x, w, group, x_scale, w_scale, return_gathered=True)
    assert y.shape == (rows * group.size(), n) and y.dtype == torch.bfloat16
    assert torch.equal(gathered.view(torch.uint8), gathered_rows(x, group).view(torch.uint8))
    reference = fp8_all_gather_reference(x, w, x_scale, w_scale, group, blockwise=True)
    fused = errors(y, reference, group)
    unfused = errors(fp8_blockwise_all_gather_unfused(x, w, x_scale, w_scale, group), reference, group)
    assert fused.within(unfused), f"fused {fused} against unfused {unfused}"
    assert torch.equal(fp8_call(x, w, group, x_scale, w_scale), y)
    assert torch.equal(torch.ops.tpfuse.all_gather_gemm(x, w, "nk", group.group_name, None, 1, x_scale, w_scale,
                                                        False), y)


def test_blockwise_small_integers_are_exact_and_reruns_bit_identical(group, device):
    """Dequantized entries in {-1, 0, 1} stored as +-2^-t, each scale 2^t (t from -3 to 3 per row and 128 of K,
    drawn on each rank, and per 128 x 128 block of w): the integer products come out only where every gathered row
    meets its own rank's tile scales, exact in BF16 up to 256, so bit for bit. K = 256 (two 128-blocks), N/P = 520
    (w's last block 8 rows)."""
    rows, n, k = 256, 520, 256
    x, w, x_scale, w_scale = fp8_blockwise_operands(rows, n, k, device, seed_of(group, 68), small_integers=True)
    first = fp8_call(x, w, group, x_scale, w_scale)
    assert_bit_for_bit(first, fp8_all_gather_reference(x, w, x_scale, w_scale, group, blockwise=True), group.rank())
    for _ in range(3):
        assert torch.equal(fp8_call(x, w, group, x_scale, w_scale), first)


def test_blockwise_batch_is_the_dim_0_path_in_sequence_order(group, device):
    """x and x_scale hold this rank's 128 rows of each of 3 sequences: Y and the gathered X are the dim-0 path's on
    the same x, reordered sequence by sequence, bit for bit."""
    p, batch, shard, n, k = group.size(), 3, 128, 1024, 256
    x, w, x_scale, w_scale = fp8_blockwise_operands(batch * shard, n, k, device, seed_of(group, 69))
    y, gathered = fp8_call(x, w, group, x_scale, w_scale, return_gathered=True, batch=batch)
    y_rows, gathered_by_rank = fp8_call(x, w, group, x_scale, w_scale, return_gathered=True)
    assert torch.equal(y, by_sequence(y_rows, batch, p))
    assert torch.equal(gathered.view(torch.uint8), by_sequence(gathered_by_rank.view(torch.uint8), batch, p))


def test_blockwise_bad_arguments_raise_and_the_next_call_works(group, device):
    x, w, x_scale, w_scale = fp8_blockwise_operands(64, 256, 256, device, seed_of(group, 70))
    with pytest.raises(tpfuse.InvalidArgumentError, match="use_fast_accum=True with blockwise scales"):
        fp8_call(x, w, group, x_scale, w_scale, use_fast_accum=True)
    with pytest.raises(tpfuse.InvalidArgumentError, match="x_scale is on cpu"):
        fp8_call(x, w, group, x_scale.cpu(), w_scale)
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"w_scale has shape \(1, 256\); with x_scale \(64, 2\)"):
        fp8_call(x, w, group, x_scale, torch.ones(1, 256, device=device))
    y = fp8_call(x, w, group, x_scale, w_scale)
    reference = fp8_all_gather_reference(x, w, x_scale, w_scale, group, blockwise=True)
    assert errors(y, reference, group).within(
        errors(fp8_blockwise_all_gather_unfused(x, w, x_scale, w_scale, group), reference, group))
