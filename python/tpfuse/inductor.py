"""An opt-in Inductor post-grad pass for torchao's rowwise float8 recipe under sequence parallelism:

    tpfuse.inductor.install_float8_all_gather_pass()   # before the first compiled step; .uninstall() undoes it

A column-parallel float8 linear gathers the BF16 activations, quantizes the gathered rows to e4m3 with one
power-of-2 scale each (torchao's hp_tensor_to_float8_dynamic, rowwise, round_scales_to_power_of_2=True) and
multiplies them with torch._scaled_mm. After AOT autograd the post-grad graph holds exactly this chain (the same
at torch 2.7 and 2.15), G the gathered rows:

    G     = wait_tensor(all_gather_into_tensor(x, P, group))              x: this rank's rows, 2-D BF16
    amax  = amax(abs(convert(abs(G), f32)), [-1], keepdim)
    s     = exp2(floor(log2(convert(mul(reciprocal(clamp_min(convert(amax, f64), 1e-12)), 448), f32))))
    G8    = convert(clamp_max(clamp_min(mul(convert(G, f32), s), -448), 448), e4m3)
    y     = _scaled_mm(G8, permute(w, [1, 0]), reciprocal(s), w_scale, None, None, bf16, use_fast_accum)

The pass replaces y with tpfuse::quantize_all_gather_gemm(x, w, w_scale, group, use_fast_accum=...), which
quantizes this rank's rows before the gather (the same bits: each row's scale depends on that row alone) and
runs tpfuse's FP8 all-gather + GEMM, so the gather moves e4m3 rows and hides behind the GEMM. It rewrites only
that chain, node for node (mul's operands in either order): no other user of G, G8, s or any node between them
(a training graph that keeps G8 for the weight's gradient is left alone), w an e4m3 N x K matrix, w_scale one
FP32 per column ((1, N): _scaled_mm's rowwise form), no bias or result scale, BF16 out, and shapes tpfuse's
kernels serve (its op's checks). Anything else is left untouched. Each rewrite is logged at INFO on
logging.getLogger("tpfuse.inductor"), each _scaled_mm left as it is at DEBUG with the reason.
"""

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple, Union

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from .errors import TpfuseError
from .float8 import AMAX_EPS, E4M3, E4M3_MAX
from .symm_mem import arguments_by_name

logger = logging.getLogger("tpfuse.inductor")

_aten, _prims, _c10d = torch.ops.aten, torch.ops.prims, torch.ops._c10d_functional


@dataclass
class _Match:
    shard: fx.Node             # x: this rank's BF16 rows
    group_name: str
    transpose: fx.Node         # _scaled_mm's B: w's transpose
    weight: fx.Node            # w: N x K e4m3
    w_scale: fx.Node
    use_fast_accum: bool
    chain: List[fx.Node]       # the nodes from the all-gather to the e4m3 rows, replaced with the product


class _Miss(Exception):
    """The chain differs from the recipe's: why, for the log."""


def _call(value, target, what: str) -> fx.Node:
    """value, checked to be a call of `target`."""
    if not isinstance(value, fx.Node) or value.op != "call_function" or value.target is not target:
        found = value.target if isinstance(value, fx.Node) else value
        raise _Miss(f"{what} is {found}, not {target}")
    return value


def _convert(value, dtype: torch.dtype, what: str) -> fx.Node:
    """The input of a conversion of value to dtype (prims.convert_element_type)."""
    node = _call(value, _prims.convert_element_type.default, what)
    if node.args[1] != dtype:
        raise _Miss(f"{what} converts to {node.args[1]}, not {dtype}")
    return node.args[0]


def _scalar_operand(node: fx.Node, scalar: float, what: str) -> fx.Node:
    """The tensor operand of a call whose other argument is the number `scalar`."""
    tensor, value = node.args[0], node.args[1]
    if not isinstance(value, (int, float)) or value != scalar:
        raise _Miss(f"{what} takes {value}, not {scalar}")
    return tensor


def _scale_chain(scale: fx.Node, gathered: fx.Node, chain: List[fx.Node]) -> None:
    """scale, checked to be torchao's power-of-2 rowwise scale of `gathered` (appending its nodes to chain)."""
    exp2 = _call(scale, _aten.exp2.default, "the scale")
    floor = _call(exp2.args[0], _aten.floor.default, "exp2's input")
    log2 = _call(floor.args[0], _aten.log2.default, "floor's input")
    to_f32 = log2.args[0]
    mul = _call(_convert(to_f32, torch.float32, "log2's input"), _aten.mul.Tensor, "the FP64 scale")
    reciprocal = _call(_scalar_operand(mul, E4M3_MAX, "the FP64 scale's product"), _aten.reciprocal.default,
                       "448's factor")
    clamp = _call(reciprocal.args[0], _aten.clamp_min.default, "the reciprocal's input")
    to_f64 = _scalar_operand(clamp, AMAX_EPS, "the amax's clamp")
    amax = _call(_convert(to_f64, torch.float64, "the clamped amax"), _aten.amax.default, "the FP64 amax's input")
    dims, keepdim = (list(amax.args[1]) if len(amax.args) > 1 else []), (amax.args[2] if len(amax.args) > 2 else False)
    if dims not in ([-1], [gathered.meta["val"].dim() - 1]) or not keepdim:
        raise _Miss(f"the amax is over dims {dims} (keepdim={keepdim}), not the last with keepdim")
    abs_f32 = _call(amax.args[0], _aten.abs.default, "the amax's input")
    to_f32_abs = abs_f32.args[0]
    abs_bf16 = _call(_convert(to_f32_abs, torch.float32, "abs's input"), _aten.abs.default, "the FP32 abs's input")
    if abs_bf16.args[0] is not gathered:
        raise _Miss("the amax is not of the gathered rows")
    chain += [exp2, floor, log2, to_f32, mul, reciprocal, clamp, to_f64, amax, abs_f32, to_f32_abs, abs_bf16]


def _match(scaled_mm: fx.Node) -> _Match:
    """The recipe's chain ending in this _scaled_mm, or _Miss."""
    values = arguments_by_name(scaled_mm.target._schema, scaled_mm.args, scaled_mm.kwargs)
    rows_fp8 = values["self"]
    clamp_max = _call(_convert(rows_fp8, E4M3, "_scaled_mm's A"), _aten.clamp_max.default, "A's e4m3 input")
    clamp_min = _call(_scalar_operand(clamp_max, E4M3_MAX, "the upper clamp"), _aten.clamp_min.default,
                      "the upper clamp's input")
    mul = _call(_scalar_operand(clamp_min, -E4M3_MAX, "the lower clamp"), _aten.mul.Tensor, "the clamps' input")
    operands = list(mul.args[:2])
    rows_f32 = next((operand for operand in operands if isinstance(operand, fx.Node) and operand.op == "call_function"
                     and operand.target is _prims.convert_element_type.default and operand.args[1] == torch.float32
                     and isinstance(operand.args[0], fx.Node)
                     and operand.args[0].target is _c10d.wait_tensor.default), None)
    if rows_f32 is None:
        raise _Miss("the scaled rows are not the gathered rows in FP32")
    scale = operands[1 - operands.index(rows_f32)]
    gathered = rows_f32.args[0]
    all_gather = _call(gathered.args[0], _c10d.all_gather_into_tensor.default, "the waited tensor")
    shard, _, group_name = all_gather.args[:3]
    inverse = _call(values["scale_a"], _aten.reciprocal.default, "_scaled_mm's scale_a")
    if inverse.args[0] is not scale:
        raise _Miss("_scaled_mm's scale_a is not the reciprocal of the rows' scale")
    # Users before their inputs: the order in which the rewrite erases them.
    chain = [rows_fp8, clamp_max, clamp_min, mul, rows_f32, inverse]
    _scale_chain(scale, gathered, chain)
    chain += [gathered, all_gather]

    for name, expected in (("bias", None), ("scale_result", None), ("out_dtype", torch.bfloat16)):
        if values[name] != expected:
            raise _Miss(f"_scaled_mm's {name} is {values[name]}, not {expected}")
    transpose = values["mat2"]
    if not isinstance(transpose, fx.Node) or not (
            transpose.target is _aten.t.default or
            (transpose.target is _aten.permute.default and list(transpose.args[1]) == [1, 0])):
        raise _Miss("_scaled_mm's B is not the transpose of an N x K weight")
    weight = transpose.args[0]
    shard_val, weight_val, w_scale_val = (node.meta.get("val") for node in (shard, weight, values["scale_b"]))
    if shard_val is None or shard_val.dim() != 2 or shard_val.dtype != torch.bfloat16:
        raise _Miss("the gathered shard is not a BF16 matrix")
    if weight_val is None or weight_val.dtype != E4M3 or not weight_val.is_contiguous():
        raise _Miss("the weight is not a contiguous N x K e4m3 matrix")
    n = weight_val.shape[0]
    if w_scale_val is None or w_scale_val.dtype != torch.float32 or tuple(w_scale_val.shape) != (1, n):
        raise _Miss("_scaled_mm's scale_b is not one FP32 scale per output column (1, N)")

    # Nothing outside the chain may read what the rewrite removes.
    inside = set(chain) | {scaled_mm}
    for node in chain:
        outside = [user for user in node.users if user not in inside]
        if outside:
            raise _Miss(f"{node} is also read by {outside[0]}")
    return _Match(shard, group_name, transpose, weight, values["scale_b"], bool(values["use_fast_accum"]), chain)


def _fake_value(target, args):
    """target(*args) on the nodes' fake values, as Inductor's later passes expect of a node's meta["val"] (it runs
    the op's fake implementation, whose checks refuse what tpfuse does not serve)."""
    values = [arg.meta.get("val") if isinstance(arg, fx.Node) else arg for arg in args]
    fake_mode = torch._guards.detect_fake_mode(values)
    if fake_mode is None:
        raise _Miss("the graph's nodes carry no fake values (meta['val'])")
    with fake_mode:
        return target(*values)


def rewrite_float8_all_gathers(graph: fx.Graph) -> int:
    """Rewrites every matching chain in graph (above) onto tpfuse::quantize_all_gather_gemm; returns how many."""
    target = torch.ops.tpfuse.quantize_all_gather_gemm.default
    rewritten = 0
    for scaled_mm in list(graph.nodes):
        if scaled_mm.op != "call_function" or scaled_mm.target is not _aten._scaled_mm.default:
            continue
        try:
            match = _match(scaled_mm)
            args = (match.shard, match.weight, match.w_scale, match.group_name, None, 1, match.use_fast_accum)
            value = _fake_value(target, args)
        except _Miss as miss:
            logger.debug("tpfuse leaves %s as it is: %s", scaled_mm, miss)
            continue
        except TpfuseError as error:
            logger.debug("tpfuse leaves %s as it is: its op does not serve these shapes: %s", scaled_mm, error)
            continue
        with graph.inserting_before(scaled_mm):
            product = graph.call_function(target, args)
        # Only the value and where it came from: _scaled_mm's other meta (its eager inputs' strides, which Inductor
        # holds custom ops' inputs to) describes its arguments, not these.
        product.meta["val"] = value
        if "stack_trace" in scaled_mm.meta:
            product.meta["stack_trace"] = scaled_mm.meta["stack_trace"]
        scaled_mm.replace_all_uses_with(product)
        graph.erase_node(scaled_mm)
        for node in match.chain:  # users before their inputs
            graph.erase_node(node)
        if not match.transpose.users:
            graph.erase_node(match.transpose)
        rewritten += 1
        logger.info("tpfuse rewrote the all-gather of %s, its rowwise float8 cast and _scaled_mm into "
                     "tpfuse::quantize_all_gather_gemm (group %s, use_fast_accum=%s)", match.shard, match.group_name,
                     match.use_fast_accum)
    return rewritten


PassType = Union[None, object, List[object], Tuple[object, ...]]


def _previous_passes(previous: PassType) -> tuple:
    if previous is None:
        return ()
    return tuple(previous) if isinstance(previous, (list, tuple)) else (previous,)


class Float8AllGatherPass(CustomGraphPass):
    """The pass as Inductor's post_grad_custom_post_pass: the pass that was set before runs first, then this one.
    Its uuid (what Inductor's FX graph cache keys on) is this file's hash with the earlier pass's; None (no
    caching, as for any plain function) where the earlier pass has none."""

    def __init__(self, previous: PassType = None):
        self.previous = previous

    def __call__(self, graph: fx.Graph) -> None:
        for earlier in _previous_passes(self.previous):
            earlier(graph)
        rewrite_float8_all_gathers(graph)

    def uuid(self):
        earlier = []
        for previous in _previous_passes(self.previous):
            uuid = previous.uuid() if hasattr(previous, "uuid") else None
            if uuid is None:
                return None
            earlier.append(uuid)
        return (hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), *earlier)

    def uninstall(self) -> None:
        """Puts back the pass that was set before install_float8_all_gather_pass (if this one is still set)."""
        import torch._inductor.config as inductor_config
        if inductor_config.post_grad_custom_post_pass is self:
            inductor_config.post_grad_custom_post_pass = self.previous


def install_float8_all_gather_pass() -> Float8AllGatherPass:
    """Sets torch._inductor.config.post_grad_custom_post_pass to the pass above, chained after the pass already
    set there (if any); returns it (its uninstall() restores the earlier one). Installed twice, it is set once."""
    import torch._inductor.config as inductor_config
    current = inductor_config.post_grad_custom_post_pass
    if isinstance(current, Float8AllGatherPass):
        return current
    installed = Float8AllGatherPass(current)
    inductor_config.post_grad_custom_post_pass = installed
    return installed
