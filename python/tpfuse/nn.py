"""Megatron-style tensor-parallel linear layers with sequence parallelism, on tpfuse's fused ops.

Between a ColumnParallelLinear and the RowParallelLinear after it, activations are sharded on dim 0
(sequence, or tokens): each rank holds S/P rows of the full width outside the pair, and all S rows of
its N/P features inside it.

    column = ColumnParallelLinear.from_linear(fc1, group)   # x (S/P, ..., K) -> (S, ..., N/P)
    row = RowParallelLinear.from_linear(fc2, group)         # (S, ..., N/P) -> (S/P, ..., K)

The row layer's bias, like every parameter used on the sequence shard (LayerNorm's), gets this rank's
rows' gradient only: its full gradient is the sum over the group. It is marked `sequence_parallel = True`
(Megatron's attribute, whose finalize_model_grads all-reduces such gradients);
`allreduce_sequence_parallel_grads(module, group)` does the same.
"""

import math
from typing import Optional

import torch
import torch.distributed as dist

from .autograd import column_parallel_linear, row_parallel_linear
from .errors import InvalidArgumentError


def _group(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise InvalidArgumentError("no process group: call torch.distributed.init_process_group first, or pass "
                                   "the group")
    return group


def _shard_extent(extent: int, name: str, world_size: int) -> int:
    if extent % world_size != 0:
        raise InvalidArgumentError(f"{name} = {extent} does not divide over the group's {world_size} ranks")
    return extent // world_size


def _rank(group: dist.ProcessGroup, rank: Optional[int]) -> int:
    rank = group.rank() if rank is None else rank
    if not 0 <= rank < group.size():
        raise InvalidArgumentError(f"rank = {rank} is not a rank of the group of {group.size()}")
    return rank


class _ParallelLinear(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, weight_shape, bias_features: int, bias: bool,
                 group: Optional[dist.ProcessGroup], gradient_accumulation_fusion: bool, device, dtype):
        super().__init__()
        self.group = _group(group)
        self.in_features, self.out_features = in_features, out_features
        self.gradient_accumulation_fusion = gradient_accumulation_fusion
        self.weight = torch.nn.Parameter(torch.empty(weight_shape, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(bias_features, device=device, dtype=dtype)) if bias else None
        # nn.Linear's initialization with the full layer's fan-in (the shard's would be P times too wide).
        bound = 1 / math.sqrt(in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    _shard_dim: int  # the weight's dimension split over the group: 0, its output rows; 1, its input columns

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: Optional[dist.ProcessGroup] = None, *,
                    rank: Optional[int] = None, **options) -> "_ParallelLinear":
        """This rank's shard of a full nn.Linear, copied: its output rows and bias entries (column), or its
        input columns and the whole bias (row); `rank` picks another rank's shard (default: this process's
        rank in the group)."""
        group = _group(group)
        layer = cls(linear.in_features, linear.out_features, group, linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype, **options)
        extent = layer.weight.shape[cls._shard_dim]
        start = _rank(group, rank) * extent
        with torch.no_grad():
            layer.weight.copy_(linear.weight.narrow(cls._shard_dim, start, extent))
            if layer.bias is not None:
                layer.bias.copy_(linear.bias.narrow(0, start, extent) if cls._shard_dim == 0 else linear.bias)
        return layer

    @property
    def group_name(self) -> str:
        return self.group.group_name

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"world_size={self.group.size()}")


class ColumnParallelLinear(_ParallelLinear):
    """y = AG(x) @ W^T + b with W's N/P output rows (and b's N/P entries) on this rank.

    forward: x (S/P, ..., in_features), this rank's rows, contiguous BF16 -> (S, ..., out_features/P).
    save_gathered_input: keep the gathered x (S x in_features) for the weight's gradient (the default;
    memory), else gather x again in backward (time). gradient_accumulation_fusion: add the weight's
    gradient into weight.main_grad in FP32, as Megatron does (tpfuse.autograd.main_grad_mode)."""

    _shard_dim = 0

    def __init__(self, in_features: int, out_features: int, group: Optional[dist.ProcessGroup] = None,
                 bias: bool = True, *, save_gathered_input: bool = True, gradient_accumulation_fusion: bool = False,
                 device=None, dtype=torch.bfloat16):
        shard = _shard_extent(out_features, "out_features", _group(group).size())
        super().__init__(in_features, out_features, (shard, in_features), shard, bias, group,
                         gradient_accumulation_fusion, device, dtype)
        self.save_gathered_input = save_gathered_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel_linear(x, self.weight, self.bias, self.group,
                                      save_gathered_input=self.save_gathered_input,
                                      gradient_accumulation_fusion=self.gradient_accumulation_fusion)


class RowParallelLinear(_ParallelLinear):
    """out = RS(x @ W^T) + b with W's in_features/P input columns on this rank; b whole on every rank,
    added once after the reduce-scatter.

    forward: x (S, ..., in_features/P), contiguous BF16 -> this rank's rows (S/P, ..., out_features).
    The bias's gradient is this rank's rows' part (bias.sequence_parallel is True: see the module's doc)."""

    _shard_dim = 1

    def __init__(self, in_features: int, out_features: int, group: Optional[dist.ProcessGroup] = None,
                 bias: bool = True, *, gradient_accumulation_fusion: bool = False, device=None,
                 dtype=torch.bfloat16):
        shard = _shard_extent(in_features, "in_features", _group(group).size())
        super().__init__(in_features, out_features, (out_features, shard), out_features, bias, group,
                         gradient_accumulation_fusion, device, dtype)
        if self.bias is not None:
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_parallel_linear(x, self.weight, self.bias, self.group,
                                   gradient_accumulation_fusion=self.gradient_accumulation_fusion)


def allreduce_sequence_parallel_grads(module: torch.nn.Module, group: Optional[dist.ProcessGroup] = None) -> None:
    """Sums over the group the gradients of `module`'s parameters marked `sequence_parallel` (each rank holds
    its rows' part), as Megatron's finalize_model_grads does; call it after backward, before the step."""
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    for grad in grads:
        dist.all_reduce(grad, group=_group(group))
