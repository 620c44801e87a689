"""FP8 all-gather on the CPU: tpfuse.float8.quantize_rowwise against a reference written from torchao's rowwise
recipe with Python's own arithmetic (and against torchao itself where it is installed); the FP8 all_gather_gemm
and quantize_all_gather_gemm on a simulated group (simulated_group.py) exact against the dequantized product of
the gathered rows, with the C ABI's codes in the launch; quantizing before the gather equal to quantizing
after it."""

import math
import struct

import pytest
import torch

import tpfuse
from tpfuse.float8 import quantize_rowwise
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


def reference_rowwise(x: torch.Tensor):
    """Each row of BF16 x as torchao's rowwise recipe quantizes it, in Python floats: (the e4m3 values, the
    dequantizing scale) per row."""
    rows, scales = [], []
    for row in x.double().tolist():
        amax = max(abs(value) for value in row)
        scale = float32(E4M3_MAX / max(amax, 1e-12))
        # 2^floor(log2(scale)): frexp gives scale = m 2^e with m in [0.5, 1). (torchao's FP32 log2 agrees here:
        # 448 / a BF16 amax is a power of 2 exactly or differs from one by far more than log2's rounding.)
        power = 2.0 ** (math.frexp(scale)[1] - 1)
        rows.append([e4m3(min(max(value * power, -E4M3_MAX), E4M3_MAX)) for value in row])
        scales.append(1.0 / power)
    return rows, scales


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

    def gathered(tensors):  # each sequence's rows in rank order, sequence after sequence
        return torch.cat([t.view(batch, -1, t.shape[-1]) for t in tensors], dim=1).reshape(-1, tensors[0].shape[-1])

    X = gathered([x.double() for x in xs])
    for rank, (y, gathered_x) in enumerate(results):
        row_scale = x_scales[rank] if scaling == "tensorwise" else gathered(x_scales)
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
