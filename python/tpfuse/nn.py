"""Megatron-style tensor-parallel linear layers with sequence parallelism, on tpfuse's fused ops.

Between a ColumnParallelLinear and the RowParallelLinear after it, activations are sharded on the
sequence: each rank holds S/P tokens of the full width outside the pair, and all S tokens of its N/P
features inside it.

    column = ColumnParallelLinear.from_linear(fc1, group)   # x (S/P, ..., K) -> (S, ..., N/P)
    row = RowParallelLinear.from_linear(fc2, group)         # (S, ..., N/P) -> (S/P, ..., K)

The options of both layers, as Megatron's:
- sequence_dim: the sequence's dimension, 0 for [s, b, h] (Megatron's), 1 for [b, s, h] (TorchTitan's);
  the dimensions before it are the ops' batch (tpfuse.autograd.column_parallel_linear).
- init_method(weight): fills this rank's weight shard (default: nn.Linear's, with the whole fan-in), inside
  rng_tracker.fork() where an rng_tracker is given (Megatron's get_cuda_rng_tracker()), so that shards
  differ. Biases start at zero: the same on every rank.
- skip_bias_add: return (output, bias) without adding the bias.
- gradient_accumulation_fusion: add the weight's gradient into weight.main_grad in FP32
  (tpfuse.autograd.main_grad_mode).
- fp8: None (BF16, the default), or tpfuse.float8.BlockwiseRecipe(wgrad="bf16" or "fp8"): DeepSeek-V3's
  blockwise FP8 for the forward and the input's gradient, the weight's gradient in BF16 or FP8 (the recipe's
  docstring); the weight shard's dimensions must be multiples of 128 (InvalidArgumentError at construction).

forward(x, is_first_microbatch=None), as TransformerEngine's layers take it: with the FP8 recipe, None
quantizes the weight at each call; True quantizes it and keeps it, and False uses the kept one for the
micro-batches after the first of a step, where the weight does not change. Eager, a weight changed in place
since (an optimizer's step, load_state_dict) or moved is quantized again; a write through `weight.data` is
not seen (it bypasses the version counter), nor is any change in a compiled graph, which cannot read the
version counter: pass True on the first micro-batch of each step. BF16 layers accept it and keep nothing.

The sharded parameters carry Megatron's tensor_model_parallel, partition_dim and partition_stride.

The row layer's bias, like every parameter used on the sequence shard (LayerNorm's), gets this rank's
tokens' gradient only: its full gradient is the sum over the group. It is marked `sequence_parallel = True`
(Megatron's attribute, whose finalize_model_grads all-reduces such gradients);
`allreduce_sequence_parallel_grads(module, group)` does the same.
"""

import contextlib
import math
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .autograd import check_fp8_recipe, column_parallel_linear, quantize_weight, row_parallel_linear
from .errors import InvalidArgumentError
from .float8 import BlockwiseRecipe


def _group(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise InvalidArgumentError("no process group: call torch.distributed.init_process_group first, or pass "
                                   "the group")
    return group


def _shard_extent(extent: int, name: str, world_size: int, stride: int = 1) -> int:
    if extent % (world_size * stride) != 0:
        blocks = f" in each of its stride = {stride} blocks" if stride > 1 else ""
        raise InvalidArgumentError(f"{name} = {extent} does not divide over the group's {world_size} ranks{blocks}")
    return extent // world_size


def _rank(group: dist.ProcessGroup, rank: Optional[int]) -> int:
    rank = group.rank() if rank is None else rank
    if not 0 <= rank < group.size():
        raise InvalidArgumentError(f"rank = {rank} is not a rank of the group of {group.size()}")
    return rank


def _shard(full: torch.Tensor, dim: int, rank: int, world_size: int, stride: int) -> torch.Tensor:
    """This rank's part of `full` split on `dim` as Megatron's partition_stride says: `full` is `stride`
    equal blocks (a [gate; up] weight: 2), and the rank holds its 1/P of each, in block order."""
    pieces = full.split(full.shape[dim] // (stride * world_size), dim)
    return torch.cat(pieces[rank::world_size], dim)


def _set_tensor_parallel(parameter: torch.nn.Parameter, partition_dim: int, partition_stride: int) -> None:
    """Megatron's attributes of a sharded parameter (set_tensor_model_parallel_attributes), which its
    gradient clipping, checkpointing and optimizers read."""
    parameter.tensor_model_parallel = True
    parameter.partition_dim, parameter.partition_stride = partition_dim, partition_stride


def linear_init_method(in_features: int) -> Callable[[torch.Tensor], None]:
    """nn.Linear's initialization of a weight shard, with the whole layer's fan-in (a row layer's shard has
    1/P of it): uniform in +-1/sqrt(in_features)."""
    bound = 1 / math.sqrt(in_features)
    return lambda weight: torch.nn.init.uniform_(weight, -bound, bound)


class _ParallelLinear(torch.nn.Module):
    _shard_dim: int  # the weight's dimension split over the group: 0, its output rows; 1, its input columns

    def __init__(self, in_features: int, out_features: int, weight_shape, bias_features: int, bias: bool,
                 group: Optional[dist.ProcessGroup], *, sequence_dim: int, stride: int, init_method, rng_tracker,
                 skip_bias_add: bool, gradient_accumulation_fusion: bool, fp8: Optional[BlockwiseRecipe], device,
                 dtype):
        super().__init__()
        self.group = _group(group)
        check_fp8_recipe(fp8, weight_shape, f"{type(self).__name__}(in_features={in_features}, "
                                            f"out_features={out_features}) on {self.group.size()} ranks")
        self.in_features, self.out_features, self.stride = in_features, out_features, stride
        self.sequence_dim, self.skip_bias_add = sequence_dim, skip_bias_add
        self.gradient_accumulation_fusion, self.fp8 = gradient_accumulation_fusion, fp8
        self.weight = torch.nn.Parameter(torch.empty(weight_shape, device=device, dtype=dtype))
        _set_tensor_parallel(self.weight, self._shard_dim, stride)
        # The shard from the tracker's fork, so that shards differ where each rank's fork is seeded apart.
        init_method = init_method or linear_init_method(in_features)
        with torch.no_grad(), rng_tracker.fork() if rng_tracker is not None else contextlib.nullcontext():
            init_method(self.weight)
        # Zero, as Megatron's: the same on every rank whatever each one's generators.
        self.bias = torch.nn.Parameter(torch.zeros(bias_features, device=device, dtype=dtype)) if bias else None
        # The FP8 weight kept for a step's micro-batches, and what it was made from (not state: never saved).
        self._fp8_weight, self._fp8_weight_source = None, None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: Optional[dist.ProcessGroup] = None, *,
                    rank: Optional[int] = None, **options) -> "_ParallelLinear":
        """This rank's shard of a full nn.Linear, copied: its output rows and bias entries (column, of each
        of `stride` blocks), or its input columns and the whole bias (row); `rank` picks another rank's
        shard (default: this process's rank in the group)."""
        group = _group(group)
        layer = cls(linear.in_features, linear.out_features, group, linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype, **options)
        rank, world_size = _rank(group, rank), group.size()
        with torch.no_grad():
            layer.weight.copy_(_shard(linear.weight, cls._shard_dim, rank, world_size, layer.stride))
            if layer.bias is not None:
                layer.bias.copy_(_shard(linear.bias, 0, rank, world_size, layer.stride) if cls._shard_dim == 0
                                 else linear.bias)
        return layer

    @property
    def group_name(self) -> str:
        return self.group.group_name

    def _kept_fp8_weight(self, is_first_microbatch: Optional[bool]):
        """The FP8 weight for this forward (see the module's doc): None to quantize it in the call, or the kept one,
        made again where is_first_microbatch is True or the weight is not what it was made from."""
        if is_first_microbatch is not None and not isinstance(is_first_microbatch, bool):
            raise InvalidArgumentError(f"is_first_microbatch = {is_first_microbatch!r} must be None, True or False")
        if self.fp8 is None or is_first_microbatch is None:
            return None
        weight = self.weight
        # Eager only: a compiled graph cannot read a tensor's storage or version counter.
        source = None if torch.compiler.is_compiling() else (weight.data_ptr(), weight._version, weight.device,
                                                             tuple(weight.shape), self.fp8)
        if (is_first_microbatch or self._fp8_weight is None or
                (source is not None and source != self._fp8_weight_source)):
            self._fp8_weight, self._fp8_weight_source = quantize_weight(weight, self.fp8), source
        return self._fp8_weight

    def _output(self, parallel_linear, x: torch.Tensor, is_first_microbatch: Optional[bool], **options):
        """The layer's output, or (output, bias) without the bias added where skip_bias_add is set."""
        bias = None if self.skip_bias_add else self.bias
        out = parallel_linear(x, self.weight, bias, self.group, sequence_dim=self.sequence_dim,
                              gradient_accumulation_fusion=self.gradient_accumulation_fusion, fp8=self.fp8,
                              fp8_weight=self._kept_fp8_weight(is_first_microbatch), **options)
        return (out, self.bias) if self.skip_bias_add else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"world_size={self.group.size()}, sequence_dim={self.sequence_dim}" +
                ("" if self.fp8 is None else f", fp8={self.fp8}"))


class ColumnParallelLinear(_ParallelLinear):
    """y = AG(x) @ W^T + b with W's N/P output rows (and b's N/P entries) on this rank.

    forward: x (S/P, ..., in_features), this rank's tokens, BF16 -> (S, ..., out_features/P) (the sequence on
    dim sequence_dim; (output, bias) with skip_bias_add).
    stride: Megatron's partition_stride: W is `stride` blocks of rows sharded alike (a SwiGLU's [gate; up],
    2: this rank holds [gate's rows; up's rows], and y.chunk(2, -1) gives its gate and up).
    save_gathered_input: keep the gathered x (S x in_features) for the weight's gradient (the default;
    memory), else gather x again in backward (time). The other options: see tpfuse.nn."""

    _shard_dim = 0

    def __init__(self, in_features: int, out_features: int, group: Optional[dist.ProcessGroup] = None,
                 bias: bool = True, *, sequence_dim: int = 0, stride: int = 1,
                 init_method: Optional[Callable[[torch.Tensor], None]] = None, rng_tracker=None,
                 skip_bias_add: bool = False, save_gathered_input: bool = True,
                 gradient_accumulation_fusion: bool = False, fp8: Optional[BlockwiseRecipe] = None, device=None,
                 dtype=torch.bfloat16):
        if stride < 1:
            raise InvalidArgumentError(f"stride = {stride} must be 1 or more")
        shard = _shard_extent(out_features, "out_features", _group(group).size(), stride)
        super().__init__(in_features, out_features, (shard, in_features), shard, bias, group,
                         sequence_dim=sequence_dim, stride=stride,
                         init_method=init_method, rng_tracker=rng_tracker, skip_bias_add=skip_bias_add,
                         gradient_accumulation_fusion=gradient_accumulation_fusion, fp8=fp8, device=device,
                         dtype=dtype)
        if self.bias is not None:
            _set_tensor_parallel(self.bias, 0, stride)
        self.save_gathered_input = save_gathered_input

    def forward(self, x: torch.Tensor, is_first_microbatch: Optional[bool] = None):
        return self._output(column_parallel_linear, x, is_first_microbatch,
                            save_gathered_input=self.save_gathered_input)


class RowParallelLinear(_ParallelLinear):
    """out = RS(x @ W^T) + b with W's in_features/P input columns on this rank; b whole on every rank,
    added once, by the kernel, to the reduced rows.

    forward: x (S, ..., in_features/P), BF16 -> this rank's tokens (S/P, ..., out_features) (the sequence on
    dim sequence_dim; (output, bias) with skip_bias_add).
    The bias's gradient is this rank's tokens' part (bias.sequence_parallel is True: see the module's doc).
    The options: see tpfuse.nn."""

    _shard_dim = 1

    def __init__(self, in_features: int, out_features: int, group: Optional[dist.ProcessGroup] = None,
                 bias: bool = True, *, sequence_dim: int = 0,
                 init_method: Optional[Callable[[torch.Tensor], None]] = None, rng_tracker=None,
                 skip_bias_add: bool = False, gradient_accumulation_fusion: bool = False,
                 fp8: Optional[BlockwiseRecipe] = None, device=None, dtype=torch.bfloat16):
        shard = _shard_extent(in_features, "in_features", _group(group).size())
        super().__init__(in_features, out_features, (out_features, shard), out_features, bias, group,
                         sequence_dim=sequence_dim, stride=1,
                         init_method=init_method, rng_tracker=rng_tracker, skip_bias_add=skip_bias_add,
                         gradient_accumulation_fusion=gradient_accumulation_fusion, fp8=fp8, device=device,
                         dtype=dtype)
        if self.bias is not None:
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor, is_first_microbatch: Optional[bool] = None):
        return self._output(row_parallel_linear, x, is_first_microbatch)


def allreduce_sequence_parallel_grads(module: torch.nn.Module, group: Optional[dist.ProcessGroup] = None) -> None:
    """Sums over the group the gradients of `module`'s parameters marked `sequence_parallel` (each rank holds
    its rows' part), as Megatron's finalize_model_grads does; call it after backward, before the step."""
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    for grad in grads:
        dist.all_reduce(grad, group=_group(group))
