"""FP8 on the CPU: tpfuse.float8.quantize_rowwise against a reference written from torchao's rowwise recipe with
Python's own arithmetic (and against torchao itself where it is installed); the FP8 all_gather_gemm and
quantize_all_gather_gemm on a simulated group (simulated_group.py) exact against the dequantized product of the
gathered rows, with the C ABI's codes in the launch; quantizing before the gather equal to quantizing after it.
Blockwise: quantize_blockwise against a reference written from DeepSeek-V3's recipe (and torchao's power-of-2
rounding) with Python's arithmetic, its layouts, round trip bounds, zero blocks and partial blocks;
gemm_reduce_scatter with blockwise scales on a simulated group, exact against the dequantized product."""

import math
import struct

import pytest
import torch

import tpfuse
from tpfuse import _library
from tpfuse.float8 import (ACTIVATION_BLOCK, WEIGHT_BLOCK, dequantize_blockwise, quantize_blockwise,
                           quantize_rowwise)
from simulated_group import SimulatedGroup

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
E4M3_MAX = 448.0


def float32(value: float) -> float:
    """value rounded to FP32 (to nearest, ties to even)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def e4m3(value: float) -> float:
    """value (|value| <= 448) rounded to e4m3 (to nearest, ties to even): 3 mantissa bits, normal exponents from
    -6, subnormals multiples of 2^-9."""
    if value == 0:
        return 0.0
    exponent = max(math.frexp(abs(value))[1] - 1, -6)
    quantum = 2.0 ** (exponent - 3)
    return round(value / quantum) * quantum


def reference_quantized(values, power_of_2: bool):
    """One row or block of values (Python floats of BF16 or FP32 values) quantized, in Python floats: (the e4m3
    values, the dequantizing scale). power_of_2: torchao's recipe; else DeepSeek-V3's, scale amax / 448 (FP32)
    and values divided by it (FP32)."""
    amax = max(max(abs(value) for value in values), 1e-12)
    if not power_of_2:
        scale = float32(amax / E4M3_MAX)  # (FP64's quotients rounded to FP32 are FP32's own)
        return [e4m3(min(max(float32(value / scale), -E4M3_MAX), E4M3_MAX)) for value in values], scale
    # 2^floor(log2(448 / amax)), frexp giving m 2^e with m in [0.5, 1). (torchao's FP32 log2 agrees here: 448 /
    # amax is a power of 2 exactly or differs from one by far more than log2's rounding.)
    power = 2.0 ** (math.frexp(float32(E4M3_MAX / amax))[1] - 1)
    return [e4m3(min(max(value * power, -E4M3_MAX), E4M3_MAX)) for value in values], 1.0 / power


def reference_rowwise(x: torch.Tensor):
    """Each row of BF16 x as torchao's rowwise recipe quantizes it, in Python floats: (the e4m3 values, the
    dequantizing scale) per row."""
    quantized = [reference_quantized(row, power_of_2=True) for row in x.double().tolist()]
    return [row for row, _ in quantized], [scale for _, scale in quantized]


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    """BF16 rows of magnitudes 2^-30 to 2^30 (one per row), with rows the recipe treats specially: all zeros
    (the EPS clamp), an amax of exactly 7 * 2^3 (448 / amax a power of 2), one nonzero entry, and tiny entries
    beside a large one (e4m3 subnormals and zeros)."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = torch.pow(2.0, torch.randint(-30, 31, (rows, 1), generator=generator).double())
    x = torch.randn(rows, k, generator=generator, dtype=torch.float64) * magnitudes
    x[0] = 0
    x[1, :] = torch.linspace(-56, 56, k, dtype=torch.float64)
    x[2] = 0
    x[2, 5] = -3.0e-5
    x[3] = torch.randn(k, generator=generator, dtype=torch.float64) * 1e-4
    x[3, 0] = 300.0
    return x.to(BF16)


def test_quantize_rowwise_is_torchaos_rowwise_recipe():
    x = activations(64, 48, seed=1)
    bits, scales = quantize_rowwise(x)
    rows, reference_scales = reference_rowwise(x)
    assert bits.dtype == FP8 and bits.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == (64, 1)
    assert bits.float().tolist() == rows
    assert scales[:, 0].tolist() == reference_scales
    assert scales[0, 0].item() == 2.0 ** -48 and scales[1, 0].item() == 2.0 ** -3  # EPS; 448 / 56 = 8 exactly
    assert torch.all(torch.log2(scales) == torch.round(torch.log2(scales)))  # powers of 2


def test_quantize_rowwise_agrees_with_torchao():
    torchao_float8 = pytest.importorskip("torchao.float8.float8_scaling_utils",
                                         reason="torchao is not installed: checked against the reference only")
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_training_tensor import LinearMMConfig

    x = activations(64, 48, seed=2)
    theirs = torchao_float8.hp_tensor_to_float8_dynamic(
        x, FP8, LinearMMConfig(), scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1,
        round_scales_to_power_of_2=True)
    bits, scales = quantize_rowwise(x)
    assert torch.equal(bits.view(torch.uint8), theirs._data.view(torch.uint8))
    assert torch.equal(scales, theirs._scale.reciprocal())


def test_quantizing_each_ranks_rows_equals_quantizing_the_gathered_rows():
    shards = [activations(16, 32, seed=10 + rank) for rank in range(4)]
    gathered_bits, gathered_scales = quantize_rowwise(torch.cat(shards))
    parts = [quantize_rowwise(shard) for shard in shards]
    assert torch.equal(torch.cat([bits for bits, _ in parts]).view(torch.uint8), gathered_bits.view(torch.uint8))
    assert torch.equal(torch.cat([scales for _, scales in parts]), gathered_scales)


def powers_of_2(*shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.pow(2.0, torch.randint(-3, 4, shape, generator=generator).float())


def e4m3_weights(n: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=generator) * 8).to(FP8)


def gathered(shards, batch: int = 1) -> torch.Tensor:
    """Every rank's shard of rows (`batch` sequences each), as the all-gather gathers them: each sequence's rows in
    rank order, sequence after sequence."""
    return torch.cat([t.reshape(batch, -1, t.shape[-1]) for t in shards], dim=1).reshape(-1, shards[0].shape[-1])


def dequantized_product(rows: torch.Tensor, row_scale: torch.Tensor, weight: torch.Tensor,
                        w_scale: torch.Tensor) -> torch.Tensor:
    """torch._scaled_mm's product of e4m3 rows and weight^T, exactly (FP64: e4m3 products and their sums over
    K = 32 are exact, the power-of-2 scales too)."""
    return (rows.double() * row_scale.double()) @ (weight.double() * w_scale.double().reshape(-1, 1)).t()


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("use_fast_accum", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_fp8_all_gather_on_a_simulated_group(groups, monkeypatch, p, scaling, use_fast_accum, batch):
    """Each rank's e4m3 rows (and rowwise, their scales) gathered in rank order, sequence after sequence, times its
    weight, scaled: exact against the dequantized product; the gathered X is the e4m3 rows."""
    sim = SimulatedGroup(groups[p], monkeypatch)
    rows, k, n = 64 * batch, 32, 16
    xs = [quantize_rowwise(activations(rows, k, seed=20 + rank))[0] for rank in range(p)]
    weights = [e4m3_weights(n, k, seed=30 + rank) for rank in range(p)]
    if scaling == "tensorwise":
        x_scales, w_scales = [powers_of_2(seed=40 + rank) for rank in range(p)], [powers_of_2(1, seed=50)] * p
    else:
        x_scales = [powers_of_2(rows, 1, seed=40 + rank) for rank in range(p)]
        w_scales = [powers_of_2(1, n, seed=50 + rank) for rank in range(p)]
    results = sim.run(lambda r: tpfuse.all_gather_gemm(xs[r], weights[r], groups[p], return_gathered=True,
                                                       batch=batch, x_scale=x_scales[r], w_scale=w_scales[r],
                                                       use_fast_accum=use_fast_accum))
    assert {(q.dtype_code, q.scaling, q.accumulation) for q in sim.all_gather_problems} == {
        (1, 1 if scaling == "tensorwise" else 2, int(use_fast_accum))}
    X = gathered([x.double() for x in xs], batch)
    for rank, (y, gathered_x) in enumerate(results):
        row_scale = x_scales[rank] if scaling == "tensorwise" else gathered(x_scales, batch)
        expected = dequantized_product(X, row_scale, weights[rank], w_scales[rank])
        assert y.dtype == BF16 and torch.equal(y, expected.to(BF16))
        assert gathered_x.dtype == FP8 and torch.equal(gathered_x.double(), X)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_quantize_all_gather_gemm_is_quantize_after_gather(groups, monkeypatch, p, use_fast_accum):
    """Each rank quantizes its BF16 rows and the FP8 all-gather multiplies them with their rowwise scales: exactly
    the gathered BF16 rows quantized, then multiplied (torch._scaled_mm's product, FP64 here)."""
    sim = SimulatedGroup(groups[p], monkeypatch)
    xs = [activations(16, 32, seed=60 + rank) for rank in range(p)]
    weights = [e4m3_weights(24, 32, seed=70 + rank) for rank in range(p)]
    w_scales = [powers_of_2(1, 24, seed=80 + rank) for rank in range(p)]
    ys = sim.run(lambda r: tpfuse.quantize_all_gather_gemm(xs[r], weights[r], groups[p], w_scale=w_scales[r],
                                                           use_fast_accum=use_fast_accum))
    assert {(q.dtype_code, q.scaling, q.accumulation) for q in sim.all_gather_problems} == {
        (1, 2, int(use_fast_accum))}
    rows, scales = quantize_rowwise(torch.cat(xs))
    for rank, y in enumerate(ys):
        assert torch.equal(y, dequantized_product(rows, scales, weights[rank], w_scales[rank]).to(BF16))


# --- Blockwise ---

def reference_blockwise(x: torch.Tensor, block, power_of_2: bool):
    """x (R x C) quantized per block (r x c) in Python floats: (the e4m3 values as R rows, the scales as
    ceil(R/r) rows of ceil(C/c))."""
    rows, columns = block
    values = x.double().tolist()
    height, width = len(values), len(values[0])
    quantized = [[0.0] * width for _ in range(height)]
    scales = []
    for top in range(0, height, rows):
        scales.append([])
        for left in range(0, width, columns):
            cells = [(i, j) for i in range(top, min(top + rows, height)) for j in range(left, min(left + columns, width))]
            codes, scale = reference_quantized([values[i][j] for i, j in cells], power_of_2)
            for (i, j), code in zip(cells, codes):
                quantized[i][j] = code
            scales[-1].append(scale)
    return quantized, scales


def weights(n: int, k: int, seed: int) -> torch.Tensor:
    """BF16 weights (n > 128) of magnitudes 2^-20 to 2^20 (one per 128-row band), the first band's last block
    all zeros and the second band's one nonzero entry."""
    generator = torch.Generator().manual_seed(seed)
    bands = torch.pow(2.0, torch.randint(-20, 21, (-(-n // 128), 1, 1), generator=generator).double())
    w = (torch.randn(-(-n // 128), 128, k, generator=generator, dtype=torch.float64) * bands).reshape(-1, k)[:n]
    w[:, -128:] = 0
    w[130, -5] = -7.5
    return w.to(BF16)


@pytest.mark.parametrize("power_of_2", [False, True])
@pytest.mark.parametrize("kind", ["activations", "weights"])
def test_quantize_blockwise_is_the_reference_recipe(kind, power_of_2):
    """Activations per 1 x 128 tile, weights per 128 x 128 block (N = 200: a partial block of 72 rows), against the
    recipe in Python floats: the same e4m3 values and scales, the scales in tpfuse's layouts, FP32, contiguous."""
    if kind == "activations":
        x, block, scale_shape = activations(16, 384, seed=3), ACTIVATION_BLOCK, (16, 3)
    else:
        x, block, scale_shape = weights(200, 384, seed=4), WEIGHT_BLOCK, (2, 3)
    bits, scales = quantize_blockwise(x, block, power_of_2=power_of_2)
    values, reference_scales = reference_blockwise(x, block, power_of_2)
    assert bits.dtype == FP8 and bits.shape == x.shape and bits.is_contiguous()
    assert scales.dtype == torch.float32 and scales.shape == scale_shape and scales.is_contiguous()
    assert bits.double().tolist() == values
    assert scales.double().tolist() == reference_scales
    assert torch.all(scales > 0) and torch.all(torch.isfinite(scales))


@pytest.mark.parametrize("power_of_2", [False, True])
def test_blockwise_round_trip_is_within_e4m3s_rounding(power_of_2):
    """Each entry dequantized (FP64, exact) is within half an e4m3 step of x: 2^-4 of it for normal e4m3 values,
    2^-10 of the block's scale for subnormal ones (and FP32's rounding of x / scale beside it)."""
    for x, block in ((activations(32, 512, seed=5), ACTIVATION_BLOCK), (weights(200, 256, seed=6), WEIGHT_BLOCK),
                     (torch.randn(130, 200, generator=torch.Generator().manual_seed(7)), WEIGHT_BLOCK)):
        bits, scales = quantize_blockwise(x, block, power_of_2=power_of_2)
        round_trip = dequantize_blockwise(bits, scales, block, dtype=torch.float64)
        element_scales = dequantize_blockwise(torch.ones_like(x, dtype=FP8), scales, block, dtype=torch.float64)
        error = (round_trip - x.double()).abs()
        bound = (2.0 ** -4 + 2.0 ** -20) * x.double().abs() + 2.0 ** -10 * element_scales
        assert torch.all(error <= bound), f"{(error - bound).max()} past the bound"
        assert torch.equal(round_trip, bits.double() * element_scales)


@pytest.mark.parametrize("power_of_2", [False, True])
def test_each_tiles_largest_entry_maps_to_448(power_of_2):
    """DeepSeek-V3's scale maps each nonzero tile's largest magnitude to 448; a power of 2 at least amax / 448 maps
    it into (224, 448], which e4m3 rounds into [224, 448]."""
    x = activations(32, 512, seed=11)
    bits, _ = quantize_blockwise(x, power_of_2=power_of_2)
    largest = bits.double().abs().view(32, 4, 128).amax(dim=-1)
    nonzero = x.double().abs().view(32, 4, 128).amax(dim=-1) > 0
    assert torch.all(largest[~nonzero] == 0) and torch.all(largest <= E4M3_MAX)
    assert torch.all(largest[nonzero] >= 224) if power_of_2 else torch.all(largest[nonzero] == E4M3_MAX)


@pytest.mark.parametrize("power_of_2", [False, True])
def test_zero_blocks_dequantize_to_zeros(power_of_2):
    x = torch.zeros(4, 256, dtype=BF16)
    x[1, 200] = 1.0  # one block of one nonzero entry beside three zero blocks
    bits, scales = quantize_blockwise(x, ACTIVATION_BLOCK, power_of_2=power_of_2)
    zero_blocks = torch.ones(4, 2, dtype=torch.bool)
    zero_blocks[1, 1] = False
    assert torch.all(torch.isfinite(scales)) and torch.all(scales > 0)
    assert torch.all(scales[zero_blocks] == scales[0, 0])  # the EPS clamp's scale
    round_trip = dequantize_blockwise(bits, scales, ACTIVATION_BLOCK)
    assert not torch.isnan(round_trip).any() and torch.equal(round_trip, x.float())


def test_power_of_2_scales_are_torchaos():
    """power_of_2: powers of 2 at least amax / 448 (so nothing saturates), and with one block per row, the bits
    and scales of quantize_rowwise, torchao's rowwise recipe."""
    x = activations(64, 256, seed=8)
    bits, scales = quantize_blockwise(x, (1, 256), power_of_2=True)
    rowwise_bits, rowwise_scales = quantize_rowwise(x)
    assert torch.equal(bits.view(torch.uint8), rowwise_bits.view(torch.uint8)) and torch.equal(scales, rowwise_scales)
    _, scales = quantize_blockwise(weights(200, 256, seed=9), WEIGHT_BLOCK, power_of_2=True)
    assert torch.equal(torch.exp2(torch.round(torch.log2(scales))), scales)


def test_quantize_blockwise_is_deterministic_and_takes_batches_and_any_float():
    x = torch.randn(2, 3, 64, 256, generator=torch.Generator().manual_seed(10))
    bits, scales = quantize_blockwise(x)
    again = quantize_blockwise(x)
    assert torch.equal(bits.view(torch.uint8), again[0].view(torch.uint8)) and torch.equal(scales, again[1])
    assert scales.shape == (2, 3, 64, 2)
    first_bits, first_scales = quantize_blockwise(x[1, 2])
    assert torch.equal(bits[1, 2].view(torch.uint8), first_bits.view(torch.uint8))
    assert torch.equal(scales[1, 2], first_scales)
    for dtype in (BF16, torch.float16, torch.float64):  # FP32 amax and division whatever the input
        assert torch.equal(quantize_blockwise(x.to(dtype).float())[1], quantize_blockwise(x.to(dtype))[1])


@pytest.mark.parametrize("x, block, message", [
    (torch.zeros(256), ACTIVATION_BLOCK, "x has 1 dimensions and dtype torch.float32"),
    (torch.zeros(4, 256, dtype=FP8), ACTIVATION_BLOCK, "x has 2 dimensions and dtype torch.float8_e4m3fn"),
    (torch.zeros(4, 256, dtype=torch.int32), ACTIVATION_BLOCK, "dtype torch.int32"),
    (torch.zeros(4, 256), (0, 128), "block = (0, 128) must be two positive integers"),
    (torch.zeros(4, 256), (128,), "block = (128,) must be two positive integers"),
])
def test_quantize_blockwise_bad_arguments(x, block, message):
    with pytest.raises(tpfuse.InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quantize_blockwise(x, block)


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2])
def test_blockwise_reduce_scatter_on_a_simulated_group(groups, monkeypatch, p, batch):
    """Each rank's activations and weight (N = 200: a partial block) quantized blockwise with power-of-2 scales
    (FP64 sums of the products exact) through gemm_reduce_scatter: the C ABI's blockwise code and promoted
    accumulation in every launch, and each rank's rows, sequence after sequence, exact against the reduce-scatter
    of the dequantized products."""
    sim = SimulatedGroup(groups[p], monkeypatch)
    m, n, k = 64 * p * batch, 200, 256
    a = [quantize_blockwise(activations(m, k, seed=90 + r), power_of_2=True) for r in range(p)]
    w = [quantize_blockwise(weights(n, k, seed=95 + r), WEIGHT_BLOCK, power_of_2=True) for r in range(p)]
    outs = sim.run(lambda r: tpfuse.gemm_reduce_scatter(a[r][0], w[r][0], groups[p], a_scale=a[r][1],
                                                        w_scale=w[r][1], batch=batch))
    assert {(q.dtype_code, q.scaling, q.accumulation) for q in sim.problems} == {
        (1, _library.SCALING_CODES["blockwise"], 0)}
    total = sum(dequantize_blockwise(*a[r], dtype=torch.float64) @
                dequantize_blockwise(*w[r], WEIGHT_BLOCK, dtype=torch.float64).t() for r in range(p))
    for rank, out in enumerate(outs):
        expected = total.view(batch, p, -1, n)[:, rank].reshape(-1, n)
        assert out.dtype == BF16 and torch.equal(out, expected.to(BF16))


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2])
def test_blockwise_all_gather_on_a_simulated_group(groups, monkeypatch, p, batch):
    """Each rank's activations (this rank's rows) and weight (N/P = 200: a partial block) quantized blockwise with
    power-of-2 scales through all_gather_gemm: the C ABI's blockwise code and promoted accumulation in every launch;
    each rank's rows and their 1 x 128 tiles' scales gathered in rank order, sequence after sequence, Y exact
    against the dequantized product, the gathered X the e4m3 rows."""
    sim = SimulatedGroup(groups[p], monkeypatch)
    rows, n, k = 64 * batch, 200, 256
    xs = [quantize_blockwise(activations(rows, k, seed=100 + r), power_of_2=True) for r in range(p)]
    w = [quantize_blockwise(weights(n, k, seed=105 + r), WEIGHT_BLOCK, power_of_2=True) for r in range(p)]
    results = sim.run(lambda r: tpfuse.all_gather_gemm(xs[r][0], w[r][0], groups[p], return_gathered=True,
                                                       batch=batch, x_scale=xs[r][1], w_scale=w[r][1]))
    assert {(q.dtype_code, q.scaling, q.accumulation) for q in sim.all_gather_problems} == {
        (1, _library.SCALING_CODES["blockwise"], 0)}
    X, X_scale = (gathered([x[i] for x in xs], batch) for i in (0, 1))
    for rank, (y, gathered_x) in enumerate(results):
        expected = dequantize_blockwise(X, X_scale, dtype=torch.float64) @ \
            dequantize_blockwise(*w[rank], WEIGHT_BLOCK, dtype=torch.float64).t()
        assert y.dtype == BF16 and torch.equal(y, expected.to(BF16))
        assert gathered_x.dtype == FP8 and torch.equal(gathered_x.view(torch.uint8), X.view(torch.uint8))


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2])
def test_blockwise_quantize_all_gather_gemm_is_quantize_after_gather(groups, monkeypatch, p, batch):
    """Each rank quantizes its BF16 rows per 1 x 128 tile (DeepSeek-V3's scales) and the FP8 all-gather multiplies
    them: each rank's e4m3 rows and scales are its share of the gathered BF16 rows quantized, and Y is, bit for
    bit, all_gather_gemm's of those shares (the blockwise launch each time)."""
    sim = SimulatedGroup(groups[p], monkeypatch)
    rows, n, k = 64 * batch, 200, 384
    xs = [activations(rows, k, seed=110 + r) for r in range(p)]
    w = [quantize_blockwise(weights(n, k, seed=115 + r), WEIGHT_BLOCK) for r in range(p)]
    ys = sim.run(lambda r: tpfuse.quantize_all_gather_gemm(xs[r], w[r][0], groups[p], w_scale=w[r][1], batch=batch,
                                                           scaling="blockwise"))
    X8, X_scale = quantize_blockwise(gathered(xs, batch))
    shares = [quantize_blockwise(x) for x in xs]
    for i, whole in enumerate((X8.view(torch.uint8), X_scale)):
        assert torch.equal(gathered([share[i].view(torch.uint8) if i == 0 else share[i] for share in shares], batch),
                           whole)
    expected = sim.run(lambda r: tpfuse.all_gather_gemm(*shares[r][:1], w[r][0], groups[p], batch=batch,
                                                        x_scale=shares[r][1], w_scale=w[r][1]))
    assert {q.scaling for q in sim.all_gather_problems} == {_library.SCALING_CODES["blockwise"]}
    for y, y_expected in zip(ys, expected):
        assert torch.equal(y, y_expected)


def test_blockwise_quantize_all_gather_gemm_of_one_row_per_rank_gathers_each_ranks_scales(groups, monkeypatch):
    """One row per rank, K = 128, N/P = 24: every scale is one element, which all_gather_gemm's shape rule takes as
    tensorwise (this rank's x_scale for every gathered row); quantize_all_gather_gemm's blockwise form launches
    blockwise, so each rank's row keeps its own scale (2^(r-9) on rank r, exact): Y exact against the dequantized
    product of the gathered rows quantized."""
    p, n, k = 2, 24, 128
    sim = SimulatedGroup(groups[p], monkeypatch)
    generator = torch.Generator().manual_seed(120)
    xs = [torch.randint(-7, 8, (1, k), generator=generator).double() * 2.0 ** (r - 3) for r in range(p)]
    for r, x in enumerate(xs):
        x[0, 0] = 7 * 2.0 ** (r - 3)  # the tile's amax: its scale amax / 448 = 2^(r-9)
    xs = [x.to(BF16) for x in xs]
    w, w_scale = e4m3_weights(n, k, seed=121), powers_of_2(1, 1, seed=122)
    ys = sim.run(lambda r: tpfuse.quantize_all_gather_gemm(xs[r], w, groups[p], w_scale=w_scale, scaling="blockwise"))
    assert {q.scaling for q in sim.all_gather_problems} == {_library.SCALING_CODES["blockwise"]}
    X8, X_scale = quantize_blockwise(torch.cat(xs))
    assert torch.equal(X_scale, torch.tensor([[2.0 ** -9], [2.0 ** -8]]))
    expected = dequantized_product(X8, X_scale, w, w_scale)
    for y in ys:
        assert torch.equal(y, expected.to(BF16))
