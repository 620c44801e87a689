"""FP8 (e4m3) quantization: rowwise, of activations, as torchao's float8 training casts them; blockwise, of
activations per 1 x 128 tile and of weights per 128 x 128 block, as DeepSeek-V3 quantizes them.

quantize_rowwise is torchao's rowwise recipe: torchao.float8's hp_tensor_to_float8_dynamic(x,
torch.float8_e4m3fn, ..., scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1,
round_scales_to_power_of_2=True), with the same torch operations in the same order (float8_utils.tensor_to_amax,
amax_to_scale, _round_scale_down_to_power_of_2 and to_fp8_saturated), so that the bits are the same:

    amax   = max over the row of |x| in FP32
    scale  = E4M3_MAX / max(amax, EPS), divided in FP64, then rounded to FP32
    scale  = 2 ** floor(log2(scale))                        (rounded down to a power of 2)
    x_fp8  = clamp(x (FP32) * scale, -E4M3_MAX, E4M3_MAX) as e4m3

torch._scaled_mm takes the dequantizing scale, 1 / scale (exact: a power of 2), which quantize_rowwise
returns. Each row's scale depends on that row alone, so quantizing each rank's rows before an all-gather gives
the bits that quantizing the gathered rows gives.

quantize_blockwise gives tpfuse's blockwise scales (gemm_reduce_scatter's a_scale (M, K/128) and w_scale
(ceil(N/128), K/128)), as DeepSeek-V3's reference code (act_quant, weight quantization) makes them:

    amax   = max over the block of |x| in FP32, at least EPS (an all-zero block gets a finite scale)
    scale  = amax / E4M3_MAX                                (the dequantizing scale, FP32)
    x_fp8  = clamp(x (FP32) / scale, -E4M3_MAX, E4M3_MAX) as e4m3

With power_of_2, the scale is the one torchao rounds to a power of 2 (the rowwise recipe's above, per block): the
smallest power of 2 at least amax / E4M3_MAX, and x is multiplied by its reciprocal, exactly.

BlockwiseRecipe is tpfuse.nn's FP8 option for these blocks (its docstring says what runs in FP8), and
blockwise_weight_grad its FP8 weight gradient: both operands quantized per 128 tokens of each feature
(TOKEN_BLOCK), each 128 tokens' products summed in FP32 and scaled, as an FP8 GEMM with blockwise scales does."""

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F

from ._checks import E4M3, is_fp8
from .errors import InvalidArgumentError

E4M3_MAX = torch.finfo(E4M3).max  # 448
# torchao's EPS: the smallest amax a scale is made from (an all-zero row or block gets a finite scale).
AMAX_EPS = 1e-12
# The blocks of tpfuse's blockwise scales: activations' 1 x 128 tiles of K, weights' 128 x 128 blocks (N x K).
ACTIVATION_BLOCK = (1, 128)
WEIGHT_BLOCK = (128, 128)
# The weight gradient's operands (M tokens x features, the tokens its reduction dimension): 128 tokens of a feature.
TOKEN_BLOCK = (128, 1)
WGRAD_PRECISIONS = ("bf16", "fp8")


def _power_of_2_multipliers(amax: torch.Tensor) -> torch.Tensor:
    """torchao's quantizing scale of each amax, rounded down to a power of 2 (FP32)."""
    # torchao divides in FP64 so that eager and compiled code agree.
    scale = (E4M3_MAX / torch.clamp(amax.to(torch.float64), min=AMAX_EPS)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(scale)))


def _saturated(x: torch.Tensor) -> torch.Tensor:
    """FP32 x as e4m3, clamped to its finite range first."""
    return x.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(E4M3)


def quantize_rowwise(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """x's rows (along the last dimension) as e4m3 with one power-of-2 scale each: (the e4m3 tensor, the FP32
    dequantizing scales of x's shape with 1 last, the reciprocal of torchao's scale, as torch._scaled_mm takes
    them)."""
    amax = torch.amax(torch.abs(torch.abs(x).to(torch.float32)), dim=-1, keepdim=True)
    scale = _power_of_2_multipliers(amax)
    return _saturated(x.to(torch.float32) * scale), scale.reciprocal()


def _check_block(block) -> Tuple[int, int]:
    if len(block) != 2 or not all(isinstance(extent, int) and extent > 0 for extent in block):
        raise InvalidArgumentError(f"block = {block!r} must be two positive integers (rows, columns)")
    return tuple(block)


def _blocks_of(x: torch.Tensor, block: Tuple[int, int]) -> torch.Tensor:
    """x's last two dimensions (R x C) as (..., ceil(R/r), r, ceil(C/c), c) blocks, FP32, a partial block padded
    with zeros."""
    rows, columns = block
    pad_rows, pad_columns = -x.shape[-2] % rows, -x.shape[-1] % columns
    padded = F.pad(x.to(torch.float32), (0, pad_columns, 0, pad_rows))
    *leading, height, width = padded.shape
    return padded.view(*leading, height // rows, rows, width // columns, columns)


def _per_element(scale: torch.Tensor) -> torch.Tensor:
    """Block scales (..., R/r, C/c) broadcast over their blocks' elements (..., R/r, 1, C/c, 1)."""
    return scale[..., :, None, :, None]


def quantize_blockwise(x: torch.Tensor, block=ACTIVATION_BLOCK,
                       power_of_2: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """x as e4m3 with one FP32 dequantizing scale per block of its last two dimensions (R x C): (the e4m3
    tensor of x's shape, the scales (..., ceil(R/r), ceil(C/c)), contiguous), block = (r, c).

    block=ACTIVATION_BLOCK (1, 128): activations (M x K), one scale per row and 128 of K, gemm_reduce_scatter's
    a_scale (M, K/128). block=WEIGHT_BLOCK (128, 128): an N x K weight (nn.Linear's), one scale per 128 x 128
    block, its w_scale (ceil(N/128), K/128); a partial block where R or C is not a multiple of the block's
    extent (tpfuse's kernels take K a multiple of 128, and any N). Dimensions before the last two are a batch.
    Scale amax / 448 (DeepSeek-V3), or with power_of_2 the power of 2 torchao rounds it to; an all-zero block
    gets a finite scale and e4m3 zeros. Pure torch, deterministic, on any device."""
    rows, columns = _check_block(block)
    if x.dim() < 2 or not x.dtype.is_floating_point or is_fp8(x.dtype):
        raise InvalidArgumentError(f"x has {x.dim()} dimensions and dtype {x.dtype}; quantize_blockwise takes a "
                                   "matrix (or a batch of them) of a floating-point type wider than 8 bits")
    blocks = _blocks_of(x, (rows, columns))
    amax = blocks.abs().amax(dim=(-3, -1))
    if power_of_2:
        multiplier = _power_of_2_multipliers(amax)
        scale, quantized = multiplier.reciprocal(), blocks * _per_element(multiplier)
    else:
        scale = torch.clamp(amax, min=AMAX_EPS) / E4M3_MAX
        quantized = blocks / _per_element(scale)
    padded = _saturated(quantized).flatten(-4, -3).flatten(-2, -1)
    return padded[..., :x.shape[-2], :x.shape[-1]].contiguous(), scale.contiguous()


def dequantize_blockwise(x: torch.Tensor, scale: torch.Tensor, block=ACTIVATION_BLOCK,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """quantize_blockwise's e4m3 x and scales back as `dtype`: each element times its block's scale (exact in
    torch.float64: an e4m3 value times an FP32 scale fits its 53 bits)."""
    rows, columns = _check_block(block)
    expanded = scale.to(dtype).repeat_interleave(rows, dim=-2).repeat_interleave(columns, dim=-1)
    return x.to(dtype) * expanded[..., :x.shape[-2], :x.shape[-1]]


def blockwise_weight_grad(grad: torch.Tensor, operand: torch.Tensor, power_of_2: bool = False) -> torch.Tensor:
    """grad^T @ operand (M x N and M x K, the M tokens summed over: N x K, FP32) as an FP8 GEMM with blockwise scales
    computes it: both quantized per 128 tokens of each feature (TOKEN_BLOCK, quantize_blockwise, with power_of_2 as
    there; a last partial block of fewer tokens), each block's products of the e4m3 values summed in FP32 (exact
    products: e4m3 values are exact in FP32, and in TF32), times the two blocks' scales, and added into the FP32
    sum, block after block.

    An emulation in torch ops on any device (torch has no FP8 GEMM taking these scales on every version tpfuse
    supports): M/128 FP32 GEMMs of depth 128, correct, not fast."""
    grad_fp8, grad_scale = quantize_blockwise(grad, TOKEN_BLOCK, power_of_2)            # (ceil(M/128), N)
    operand_fp8, operand_scale = quantize_blockwise(operand, TOKEN_BLOCK, power_of_2)   # (ceil(M/128), K)
    total = torch.zeros(grad.shape[1], operand.shape[1], dtype=torch.float32, device=grad.device)
    tokens = TOKEN_BLOCK[0]
    for block in range(grad_scale.shape[0]):
        rows = slice(block * tokens, (block + 1) * tokens)
        products = torch.mm(grad_fp8[rows].t().float(), operand_fp8[rows].float())
        total += products.mul_(grad_scale[block, :, None]).mul_(operand_scale[block])
    return total


@dataclass(frozen=True)
class BlockwiseRecipe:
    """tpfuse.nn's FP8 training recipe with DeepSeek-V3's blocks (the layers' `fp8=` option):

    - forward: the input quantized per 1 x 128 tile of its features (ACTIVATION_BLOCK), the weight per 128 x 128
      block (WEIGHT_BLOCK), from the BF16 master weight at each forward; the fused op multiplies them with their
      blockwise scales and adds the bias; the output is BF16.
    - the input's gradient (dgrad): the incoming gradient quantized per 1 x 128 tile of its features, times the
      weight's transpose, whose blocks are the forward's transposed (the same e4m3 values and scales), through the
      fused op the BF16 backward uses.
    - the weight's gradient (wgrad): "bf16" (default), the BF16 GEMM of the BF16 layer, on the activations and the
      gradient as this rank has them (a tensor a fused op gathered in FP8, dequantized to BF16); or "fp8",
      blockwise_weight_grad of the same operands (both quantized per 128 tokens). Into main_grad in FP32 either way.

    power_of_2_scales: every scale of the recipe (the input's, the weight's, the gradient's, and the FP8 wgrad's
    operands') the power of 2 quantize_blockwise(power_of_2=True) makes, so that quantizing is an exact scaling;
    False (the default): amax / 448, as DeepSeek-V3's.

    Both dimensions of a layer's weight shard are reduction dimensions (the forward's and the dgrad's), so both
    must be multiples of 128."""

    wgrad: str = "bf16"
    power_of_2_scales: bool = False

    def __post_init__(self):
        if self.wgrad not in WGRAD_PRECISIONS:
            raise InvalidArgumentError(f"wgrad = {self.wgrad!r} must be one of {WGRAD_PRECISIONS}: the weight "
                                       "gradient's GEMM in BF16 or in FP8")
        if not isinstance(self.power_of_2_scales, bool):
            raise InvalidArgumentError(f"power_of_2_scales = {self.power_of_2_scales!r} must be True or False")
