"""One reference, one unfused path and one set of error measures, shared by the GPU tests and the
benchmark (docs/SPEC.md's rule: each of the fused op's errors at most 1.1x the unfused path's); for FP8
(E4M3) inputs of either op, the reference is the exact product of the dequantized inputs and the unfused path
torch._scaled_mm's (for blockwise scales, its tensorwise product of each 128 of K, scaled and summed)."""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .float8 import ACTIVATION_BLOCK, WEIGHT_BLOCK, dequantize_blockwise, quantize_blockwise

ERROR_FACTOR = 1.1


def weight_as_k_by_n(w: torch.Tensor, weight_layout: str) -> torch.Tensor:
    """The K/P x N matrix W that a @ W multiplies by (a view for 'nk')."""
    return w.t() if weight_layout == "nk" else w


def random_operands(m: int, n: int, k_per_rank: int, weight_layout: str, device: torch.device, seed: int,
                    small_integers: bool = False):
    """This rank's a (M x K/P) and w, BF16, drawn from `seed` (make it differ per rank). With
    small_integers, entries in {-1, 0, 1}: every partial and sum of up to 256 is exact in BF16."""
    generator = torch.Generator(device=device).manual_seed(seed)
    w_shape = (n, k_per_rank) if weight_layout == "nk" else (k_per_rank, n)

    def draw(*shape):
        if small_integers:
            return torch.randint(-1, 2, shape, generator=generator, device=device).to(torch.bfloat16)
        return torch.randn(*shape, generator=generator, device=device).to(torch.bfloat16)

    return draw(m, k_per_rank), draw(*w_shape)


def reference_rows(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's rows of the FP32 reduce-scatter of the FP32 products of the BF16 inputs."""
    partial = a.float() @ weight_as_k_by_n(w, weight_layout).float()
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows


def unfused_rows(a: torch.Tensor, w: torch.Tensor, weight_layout: str, group: dist.ProcessGroup) -> torch.Tensor:
    """The unfused path: torch.mm (BF16 out), then reduce_scatter_tensor (BF16, sum)."""
    partial = torch.mm(a, weight_as_k_by_n(w, weight_layout))
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows


E4M3_MAX = 448.0  # torch.float8_e4m3fn's largest finite value


def _scale_of(values: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """The FP32 scale mapping the largest magnitude (of each row, or of the whole) to E4M3_MAX."""
    amax = values.abs().amax(dim=1, keepdim=True) if rowwise else values.abs().amax()
    return (amax.clamp(min=1e-12) / E4M3_MAX).float()


def fp8_operands(m: int, n: int, k_per_rank: int, device: torch.device, seed: int, scaling: str,
                 small_integers: bool = False, scale_seed: int = 0, odd_rank: bool = False):
    """This rank's a (M x K/P) and w (N x K/P, "nk"), torch.float8_e4m3fn, with their FP32 scales: tensorwise
    (one element each) or rowwise (a_scale (M, 1), w_scale (1, N): torch._scaled_mm's shapes). Random: normal
    values quantized with the scale that maps each tensor's (or row's) largest magnitude to E4M3_MAX. With
    small_integers: a's and w's dequantized entries in {-1, 0, 1} (drawn from `seed`) and power-of-2 scales
    from 1/4 to 4 drawn from `scale_seed` (the same on every rank: then every output is an integer of at most K
    times one scale product, exact in BF16 for K <= 256); on an odd_rank, a's stored entries are halved and
    a_scale doubled (the same dequantized values from other scales: each rank's own scales must apply to its
    own partial)."""
    rowwise = {"tensorwise": False, "rowwise": True}[scaling]
    generator = torch.Generator(device=device).manual_seed(seed)
    if small_integers:
        def draw(*shape):
            return torch.randint(-1, 2, shape, generator=generator, device=device).float()

        scale_generator = torch.Generator(device=device).manual_seed(scale_seed)

        def powers_of_2(*shape):
            return torch.pow(2.0, torch.randint(-2, 3, shape, generator=scale_generator, device=device).float())

        a, w = draw(m, k_per_rank), draw(n, k_per_rank)
        a_scale = powers_of_2(m, 1) if rowwise else powers_of_2()
        w_scale = powers_of_2(1, n) if rowwise else powers_of_2()
        if odd_rank:
            a, a_scale = a / 2, a_scale * 2
        return a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), a_scale, w_scale
    a = torch.randn(m, k_per_rank, generator=generator, device=device)
    w = torch.randn(n, k_per_rank, generator=generator, device=device)
    a_scale, w_scale = _scale_of(a, rowwise), _scale_of(w, rowwise)
    quantized = [(x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn) for x, scale in
                 ((a, a_scale), (w, w_scale))]
    return quantized[0], quantized[1], a_scale, w_scale.reshape(1, n) if rowwise else w_scale


def dequantized(x: torch.Tensor, scale: torch.Tensor, block=None) -> torch.Tensor:
    """x's FP8 values times their scales (one, one per row of x, or with `block` one per block of x), exactly, in
    FP64."""
    if block is not None:
        return dequantize_blockwise(x, scale, block, dtype=torch.float64)
    return x.double() * (scale.double() if scale.numel() == 1 else scale.double().reshape(-1, 1))


def fp8_reference_rows(a: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
                       group: dist.ProcessGroup, bias=None, blockwise: bool = False) -> torch.Tensor:
    """This rank's rows of the FP64 reduce-scatter of the exact products of the dequantized E4M3 inputs
    (w N x K/P; blockwise: a's scales per 1 x 128 tile, w's per 128 x 128 block), plus the bias."""
    a_block, w_block = (ACTIVATION_BLOCK, WEIGHT_BLOCK) if blockwise else (None, None)
    partial = dequantized(a, a_scale, a_block) @ dequantized(w, w_scale, w_block).t()
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows if bias is None else rows + bias.double()


def fp8_unfused_rows(a: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
                     group: dist.ProcessGroup, use_fast_accum: bool = False, bias=None) -> torch.Tensor:
    """The unfused FP8 path: torch._scaled_mm (BF16 out, the bias on rank 0's partial only), then
    reduce_scatter_tensor (BF16, sum)."""
    partial = torch._scaled_mm(a, w.t(), a_scale, w_scale, bias=bias if group.rank() == 0 else None,
                               out_dtype=torch.bfloat16, use_fast_accum=use_fast_accum)
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows


def fp8_blockwise_operands(m: int, n: int, k_per_rank: int, device: torch.device, seed: int,
                           small_integers: bool = False):
    """This rank's a (M x K/P) and w (N x K/P), torch.float8_e4m3fn, with blockwise scales: a_scale (M, K/P/128)
    and w_scale (ceil(N/128), K/P/128). Random: normal values quantized by tpfuse.float8.quantize_blockwise
    (DeepSeek-V3's scales). With small_integers: dequantized entries in {-1, 0, 1} (drawn from `seed`) stored as
    +-2^-t with their block's scale 2^t, t from -3 to 3 drawn per block, so that only each block's own scales
    give the integer products back (exact in BF16 up to 256)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    if not small_integers:
        a, a_scale = quantize_blockwise(torch.randn(m, k_per_rank, generator=generator, device=device))
        w, w_scale = quantize_blockwise(torch.randn(n, k_per_rank, generator=generator, device=device), WEIGHT_BLOCK)
        return a, w, a_scale, w_scale

    def draw(rows: int, block) -> tuple:
        values = torch.randint(-1, 2, (rows, k_per_rank), generator=generator, device=device).float()
        exponents = torch.randint(-3, 4, (-(-rows // block[0]), k_per_rank // 128), generator=generator, device=device)
        scale = torch.pow(2.0, exponents.float())
        # Each block's values times 2^-t, exact: what its scale 2^t dequantizes back.
        return dequantize_blockwise(values, scale.reciprocal(), block).to(torch.float8_e4m3fn), scale

    (a, a_scale), (w, w_scale) = draw(m, ACTIVATION_BLOCK), draw(n, WEIGHT_BLOCK)
    return a, w, a_scale, w_scale


def _blockwise_scaled_mm(a: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor,
                         w_scale: torch.Tensor) -> torch.Tensor:
    """The unfused product of blockwise scales, from torch._scaled_mm's tensorwise product (which every torch from
    the floor has): each 128 of K's product in FP32 (unit scales), times its block's a_scale (one per row) and
    w_scale (one per 128 output columns), summed in FP32 and rounded to BF16 once."""
    one = torch.ones((), device=a.device)
    product = torch.zeros(a.shape[0], w.shape[0], device=a.device)
    for block in range(a.shape[1] // 128):
        k = slice(128 * block, 128 * (block + 1))
        block_product = torch._scaled_mm(a[:, k].contiguous(), w[:, k].contiguous().t(), one, one,
                                         out_dtype=torch.float32)
        column_scales = w_scale[:, block].repeat_interleave(128)[:w.shape[0]]
        product += block_product * a_scale[:, block:block + 1] * column_scales
    return product.to(torch.bfloat16)


def fp8_blockwise_unfused_rows(a: torch.Tensor, w: torch.Tensor, a_scale: torch.Tensor, w_scale: torch.Tensor,
                               group: dist.ProcessGroup) -> torch.Tensor:
    """The unfused path of blockwise scales: each rank's product by _blockwise_scaled_mm, then
    reduce_scatter_tensor (BF16, sum)."""
    partial = _blockwise_scaled_mm(a, w, a_scale, w_scale)
    rows = partial.new_empty(partial.shape[0] // group.size(), partial.shape[1])
    dist.reduce_scatter_tensor(rows, partial, group=group)
    return rows


def gathered_rows(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's rows of x, in rank order (all_gather_into_tensor; FP8 rows as their bytes)."""
    if x.dtype.itemsize == 1 and x.dtype.is_floating_point:
        return gathered_rows(x.view(torch.uint8), group).view(x.dtype)
    gathered = x.new_empty(x.shape[0] * group.size(), x.shape[1])
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
    return gathered


def _gathered_fp8(x: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, group: dist.ProcessGroup):
    """The all-gather's E4M3 rows and their scales: every rank's rows with, rowwise or blockwise (either scale of
    more than one element), every rank's rows' scales ((M, 1), or (M, K/128)); tensorwise, this rank's one scale,
    which applies to every gathered row (torch's fused_all_gather_scaled_matmul applies A_scale so)."""
    per_row = x_scale.numel() > 1 or w_scale.numel() > 1
    scales = gathered_rows(x_scale.reshape(x.shape[0], -1), group) if per_row else x_scale
    return gathered_rows(x, group), scales


def fp8_all_gather_reference(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                             group: dist.ProcessGroup, bias=None, blockwise: bool = False) -> torch.Tensor:
    """The FP8 all-gather's Y exactly (FP64): the gathered, dequantized E4M3 rows times this rank's dequantized w
    (N/P x K; blockwise: x's scales per 1 x 128 tile, w's per 128 x 128 block), plus the bias."""
    rows, scales = _gathered_fp8(x, x_scale, w_scale, group)
    x_block, w_block = (ACTIVATION_BLOCK, WEIGHT_BLOCK) if blockwise else (None, None)
    product = dequantized(rows, scales, x_block) @ dequantized(w, w_scale, w_block).t()
    return product if bias is None else product + bias.double()


def fp8_all_gather_unfused(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                           group: dist.ProcessGroup, use_fast_accum: bool = False, bias=None) -> torch.Tensor:
    """The FP8 all-gather's unfused path: all_gather_into_tensor of the E4M3 rows (and rowwise, of their scales),
    then torch._scaled_mm (BF16 out, the bias added to every row)."""
    rows, scales = _gathered_fp8(x, x_scale, w_scale, group)
    return torch._scaled_mm(rows, w.t(), scales, w_scale, bias=bias, out_dtype=torch.bfloat16,
                            use_fast_accum=use_fast_accum)


def fp8_blockwise_all_gather_unfused(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                                     group: dist.ProcessGroup) -> torch.Tensor:
    """The FP8 all-gather's unfused path with blockwise scales: all_gather_into_tensor of the E4M3 rows and of
    their scales, then _blockwise_scaled_mm."""
    rows, scales = _gathered_fp8(x, x_scale, w_scale, group)
    return _blockwise_scaled_mm(rows, w, scales, w_scale)


def all_gather_reference(x: torch.Tensor, w: torch.Tensor, weight_layout: str,
                         group: dist.ProcessGroup) -> torch.Tensor:
    """The FP32 product of the gathered BF16 rows and this rank's BF16 w (the all-gather's Y)."""
    return gathered_rows(x, group).float() @ weight_as_k_by_n(w, weight_layout).float()


def all_gather_unfused(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group: dist.ProcessGroup) -> torch.Tensor:
    """The all-gather's unfused path: all_gather_into_tensor, then torch.mm (BF16 out)."""
    return torch.mm(gathered_rows(x, group), weight_as_k_by_n(w, weight_layout))


def assert_bit_for_bit(out: torch.Tensor, reference: torch.Tensor, rank: int) -> None:
    """The exact mode: every reference value is exact in BF16 (the test's premise), and out is it, bit for bit."""
    expected = reference.to(torch.bfloat16)
    assert torch.equal(expected.double(), reference), "the test's premise: every output exact in BF16"
    mismatches = (out != expected).nonzero()
    assert mismatches.numel() == 0, f"rank {rank}: first wrong (row, column) {mismatches[0].tolist()}"


@dataclass(frozen=True)
class Errors:
    max_rel: float     # max |out - ref| / max |ref|, over every rank's rows
    norm_rel: float    # ||out - ref|| / ||ref||
    nonfinite: int     # NaN or infinite entries of out, every rank's

    def within(self, baseline: "Errors", factor: float = ERROR_FACTOR) -> bool:
        return self.nonfinite == 0 and self.max_rel <= factor * baseline.max_rel and \
            self.norm_rel <= factor * baseline.norm_rel


def errors(out: torch.Tensor, reference: torch.Tensor, group: dist.ProcessGroup) -> Errors:
    """The error measures of every rank's `out` against its `reference` rows (collective)."""
    difference = out.float() - reference
    maxima = torch.stack([difference.abs().max(), reference.abs().max()]).double()
    sums = torch.stack([difference.square().sum().double(), reference.square().sum().double(),
                        (~torch.isfinite(out)).sum().double()])
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(sums, group=group)
    max_diff, max_ref = maxima.tolist()
    sq_diff, sq_ref, nonfinite = sums.tolist()
    return Errors(max_diff / max_ref, (sq_diff / sq_ref) ** 0.5, int(nonfinite))
