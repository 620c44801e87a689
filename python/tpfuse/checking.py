"""One reference, one unfused path and one set of error measures, shared by the GPU tests and the
benchmark (docs/SPEC.md's rule: each of the fused op's errors at most 1.1x the unfused path's)."""

from dataclasses import dataclass

import torch
import torch.distributed as dist

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


def gathered_rows(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's rows of x, in rank order (all_gather_into_tensor)."""
    gathered = x.new_empty(x.shape[0] * group.size(), x.shape[1])
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
    return gathered


def all_gather_reference(x: torch.Tensor, w: torch.Tensor, weight_layout: str,
                         group: dist.ProcessGroup) -> torch.Tensor:
    """The FP32 product of the gathered BF16 rows and this rank's BF16 w (the all-gather's Y)."""
    return gathered_rows(x, group).float() @ weight_as_k_by_n(w, weight_layout).float()


def all_gather_unfused(x: torch.Tensor, w: torch.Tensor, weight_layout: str, group: dist.ProcessGroup) -> torch.Tensor:
    """The all-gather's unfused path: all_gather_into_tensor, then torch.mm (BF16 out)."""
    return torch.mm(gathered_rows(x, group), weight_as_k_by_n(w, weight_layout))


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
