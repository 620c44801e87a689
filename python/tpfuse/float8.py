"""FP8 (e4m3) rowwise quantization of activations, as torchao's float8 training casts them with its rowwise
recipe: torchao.float8's hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, ..., scaling_granularity=
ScalingGranularity.AXISWISE, axiswise_dim=-1, round_scales_to_power_of_2=True), with the same torch operations
in the same order (float8_utils.tensor_to_amax, amax_to_scale, _round_scale_down_to_power_of_2 and
to_fp8_saturated), so that the bits are the same:

    amax   = max over the row of |x| in FP32
    scale  = E4M3_MAX / max(amax, EPS), divided in FP64, then rounded to FP32
    scale  = 2 ** floor(log2(scale))                        (rounded down to a power of 2)
    x_fp8  = clamp(x (FP32) * scale, -E4M3_MAX, E4M3_MAX) as e4m3

torch._scaled_mm takes the dequantizing scale, 1 / scale (exact: a power of 2), which quantize_rowwise
returns. Each row's scale depends on that row alone, so quantizing each rank's rows before an all-gather gives
the bits that quantizing the gathered rows gives."""

from typing import Tuple

import torch

from ._checks import E4M3

E4M3_MAX = torch.finfo(E4M3).max  # 448
# torchao's EPS: the smallest amax a scale is made from (an all-zero row gets a finite scale).
AMAX_EPS = 1e-12


def quantize_rowwise(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """x's rows (along the last dimension) as e4m3 with one power-of-2 scale each: (the e4m3 tensor, the FP32
    dequantizing scales of x's shape with 1 last, the reciprocal of torchao's scale, as torch._scaled_mm takes
    them)."""
    amax = torch.amax(torch.abs(torch.abs(x).to(torch.float32)), dim=-1, keepdim=True)
    # torchao divides in FP64 so that eager and compiled code agree.
    scale = (E4M3_MAX / torch.clamp(amax.to(torch.float64), min=AMAX_EPS)).to(torch.float32)
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    bits = (x.to(torch.float32) * scale).clamp(min=-E4M3_MAX, max=E4M3_MAX).to(E4M3)
    return bits, scale.reciprocal()
