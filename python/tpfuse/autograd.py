"""Backward passes for tpfuse's ops, and the autograd functions of the parallel linear layers.

Each fused op's backward is the other fused op (the kernels take an nn.Linear weight in place):

  row parallel, out = RS(a @ W) (gemm_reduce_scatter):   grad_a, G = all_gather_gemm(g, w, swapped layout,
                                                          gathered);  grad_W = a^T @ G
  column parallel, y = AG(x) @ W (all_gather_gemm):       grad_x = gemm_reduce_scatter(g, w, swapped layout);
                                                          grad_W = X^T @ g, X the gathered x (saved or gathered again)

Swapping the layout name is what transposes W: a row op's "nk" w (N x K/P) is, read as the all-gather's
"kn" (K' x N'/P with K' = N, N'/P = K/P), exactly W^T; the same holds for the other three cases.

The backward of an op with batch b (a scatter_dim / gather_dim past 0 for the drop-ins) is the other op with
the same batch. A bias's gradient is grad summed over the rows it was added to: this rank's rows for the
reduce-scatter (its part of the whole, as for the layers' bias), every row of y for the all-gather.

register_autograd gives every functional op (gemm_reduce_scatter, fused_matmul_reduce_scatter,
all_gather_gemm, all_gather_gemm_gathered, fused_all_gather_matmul) its backward, so that torch.compile
traces forward and backward without a graph break. `gemm_reduce_scatter_out` writes into `out` and has
no backward; neither have the ops on FP8 inputs (their backward raises UnsupportedError: the forward keeps
nothing for it). The layers' functions below give the ops their bias and their
sequences (a sequence dimension past 0 is the ops' batch) and add Megatron's FP32 `main_grad` accumulation;
with the blockwise FP8 recipe (tpfuse.float8.BlockwiseRecipe) they quantize the ops' inputs themselves, forward
and backward, and keep what their backward needs.
"""

import logging
import math
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import E4M3, SCALE_BLOCK, SLAB_ROWS, blockwise_scale_shapes, weight_of
from .errors import InvalidArgumentError, UnsupportedError
from .float8 import WEIGHT_BLOCK, BlockwiseRecipe, blockwise_weight_grad, dequantize_blockwise, quantize_blockwise

# The layout name under which the paired op reads the same w as W^T.
SWAPPED_LAYOUT = {"nk": "kn", "kn": "nk"}


def _group_size(group_name: str) -> int:
    return _resolve_process_group(group_name).size()


def gather_rows(x: torch.Tensor, group_name: str, world_size: int) -> torch.Tensor:
    """Every rank's rows of the matrix x, in rank order (a traceable, capturable all-gather)."""
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), world_size, group_name)
    return torch.ops._c10d_functional.wait_tensor(gathered)


def reduce_scatter_rows(x: torch.Tensor, group_name: str, world_size: int) -> torch.Tensor:
    """This rank's rows of the sum over the group of the matrix x (the all-gather's transpose)."""
    rows = torch.ops._c10d_functional.reduce_scatter_tensor(x.contiguous(), "sum", world_size, group_name)
    return torch.ops._c10d_functional.wait_tensor(rows)


def gather_sequences(x: torch.Tensor, group_name: str, world_size: int, batch: int) -> torch.Tensor:
    """all_gather_gemm's gathered X: x holds this rank's rows of each of `batch` sequences; the result has each
    sequence's rows in rank order, sequence after sequence (batch 1: gather_rows)."""
    gathered = gather_rows(x, group_name, world_size)
    if batch == 1:
        return gathered
    return gathered.view(world_size, batch, -1, x.shape[-1]).transpose(0, 1).reshape(-1, x.shape[-1])


def reduce_scatter_sequences(x: torch.Tensor, group_name: str, world_size: int, batch: int) -> torch.Tensor:
    """gemm_reduce_scatter's rows: this rank's rows of each of the `batch` sequences of x, summed over the group
    (batch 1: reduce_scatter_rows)."""
    if batch > 1:
        x = x.view(batch, world_size, -1, x.shape[-1]).transpose(0, 1).reshape(-1, x.shape[-1])
    return reduce_scatter_rows(x, group_name, world_size)


def _weight_grad(operand: torch.Tensor, grad: torch.Tensor, weight_layout: str) -> torch.Tensor:
    """dL/dw for y = operand @ W (both M-row matrices, M summed over): W^T-shaped for 'nk'."""
    return grad.t() @ operand if weight_layout == "nk" else operand.t() @ grad


def _needs_grad(ctx, index: int) -> bool:
    """Whether the op's input `index` needs a gradient (an argument left at its default was not passed)."""
    return index < len(ctx.needs_input_grad) and ctx.needs_input_grad[index]


# --- the row-parallel op: the backward of out = RS(a @ W) ---

def row_parallel_backward(grad: torch.Tensor, a: torch.Tensor, w: torch.Tensor, weight_layout: str,
                          group_name: str, world_size: int, need_input_grad: bool, batch: int = 1):
    """(grad_a or None, G): grad (M/P x N) gathered to G (M x N, every sequence's rows in rank order);
    grad_a = G @ W^T (M x K/P), computed by the fused all-gather + GEMM, which also gives G."""
    grad = grad.contiguous()
    if need_input_grad:
        return torch.ops.tpfuse.all_gather_gemm_gathered(grad, w, SWAPPED_LAYOUT[weight_layout], group_name, None,
                                                         batch)
    return None, gather_sequences(grad, group_name, world_size, batch)


def _setup_gemm_reduce_scatter(ctx, inputs, output):
    a, w, weight_layout, group_name, _, batch, _, _, _ = inputs
    ctx.fp8 = a.dtype != torch.bfloat16
    if not ctx.fp8:  # an FP8 call has no backward: nothing to keep for it
        ctx.save_for_backward(a, w)
    ctx.weight_layout, ctx.group_name, ctx.world_size = weight_layout, group_name, _group_size(group_name)
    ctx.batch = batch


def _refuse_fp8_backward(op: str, inputs: str = "FP8 inputs (torch.float8_e4m3fn)") -> None:
    raise UnsupportedError(f"tpfuse.{op} on {inputs} has no backward pass; call it on tensors that need no gradient "
                           "(or under torch.no_grad())")


def _backward_gemm_reduce_scatter(ctx, grad):
    if ctx.fp8:
        _refuse_fp8_backward("gemm_reduce_scatter")
    a, w = ctx.saved_tensors
    grad_a, gathered = row_parallel_backward(grad, a, w, ctx.weight_layout, ctx.group_name, ctx.world_size,
                                             ctx.needs_input_grad[0], ctx.batch)
    grad_w = _weight_grad(a, gathered, ctx.weight_layout) if ctx.needs_input_grad[1] else None
    # The bias was added to this rank's rows only: its gradient here is their part (see tpfuse.nn).
    grad_bias = grad.sum(0) if _needs_grad(ctx, 4) else None
    return grad_a, grad_w, None, None, grad_bias, None, None, None, None


def _setup_fused_matmul_reduce_scatter(ctx, inputs, output):
    A, B, _, scatter_dim, group_name = inputs
    ctx.save_for_backward(A, B)
    ctx.group_name, ctx.world_size = group_name, _group_size(group_name)
    ctx.batch = math.prod(A.shape[:scatter_dim])


def _backward_fused_matmul_reduce_scatter(ctx, grad):
    A, B = ctx.saved_tensors
    w, weight_layout = weight_of(B, "B")  # the tensor the forward multiplied by, in place
    a = A.reshape(-1, A.shape[-1])
    grad_a, gathered = row_parallel_backward(grad.reshape(-1, grad.shape[-1]), a, w, weight_layout, ctx.group_name,
                                             ctx.world_size, ctx.needs_input_grad[0], ctx.batch)
    grad_A = None if grad_a is None else grad_a.view(A.shape)
    grad_B = a.t() @ gathered if ctx.needs_input_grad[1] else None  # B is K/P x N whichever the layout
    return grad_A, grad_B, None, None, None


# --- the column-parallel op: the backward of y = AG(x) @ W ---

def column_parallel_input_grad(grad: torch.Tensor, w: torch.Tensor, weight_layout: str, group_name: str,
                               batch: int = 1) -> torch.Tensor:
    """grad_x (M/P x K): this rank's rows of sum_r grad_r @ W_r^T, by the fused GEMM + reduce-scatter."""
    return torch.ops.tpfuse.gemm_reduce_scatter(grad.contiguous(), w, SWAPPED_LAYOUT[weight_layout], group_name,
                                                None, batch)


def several_weights_input_grad(grads: List[torch.Tensor], Bs: List[torch.Tensor], group_name: str,
                               batch: int = 1) -> torch.Tensor:
    """grad_x (M/P x K) of y_i = AG(x) @ B_i, every B_i K x N_i: RS(sum_i g_i @ B_i^T) as ONE fused GEMM +
    reduce-scatter (SwiGLU's gate and up: one reduce-scatter, not one per weight): the g_i side by side
    (M x sum N_i) times the B_i^T stacked ((sum N_i) x K), both copied to do so."""
    if len(Bs) == 1:
        w, weight_layout = weight_of(Bs[0], "B")
        return column_parallel_input_grad(grads[0], w, weight_layout, group_name, batch)
    stacked_weights = torch.cat([B.t() for B in Bs])  # each B^T is N_i x K, read by the op as K'/P x N ("kn")
    return torch.ops.tpfuse.gemm_reduce_scatter(torch.cat(grads, dim=1), stacked_weights, "kn", group_name, None,
                                                batch)


def _setup_all_gather_gemm(ctx, inputs, output):
    x, w, weight_layout, group_name, _, batch, _, _, _ = inputs
    gathered = output[1] if isinstance(output, (tuple, list)) else None
    ctx.fp8 = x.dtype != torch.bfloat16
    # all_gather_gemm saves x and gathers it again in backward; all_gather_gemm_gathered saves the gathered X.
    # An FP8 call has no backward: nothing to keep for it.
    if not ctx.fp8:
        ctx.save_for_backward(x if gathered is None else gathered, w)
    ctx.regather = gathered is None
    ctx.weight_layout, ctx.group_name, ctx.world_size = weight_layout, group_name, _group_size(group_name)
    ctx.batch = batch
    # The gathered X's grad is None where unused (no reduce-scatter of zeros).
    ctx.set_materialize_grads(False)


def _backward_all_gather_gemm(ctx, grad, grad_gathered=None):
    if ctx.fp8:
        _refuse_fp8_backward("all_gather_gemm")
    saved, w = ctx.saved_tensors
    grad_x = grad_w = grad_bias = None
    if ctx.needs_input_grad[0]:
        if grad is not None:
            grad_x = column_parallel_input_grad(grad, w, ctx.weight_layout, ctx.group_name, ctx.batch)
        if grad_gathered is not None:
            rows = reduce_scatter_sequences(grad_gathered, ctx.group_name, ctx.world_size, ctx.batch)
            grad_x = rows if grad_x is None else grad_x + rows
    if ctx.needs_input_grad[1] and grad is not None:
        gathered = gather_sequences(saved, ctx.group_name, ctx.world_size, ctx.batch) if ctx.regather else saved
        grad_w = _weight_grad(gathered, grad.contiguous(), ctx.weight_layout)
    if _needs_grad(ctx, 4) and grad is not None:
        grad_bias = grad.sum(0)  # added to every row of y
    return grad_x, grad_w, None, None, grad_bias, None, None, None, None


def _no_context(ctx, inputs, output):
    pass


def _backward_quantize_all_gather_gemm(ctx, grad):
    _refuse_fp8_backward("quantize_all_gather_gemm", "rows it quantizes to torch.float8_e4m3fn")


def _setup_fused_all_gather_matmul(ctx, inputs, keyword_only_inputs, output):
    A, Bs, gather_dim, group_name = inputs
    gathered = output[0]
    ctx.regather = gathered is None
    ctx.save_for_backward(A if gathered is None else gathered, *Bs)
    ctx.group_name, ctx.world_size = group_name, _group_size(group_name)
    ctx.gather_dim, ctx.batch = gather_dim, math.prod(A.shape[:gather_dim])
    ctx.set_materialize_grads(False)


def _backward_fused_all_gather_matmul(ctx, grad_gathered, grad_outs):
    saved, *Bs = ctx.saved_tensors
    k = saved.shape[-1]
    grad_rows = grad_Bs = None
    if ctx.needs_input_grad[0]:
        used = [(B, grad.reshape(-1, grad.shape[-1])) for B, grad in zip(Bs, grad_outs) if grad is not None]
        if used:
            grad_rows = several_weights_input_grad([grad for _, grad in used], [B for B, _ in used], ctx.group_name,
                                                   ctx.batch)
        if grad_gathered is not None:
            part = reduce_scatter_sequences(grad_gathered.reshape(-1, k), ctx.group_name, ctx.world_size, ctx.batch)
            grad_rows = part if grad_rows is None else grad_rows + part
    if ctx.needs_input_grad[1]:
        gathered = gather_sequences(saved.reshape(-1, k), ctx.group_name, ctx.world_size, ctx.batch) \
            if ctx.regather else saved.reshape(-1, k)
        # Each B is K x N_i as a tensor, whether stored so or a weight's transpose view.
        grad_Bs = [None if grad is None else gathered.t() @ grad.reshape(-1, grad.shape[-1]).contiguous()
                   for grad in grad_outs]
    shard_shape = list(saved.shape)
    if not ctx.regather:
        shard_shape[ctx.gather_dim] //= ctx.world_size
    grad_A = None if grad_rows is None else grad_rows.view(shard_shape)
    return grad_A, grad_Bs, None, None


torch.library.register_autograd("tpfuse::gemm_reduce_scatter", _backward_gemm_reduce_scatter,
                                setup_context=_setup_gemm_reduce_scatter)
torch.library.register_autograd("tpfuse::fused_matmul_reduce_scatter", _backward_fused_matmul_reduce_scatter,
                                setup_context=_setup_fused_matmul_reduce_scatter)
torch.library.register_autograd("tpfuse::all_gather_gemm", _backward_all_gather_gemm,
                                setup_context=_setup_all_gather_gemm)
torch.library.register_autograd("tpfuse::all_gather_gemm_gathered", _backward_all_gather_gemm,
                                setup_context=_setup_all_gather_gemm)
torch.library.register_autograd("tpfuse::quantize_all_gather_gemm", _backward_quantize_all_gather_gemm,
                                setup_context=_no_context)
torch.library.register_autograd("tpfuse::fused_all_gather_matmul", _backward_fused_all_gather_matmul,
                                setup_context=_setup_fused_all_gather_matmul)


# --- the layers: sequence order, the bias, and Megatron's main_grad accumulation ---

# torch.mm(..., out_dtype=) (aten::mm.dtype) came with torch 2.8; the floor, torch 2.7, lacks it.
MM_HAS_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()


def fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b summed and returned in FP32."""
    if MM_HAS_OUT_DTYPE and a.is_cuda and a.dtype == torch.bfloat16:
        return torch.mm(a, b, out_dtype=torch.float32)
    # FP32 copies of the operands give the same products (a BF16 value is exact in FP32, and in TF32 where
    # matmuls use it), at the cost of the copies and an FP32 GEMM: torch before 2.8, and the CPU.
    return torch.mm(a.float(), b.float())


def main_grad_mode(weight: torch.Tensor) -> str:
    """How the backward treats a weight whose gradient it adds into `weight.main_grad` (Megatron's
    gradient_accumulation_fusion), decided in forward from the weight's attributes: the FP32 product is added
    into main_grad, and the weight's own gradient is None ("none"), or, where the weight has the attribute
    `grad_added_to_main_grad` (Megatron's DDP, whose hooks need a gradient to run), a dummy of the weight's
    shape: zeros if `weight.zero_out_wgrad` ("zeros"), else uninitialized ("empty"); the attribute is then set
    to True (here, in forward: its readers run after the backward)."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise InvalidArgumentError("gradient_accumulation_fusion is on but the weight has no main_grad attribute "
                                   "(an FP32 tensor of the weight's shape to accumulate into)")
    if main_grad.shape != weight.shape or main_grad.dtype != torch.float32:
        raise InvalidArgumentError(f"weight.main_grad is {main_grad.dtype} {tuple(main_grad.shape)}; it must be "
                                   f"torch.float32 of the weight's shape {tuple(weight.shape)}")
    if not hasattr(weight, "grad_added_to_main_grad"):
        return "none"
    weight.grad_added_to_main_grad = True
    return "zeros" if getattr(weight, "zero_out_wgrad", False) else "empty"


def _keep_main_grad(ctx, main_grad: Optional[torch.Tensor], mode: Optional[str]) -> None:
    # NOTE: on the context, not through save_for_backward: the backward adds into main_grad in place, so a
    # second forward before this backward (a pipeline's warm-up, a weight used twice) would fail
    # save_for_backward's version check. Megatron's layers keep it so too.
    ctx.main_grad, ctx.mode = main_grad, mode


def _accumulate_or_return(ctx, weight: torch.Tensor, operand: torch.Tensor, grad: torch.Tensor,
                          fp8_wgrad: bool = False, power_of_2: bool = False) -> Optional[torch.Tensor]:
    """The weight (N x K, nn.Linear's layout) gradient grad^T @ operand: returned (no main_grad), or added
    into main_grad in FP32, returning what main_grad_mode says. fp8_wgrad: the FP8 product of the blockwise
    recipe (tpfuse.float8.blockwise_weight_grad, FP32, its scales powers of 2 with power_of_2), returned in the
    weight's dtype."""
    if ctx.mode is None and not fp8_wgrad:
        return grad.t() @ operand
    product = blockwise_weight_grad(grad, operand, power_of_2) if fp8_wgrad else fp32_product(grad.t(), operand)
    if ctx.mode is None:
        return product.to(weight.dtype)
    ctx.main_grad.add_(product)
    if ctx.mode == "none":
        return None
    return torch.zeros_like(weight) if ctx.mode == "zeros" else torch.empty_like(weight)


class ColumnParallelLinearFunction(torch.autograd.Function):
    """y = AG(x) @ weight^T + bias: x (M/P x K) this rank's rows of each of `batch` sequences, weight (N/P x K)
    and bias (N/P) this rank's output columns; y is M x N/P, every sequence's rows in rank order."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad, group_name, world_size, batch, save_gathered_input, mode):
        if save_gathered_input:
            y, gathered = torch.ops.tpfuse.all_gather_gemm_gathered(x, weight, "nk", group_name, bias, batch)
        else:
            y, gathered = torch.ops.tpfuse.all_gather_gemm(x, weight, "nk", group_name, bias, batch), None
        ctx.save_for_backward(x if gathered is None else gathered, weight)
        _keep_main_grad(ctx, main_grad, mode)
        ctx.group_name, ctx.world_size, ctx.batch, ctx.regather = group_name, world_size, batch, gathered is None
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        saved, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = column_parallel_input_grad(grad, weight, "nk", ctx.group_name, ctx.batch) \
            if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            gathered = gather_sequences(saved, ctx.group_name, ctx.world_size, ctx.batch) if ctx.regather else saved
            grad_w = _accumulate_or_return(ctx, weight, gathered, grad)
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_bias, None, None, None, None, None, None


class RowParallelLinearFunction(torch.autograd.Function):
    """out = RS(x @ weight^T) + bias: x (M x K/P) `batch` sequences, weight (N x K/P) this rank's input
    columns, bias (N) whole on every rank, added once to the reduced rows; out is this rank's M/P x N rows,
    its 1/P of each sequence."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad, group_name, world_size, batch, mode):
        out = torch.ops.tpfuse.gemm_reduce_scatter(x, weight, "nk", group_name, bias, batch)
        ctx.save_for_backward(x, weight)
        _keep_main_grad(ctx, main_grad, mode)
        ctx.group_name, ctx.world_size, ctx.batch, ctx.has_bias = group_name, world_size, batch, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x, gathered = row_parallel_backward(grad, x, weight, "nk", ctx.group_name, ctx.world_size,
                                                 ctx.needs_input_grad[0], ctx.batch)
        grad_w = _accumulate_or_return(ctx, weight, x, gathered) if ctx.needs_input_grad[1] else None
        # This rank's rows only: the bias's full gradient is the sum over the group (see tpfuse.nn).
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_bias, None, None, None, None, None


# --- the layers with the blockwise FP8 recipe (tpfuse.float8.BlockwiseRecipe) ---

def check_fp8_recipe(fp8: Optional[BlockwiseRecipe], weight_shape, layer: str = "the layer") -> None:
    """fp8 is None (BF16) or a BlockwiseRecipe whose blocks tile the weight shard (N x K, nn.Linear's layout): K is
    the forward's reduction dimension and N the input gradient's, both quantized per 128."""
    if fp8 is None:
        return
    if not isinstance(fp8, BlockwiseRecipe):
        raise InvalidArgumentError(f"fp8 = {fp8!r} must be None (BF16) or a tpfuse.float8.BlockwiseRecipe")
    rows, columns = weight_shape
    for extent, features, reduction in ((columns, "input", "forward's"), (rows, "output", "input gradient's")):
        if extent % SCALE_BLOCK:
            raise InvalidArgumentError(
                f"{layer} with fp8={fp8}: its weight shard is {rows} x {columns} (output x input features of this "
                f"rank), and its {extent} {features} features, the {reduction} reduction dimension, are not a "
                f"multiple of {SCALE_BLOCK} (the recipe quantizes them per 1 x {SCALE_BLOCK} tile and "
                f"{SCALE_BLOCK} x {SCALE_BLOCK} block)")


def quantize_weight(weight: torch.Tensor, fp8: BlockwiseRecipe) -> Tuple[torch.Tensor, torch.Tensor]:
    """The recipe's FP8 weight: the weight shard (N x K) per 128 x 128 block, (w_fp8, w_scale). The layers make it
    at each forward, or once for the micro-batches of a step (their forward's is_first_microbatch); the
    functions below take it as fp8_weight."""
    return quantize_blockwise(weight.detach(), WEIGHT_BLOCK, fp8.power_of_2_scales)


def check_fp8_weight(fp8_weight, fp8: Optional[BlockwiseRecipe], weight: torch.Tensor) -> None:
    """fp8_weight is None, or (w_fp8, w_scale) as quantize_weight makes them for `weight` under a recipe."""
    if fp8_weight is None:
        return
    if fp8 is None:
        raise InvalidArgumentError("fp8_weight is given without fp8: it is the blockwise recipe's FP8 weight")
    if not isinstance(fp8_weight, (tuple, list)) or len(fp8_weight) != 2:
        raise InvalidArgumentError(f"fp8_weight must be (w_fp8, w_scale) as quantize_weight makes them, not "
                                   f"{type(fp8_weight).__name__}")
    w_fp8, w_scale = fp8_weight
    scale_shape = blockwise_scale_shapes(0, *weight.shape)[1]
    if (not isinstance(w_fp8, torch.Tensor) or not isinstance(w_scale, torch.Tensor) or w_fp8.dtype != E4M3 or
            w_fp8.shape != weight.shape or w_scale.dtype != torch.float32 or tuple(w_scale.shape) != scale_shape or
            w_fp8.device != weight.device or w_scale.device != weight.device):
        described = [f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                     for t in (w_fp8, w_scale)]
        raise InvalidArgumentError(f"fp8_weight is ({described[0]}, {described[1]}); the weight "
                                   f"{tuple(weight.shape)} on {weight.device} needs ({E4M3} {tuple(weight.shape)}, "
                                   f"torch.float32 {scale_shape}) there, as quantize_weight makes them")


def _dgrad_operands(grad: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, power_of_2: bool):
    """The input gradient's FP8 operands: grad per 1 x 128 tile of its features (its reduction dimension here), and
    W^T as the op's "nk" weight, whose 128 x 128 blocks are the forward's transposed (the same e4m3 values and
    scales, no second quantization): (grad_fp8, grad_scale, w_t_fp8, w_t_scale)."""
    return (*quantize_blockwise(grad.contiguous(), power_of_2=power_of_2), w_fp8.t().contiguous(),
            w_scale.t().contiguous())


def _dequantized(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """E4M3 rows and their 1 x 128 tiles' scales as BF16 (dequantized in FP32, then rounded once)."""
    return dequantize_blockwise(data, scale).to(torch.bfloat16)


class BlockwiseColumnParallelLinearFunction(torch.autograd.Function):
    """ColumnParallelLinearFunction with the blockwise FP8 recipe: y = AG(x8) @ W8^T + bias by the FP8 all-gather,
    grad_x = RS(g8 @ W8) by the FP8 reduce-scatter, grad_W = g^T @ X with X the FP8 rows the forward gathered
    (kept, or gathered again, with their scales), dequantized."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad, group_name, world_size, batch, save_gathered_input, mode, fp8_wgrad,
                power_of_2, w_fp8, w_scale):
        x_fp8, x_scale = quantize_blockwise(x, power_of_2=power_of_2)
        if save_gathered_input:
            y, gathered = torch.ops.tpfuse.all_gather_gemm_gathered(x_fp8, w_fp8, "nk", group_name, bias, batch,
                                                                    x_scale, w_scale)
        else:
            y, gathered = torch.ops.tpfuse.all_gather_gemm(x_fp8, w_fp8, "nk", group_name, bias, batch, x_scale,
                                                           w_scale), None
        ctx.save_for_backward(x_fp8 if gathered is None else gathered, x_scale, weight, w_fp8, w_scale)
        _keep_main_grad(ctx, main_grad, mode)
        ctx.group_name, ctx.world_size, ctx.batch, ctx.regather = group_name, world_size, batch, gathered is None
        ctx.has_bias, ctx.fp8_wgrad, ctx.power_of_2 = bias is not None, fp8_wgrad, power_of_2
        return y

    @staticmethod
    def backward(ctx, grad):
        saved, x_scale, weight, w_fp8, w_scale = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_fp8, grad_scale, w_t, w_t_scale = _dgrad_operands(grad, w_fp8, w_scale, ctx.power_of_2)
            grad_x = torch.ops.tpfuse.gemm_reduce_scatter(grad_fp8, w_t, "nk", ctx.group_name, None, ctx.batch,
                                                          grad_scale, w_t_scale)
        if ctx.needs_input_grad[1]:
            # The scales of the gathered rows (a 32nd of their bytes), and the rows themselves where not kept
            # (their bytes: torch's all-gather of FP8 through uint8).
            gathered_scale = gather_sequences(x_scale, ctx.group_name, ctx.world_size, ctx.batch)
            gathered = gather_sequences(saved.view(torch.uint8), ctx.group_name, ctx.world_size,
                                        ctx.batch).view(E4M3) if ctx.regather else saved
            grad_w = _accumulate_or_return(ctx, weight, _dequantized(gathered, gathered_scale), grad, ctx.fp8_wgrad,
                                           ctx.power_of_2)
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_bias, None, None, None, None, None, None, None, None, None, None


class BlockwiseRowParallelLinearFunction(torch.autograd.Function):
    """RowParallelLinearFunction with the blockwise FP8 recipe: out = RS(x8 @ W8^T) + bias by the FP8 reduce-scatter,
    (grad_x, G8) = the FP8 all-gather of g8 times W8, grad_W = G^T @ x with G8 dequantized (x kept in BF16)."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad, group_name, world_size, batch, mode, fp8_wgrad, power_of_2, w_fp8,
                w_scale):
        x_fp8, x_scale = quantize_blockwise(x, power_of_2=power_of_2)
        out = torch.ops.tpfuse.gemm_reduce_scatter(x_fp8, w_fp8, "nk", group_name, bias, batch, x_scale, w_scale)
        ctx.save_for_backward(x, weight, w_fp8, w_scale)
        _keep_main_grad(ctx, main_grad, mode)
        ctx.group_name, ctx.world_size, ctx.batch, ctx.has_bias = group_name, world_size, batch, bias is not None
        ctx.fp8_wgrad, ctx.power_of_2 = fp8_wgrad, power_of_2
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, w_fp8, w_scale = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_fp8, grad_scale, w_t, w_t_scale = _dgrad_operands(grad, w_fp8, w_scale, ctx.power_of_2)
            grad_x, gathered_fp8 = torch.ops.tpfuse.all_gather_gemm_gathered(grad_fp8, w_t, "nk", ctx.group_name, None,
                                                                             ctx.batch, grad_scale, w_t_scale)
        if ctx.needs_input_grad[1]:
            # G as the dgrad gathered it, with its scales (a 32nd of its bytes); without a dgrad, torch's BF16
            # all-gather, as the BF16 layer's.
            if grad_x is None:
                gathered = gather_sequences(grad, ctx.group_name, ctx.world_size, ctx.batch)
            else:
                gathered = _dequantized(gathered_fp8, gather_sequences(grad_scale, ctx.group_name, ctx.world_size,
                                                                       ctx.batch))
            grad_w = _accumulate_or_return(ctx, weight, x, gathered, ctx.fp8_wgrad, ctx.power_of_2)
        # This rank's rows only, as the BF16 layer's.
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_bias, None, None, None, None, None, None, None, None, None


def _recipe_arguments(fp8: BlockwiseRecipe, weight: torch.Tensor, fp8_weight) -> tuple:
    """The blockwise functions' last arguments: fp8_wgrad, power_of_2, and the FP8 weight and its scales (the one
    given, else the weight quantized now)."""
    return (fp8.wgrad == "fp8", fp8.power_of_2_scales,
            *(fp8_weight if fp8_weight is not None else quantize_weight(weight, fp8)))


def _main_grad_of(weight: torch.Tensor, gradient_accumulation_fusion: bool):
    if not gradient_accumulation_fusion or not weight.requires_grad:
        return None, None
    mode = main_grad_mode(weight)  # checks main_grad first
    return weight.main_grad, mode


def _check_sequence_dim(x: torch.Tensor, sequence_dim: int) -> None:
    if x.dim() < 2:
        raise InvalidArgumentError(f"x {tuple(x.shape)} must have 2 or more dimensions (..., features)")
    if not 0 <= sequence_dim < x.dim() - 1:
        raise InvalidArgumentError(f"sequence_dim = {sequence_dim} is not a dimension of x {tuple(x.shape)} "
                                   f"before its features (0 to {x.dim() - 2})")


def _check_features(x: torch.Tensor, weight: torch.Tensor) -> None:
    # NOTE: here and not only in the ops: compiled, the guard it adds settles x's features as the weight's before
    # the autograd function is traced (torch 2.11's tracing of it fails where they are settled only inside).
    if x.shape[-1] != weight.shape[1]:
        raise InvalidArgumentError(f"x {tuple(x.shape)} has {x.shape[-1]} features and the weight shard "
                                   f"{tuple(weight.shape)} (output x input features, nn.Linear's layout) takes "
                                   f"{weight.shape[1]}")


_log = logging.getLogger(__name__)
_logged_fallbacks = set()  # the layer kinds whose sequence-major fallback was logged


def _kernels_serve(layer: str, x: torch.Tensor, sequence_dim: int, batch: int, shard_rows: int,
                   world_size: int) -> bool:
    """Whether the kernels take x's sequences as they lie: `batch` sequences (the dimensions before
    sequence_dim), of which each rank holds `shard_rows` rows. Where not, the layer runs on a sequence-major
    copy, which is logged once per layer kind (not under torch.compile, which cannot trace a log call)."""
    if batch == 1 or world_size == 1 or shard_rows % SLAB_ROWS == 0:
        return True
    if layer not in _logged_fallbacks and not torch.compiler.is_compiling():
        _logged_fallbacks.add(layer)
        _log.warning("%s: x %s with sequence_dim = %d: each rank's share of a sequence is %d rows, not a multiple "
                     "of %d (the kernels' slab, with several sequences); running on a copy in sequence-major "
                     "order (sequence_dim 0), and back", layer, tuple(x.shape), sequence_dim, shard_rows, SLAB_ROWS)
    return False


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           group: dist.ProcessGroup, *, sequence_dim: int = 0, save_gathered_input: bool = True,
                           gradient_accumulation_fusion: bool = False, fp8: Optional[BlockwiseRecipe] = None,
                           fp8_weight: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """The column-parallel linear layer with sequence parallelism: x (..., S/P, ..., K), this rank's tokens of
    the sequence (dimension sequence_dim: 0 for [s, b, h], 1 for [b, s, h]), all-gathered and multiplied by
    this rank's weight (N/P x K, nn.Linear's layout) in one kernel, which also adds its bias (N/P):
    (..., S, ..., N/P), every token of this rank's output features.

    save_gathered_input: keep the gathered x (S x K per rank) for the weight's gradient (memory), else
    gather x again in backward (time: one all-gather of x, not hidden behind a GEMM).
    gradient_accumulation_fusion: add the weight's gradient into weight.main_grad in FP32 (see main_grad_mode).
    fp8: None (BF16), or a tpfuse.float8.BlockwiseRecipe: FP8 forward and input gradient (the weight's gradient as
    the recipe says); the weight shard's dimensions multiples of 128 (check_fp8_recipe).
    fp8_weight: with fp8, the weight as quantize_weight(weight, fp8) made it, to use in place of quantizing it here
    (one quantization for the micro-batches of a step); it must be of the weight's current values."""
    _check_sequence_dim(x, sequence_dim)
    _check_features(x, weight)
    check_fp8_recipe(fp8, weight.shape)
    check_fp8_weight(fp8_weight, fp8, weight)
    world_size, batch = group.size(), math.prod(x.shape[:sequence_dim])
    if not _kernels_serve("ColumnParallelLinear", x, sequence_dim, batch, math.prod(x.shape[sequence_dim:-1]),
                          world_size):
        y = column_parallel_linear(x.movedim(sequence_dim, 0), weight, bias, group,
                                   save_gathered_input=save_gathered_input,
                                   gradient_accumulation_fusion=gradient_accumulation_fusion, fp8=fp8,
                                   fp8_weight=fp8_weight)
        return y.movedim(0, sequence_dim)
    main_grad, mode = _main_grad_of(weight, gradient_accumulation_fusion)
    arguments = (x.reshape(-1, x.shape[-1]), weight, bias, main_grad, group.group_name, world_size, batch,
                 save_gathered_input, mode)
    if fp8 is None:
        y = ColumnParallelLinearFunction.apply(*arguments)
    else:
        y = BlockwiseColumnParallelLinearFunction.apply(*arguments, *_recipe_arguments(fp8, weight, fp8_weight))
    shape = list(x.shape)
    shape[sequence_dim], shape[-1] = shape[sequence_dim] * world_size, y.shape[-1]
    return y.view(shape)


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                        group: dist.ProcessGroup, *, sequence_dim: int = 0,
                        gradient_accumulation_fusion: bool = False, fp8: Optional[BlockwiseRecipe] = None,
                        fp8_weight: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """The row-parallel linear layer with sequence parallelism: x (..., S, ..., K/P), this rank's input
    features of every token, times this rank's weight (N x K/P, nn.Linear's layout), summed over the group
    and scattered by tokens of the sequence (dimension sequence_dim) in one kernel, which also adds the bias
    (N, whole on every rank) to the summed rows: this rank's tokens (..., S/P, ..., N). gradient_accumulation_fusion,
    fp8 and fp8_weight: as column_parallel_linear's."""
    _check_sequence_dim(x, sequence_dim)
    _check_features(x, weight)
    check_fp8_recipe(fp8, weight.shape)
    check_fp8_weight(fp8_weight, fp8, weight)
    world_size = group.size()
    if x.shape[sequence_dim] % world_size:
        raise InvalidArgumentError(f"x {tuple(x.shape)}: its sequence (dim {sequence_dim}) of {x.shape[sequence_dim]} "
                                   f"tokens does not divide over the group's {world_size} ranks")
    batch, shard_rows = math.prod(x.shape[:sequence_dim]), math.prod(x.shape[sequence_dim:-1]) // world_size
    if not _kernels_serve("RowParallelLinear", x, sequence_dim, batch, shard_rows, world_size):
        out = row_parallel_linear(x.movedim(sequence_dim, 0), weight, bias, group,
                                  gradient_accumulation_fusion=gradient_accumulation_fusion, fp8=fp8,
                                  fp8_weight=fp8_weight)
        return out.movedim(0, sequence_dim)
    main_grad, mode = _main_grad_of(weight, gradient_accumulation_fusion)
    arguments = (x.reshape(-1, x.shape[-1]), weight, bias, main_grad, group.group_name, world_size, batch, mode)
    if fp8 is None:
        out = RowParallelLinearFunction.apply(*arguments)
    else:
        out = BlockwiseRowParallelLinearFunction.apply(*arguments, *_recipe_arguments(fp8, weight, fp8_weight))
    shape = list(x.shape)
    shape[sequence_dim], shape[-1] = shape[sequence_dim] // world_size, out.shape[-1]
    return out.view(shape)
