"""tpfuse.nn's layers with the blockwise FP8 recipe (tpfuse.float8.BlockwiseRecipe) on the simulated group
(simulated_group.py) at P = 1, 2 and 4: each layer's output and every gradient against a float64 reference of
the recipe's dequantized computation, both weight-gradient choices, both of the column layer's
save_gathered_input; the launches (blockwise E4M3 forward and backward, BF16 without the recipe); [b, s, h]
sharded on s; main_grad accumulation in FP32; the named errors; the compiled graphs; and
blockwise_weight_grad, the FP8 weight gradient, alone.

The reference: the inputs, weights and upstream gradients quantized by tpfuse.float8.quantize_blockwise as the
recipe says, then multiplied in float64: y = X @ W^T + b and the input's gradient G @ W from the dequantized
E4M3 values; the weight's gradient from the BF16 operands the recipe multiplies (the operand a fused op
gathered in FP8 dequantized to BF16), in float64 (wgrad "bf16") or quantized per 128 tokens and dequantized
(wgrad "fp8"). The bound, for every entry: |ours - reference| <= 2^-8 |reference| + 2^-12 m, m the sum of
the magnitudes of the products the entry sums. The simulated launches sum in float64 and round once to BF16
(2^-9 relative); the weight's gradient is a BF16 or FP32 GEMM in torch (its FP32 sums, its one rounding to
BF16). The quantization itself is no part of the error, and exceeds the bound: the BF16 layers' results miss
it (checked below), so a step that skipped or misplaced a quantization would show."""

import pytest
import torch

import tpfuse
from tpfuse import _checks
from tpfuse.autograd import column_parallel_linear, row_parallel_linear
from tpfuse.float8 import (TOKEN_BLOCK, WEIGHT_BLOCK, BlockwiseRecipe, blockwise_weight_grad, dequantize_blockwise,
                           quantize_blockwise)
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear
from simulated_group import BLOCKWISE, SimulatedGroup
from test_autograd import BF16, GraphsOf

F64 = torch.float64
RECIPES = [BlockwiseRecipe(), BlockwiseRecipe(wgrad="fp8")]
POWER_OF_2 = BlockwiseRecipe(wgrad="fp8", power_of_2_scales=True)
SIZES = [1, 2, 4]
ROWS_PER_RANK = 80  # tokens per rank: M/128 token blocks and a partial one for the FP8 weight gradient


def fp8_group(group, monkeypatch):
    """The simulated group (its ops take blockwise scales as the library does)."""
    return SimulatedGroup(group, monkeypatch)


def dequantized(x, block=(1, 128), dtype=F64, power_of_2=False):
    return dequantize_blockwise(*quantize_blockwise(x, block, power_of_2), block, dtype)


def wgrad_reference(grad, operand, recipe):
    """grad^T @ operand as the recipe's weight gradient multiplies them (BF16 operands), in float64, and the sum of
    the products' magnitudes."""
    if recipe.wgrad == "fp8":
        grad, operand = (dequantized(t, TOKEN_BLOCK, power_of_2=recipe.power_of_2_scales) for t in (grad, operand))
    grad, operand = grad.double(), operand.double()
    return grad.t() @ operand, grad.abs().t() @ operand.abs()


def check_bound(name, ours, reference_and_magnitude):
    reference, magnitude = reference_and_magnitude
    assert ours is not None and ours.shape == reference.shape, f"{name}: {ours} against {tuple(reference.shape)}"
    excess = (ours.double() - reference).abs() - (2 ** -8 * reference.abs() + 2 ** -12 * magnitude)
    assert excess.max() <= 0, f"{name}: {int((excess > 0).sum())} entries past the bound, by up to {excess.max()}"


def draws(*shape, generator):
    """Normal draws, each row times its own power of 2 (the tiles' scales differ), as BF16."""
    rows = 2.0 ** torch.randint(-3, 4, (shape[0], 1), generator=generator)
    return (torch.randn(*shape, generator=generator) * rows).to(BF16)


class LayerCase:
    """One layer's whole nn.Linear (BF16), input x (M tokens x in_features) and upstream gradient g (M x
    out_features), and the float64 reference of the recipe on them: y, x.grad, the weight's and the bias's
    gradients (each with its magnitudes), whole."""

    def __init__(self, layer_type, p, recipe, seed, in_features, out_features, rows_per_rank=ROWS_PER_RANK,
                 reference_recipe=None):
        """reference_recipe: the recipe of the reference, if not the layers' (a premise's check)."""
        generator = torch.Generator().manual_seed(seed)
        self.layer_type, self.p, self.recipe = layer_type, p, recipe
        self.linear = torch.nn.Linear(in_features, out_features, dtype=BF16)
        with torch.no_grad():
            self.linear.weight.copy_(draws(out_features, in_features, generator=generator) / in_features ** 0.5)
            self.linear.bias.copy_(draws(1, out_features, generator=generator)[0])
        m = rows_per_rank * p
        self.x, self.g = draws(m, in_features, generator=generator), draws(m, out_features, generator=generator)
        reference_recipe = reference_recipe or recipe
        power_of_2 = reference_recipe.power_of_2_scales
        x, g = (dequantized(t, power_of_2=power_of_2) for t in (self.x, self.g))
        w = dequantized(self.linear.weight, WEIGHT_BLOCK, power_of_2=power_of_2)
        bias = self.linear.bias.double()
        self.y = (x @ w.t() + bias, x.abs() @ w.abs().t() + bias.abs())
        self.x_grad = (g @ w, g.abs() @ w.abs())
        # The weight gradient's operands: the column layer's input and the row layer's gradient come gathered
        # in FP8 and are dequantized to BF16; the others are this rank's BF16 tensors.
        gathered = dequantized(self.x if layer_type is ColumnParallelLinear else self.g, dtype=torch.float32,
                               power_of_2=power_of_2).to(BF16)
        if layer_type is ColumnParallelLinear:
            self.w_grad = wgrad_reference(self.g, gathered, reference_recipe)
        else:
            self.w_grad = wgrad_reference(gathered, self.x, reference_recipe)
        self.b_grad = (self.g.double().sum(0), self.g.double().abs().sum(0))

    def rows(self, tensor, rank):
        rows = tensor.shape[0] // self.p
        return tensor[rank * rows:(rank + 1) * rows]

    def columns(self, tensor, rank):
        columns = tensor.shape[-1] // self.p
        return tensor[..., rank * columns:(rank + 1) * columns]

    def inputs(self, rank):
        """This rank's x and upstream gradient: its tokens and its output features of all (column), all tokens of
        its input features and its tokens (row)."""
        if self.layer_type is ColumnParallelLinear:
            return self.rows(self.x, rank), self.columns(self.g, rank)
        return self.columns(self.x, rank), self.rows(self.g, rank)

    def layer(self, group, rank, **options):
        """This rank's layer, with the case's recipe unless options say fp8=."""
        return self.layer_type.from_linear(self.linear, group, rank=rank, **{"fp8": self.recipe, **options})

    def step(self, group, rank, **options):
        """This rank's forward and backward: (y, x.grad, the layer)."""
        layer = self.layer(group, rank, **options)
        x, g = self.inputs(rank)
        x = x.clone().requires_grad_()
        y = layer(x)
        (y.double() * g.double()).sum().backward()
        return y, x.grad, layer

    def references(self, rank):
        """This rank's part of each reference (and magnitudes), by name."""
        if self.layer_type is ColumnParallelLinear:
            return {"y": [self.columns(t, rank) for t in self.y], "x.grad": [self.rows(t, rank) for t in self.x_grad],
                    "weight.grad": [self.rows(t, rank) for t in self.w_grad],
                    "bias.grad": [self.columns(t, rank) for t in self.b_grad]}
        return {"y": [self.rows(t, rank) for t in self.y], "x.grad": [self.columns(t, rank) for t in self.x_grad],
                "weight.grad": [self.columns(t, rank) for t in self.w_grad],
                # this rank's tokens' part: the bias is added to its rows only
                "bias.grad": [self.rows(self.g, rank).double().sum(0), self.rows(self.g, rank).double().abs().sum(0)]}

    def check(self, results):
        for rank, (y, x_grad, layer) in enumerate(results):
            ours = {"y": y, "x.grad": x_grad, "bias.grad": layer.bias.grad, "weight.grad": layer.weight.grad}
            for name, reference in self.references(rank).items():
                check_bound(f"rank {rank} {name}", ours[name], reference)


def column_case(p, recipe, seed, rows_per_rank=ROWS_PER_RANK, **options):
    return LayerCase(ColumnParallelLinear, p, recipe, seed, 256, 256 * p, rows_per_rank, **options)


def row_case(p, recipe, seed, rows_per_rank=ROWS_PER_RANK, **options):
    return LayerCase(RowParallelLinear, p, recipe, seed, 256 * p, 256, rows_per_rank, **options)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
@pytest.mark.parametrize("save_gathered_input", [True, False])
def test_column_layer_against_the_dequantized_computation(groups, monkeypatch, p, recipe, save_gathered_input):
    case = column_case(p, recipe, seed=p)
    sim = fp8_group(groups[p], monkeypatch)
    case.check(sim.run(lambda rank: case.step(groups[p], rank, save_gathered_input=save_gathered_input)))
    # forward: the FP8 all-gather + GEMM; backward: the FP8 GEMM + reduce-scatter
    assert [problem.scaling for problem in sim.all_gather_problems + sim.problems] == [BLOCKWISE] * (2 * p)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
def test_row_layer_against_the_dequantized_computation(groups, monkeypatch, p, recipe):
    case = row_case(p, recipe, seed=10 + p)
    sim = fp8_group(groups[p], monkeypatch)
    case.check(sim.run(lambda rank: case.step(groups[p], rank)))
    assert [problem.scaling for problem in sim.problems + sim.all_gather_problems] == [BLOCKWISE] * (2 * p)


@pytest.mark.parametrize("make_case", [column_case, row_case])
def test_power_of_2_scales(groups, monkeypatch, make_case):
    """BlockwiseRecipe(power_of_2_scales=True): every quantization of the recipe (input, weight, gradient, the FP8
    wgrad's operands) with power-of-2 scales: within the bound of the reference quantized so, and past that of
    the reference with amax / 448 scales (the quantizations differ)."""
    p = 2
    case = make_case(p, POWER_OF_2, seed=15)
    results = fp8_group(groups[p], monkeypatch).run(lambda rank: case.step(groups[p], rank))
    case.check(results)
    other = make_case(p, POWER_OF_2, seed=15, reference_recipe=RECIPES[1])
    for rank, (y, x_grad, layer) in enumerate(results):
        references = other.references(rank)
        for name, ours in (("y", y), ("x.grad", x_grad), ("weight.grad", layer.weight.grad)):
            with pytest.raises(AssertionError, match="past the bound"):
                check_bound(name, ours, references[name])


@pytest.mark.parametrize("make_case", [column_case, row_case])
def test_the_bf16_layer_misses_the_bound(groups, monkeypatch, make_case):
    """The test's premise: the quantization shows. The same layer without the recipe (BF16 throughout, BF16
    launches) is past the bound on its output and input gradient."""
    p = 2
    case = make_case(p, RECIPES[0], seed=20)
    sim = SimulatedGroup(groups[p], monkeypatch)
    results = sim.run(lambda rank: case.step(groups[p], rank, fp8=None))
    for rank, (y, x_grad, _) in enumerate(results):
        references = case.references(rank)
        for name, ours in (("y", y), ("x.grad", x_grad)):
            with pytest.raises(AssertionError, match="past the bound"):
                check_bound(name, ours, references[name])
    assert {problem.scaling for problem in sim.problems + sim.all_gather_problems} == {_checks.NO_SCALING}
    assert {problem.dtype_code for problem in sim.problems + sim.all_gather_problems} == {_checks.BF16_CODE}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
def test_input_gradient_alone_and_weight_gradient_alone(groups, monkeypatch, recipe):
    """A frozen weight skips the weight's gradient; an input that needs none skips the fused dgrad (the row
    layer then gathers the gradient in BF16, as the BF16 layer does, and its weight gradient is that of the
    BF16 gradient)."""
    p = 2
    sim = fp8_group(groups[p], monkeypatch)
    for case in (column_case(p, recipe, seed=30), row_case(p, recipe, seed=31)):
        def frozen(rank):
            layer = case.layer(groups[p], rank)
            layer.weight.requires_grad_(False)
            x, g = case.inputs(rank)
            x = x.clone().requires_grad_()
            (layer(x).double() * g.double()).sum().backward()
            return x.grad, layer

        for rank, (x_grad, layer) in enumerate(sim.run(frozen)):
            assert layer.weight.grad is None
            check_bound(f"rank {rank} x.grad", x_grad, case.references(rank)["x.grad"])

        def constant_input(rank):
            layer = case.layer(groups[p], rank)
            x, g = case.inputs(rank)
            (layer(x).double() * g.double()).sum().backward()
            return layer

        if case.layer_type is RowParallelLinear:  # the BF16 gradient gathered: its reference
            case.w_grad = wgrad_reference(case.g, case.x, recipe)
        for rank, layer in enumerate(sim.run(constant_input)):
            check_bound(f"rank {rank} weight.grad", layer.weight.grad, case.references(rank)["weight.grad"])


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("make_case", [column_case, row_case])
def test_sequence_dim_1_is_the_kernels_batch(groups, monkeypatch, p, make_case):
    """[b, s, h] sharded on s, 64 tokens of each of 2 sequences per rank: every launch takes the rows as they lie
    (batch 2); the output and the input's gradient equal those of the same tokens as [s, b, h] bit for bit (the
    same per-row products), the weight's gradient (its tokens summed in another order) within the bound of the
    reference."""
    case = make_case(p, RECIPES[0], seed=40 + p, rows_per_rank=128)
    sim = fp8_group(groups[p], monkeypatch)
    sequence_first = sim.run(lambda rank: case.step(groups[p], rank))

    def batch_first(rank):
        layer = case.layer(groups[p], rank, sequence_dim=1)
        x, g = case.inputs(rank)
        # [s, b, h] as x's rows (token t of sequence b is row 2 t + b); here [b, s, h]
        x = x.view(-1, 2, x.shape[-1]).transpose(0, 1).contiguous().requires_grad_()
        y = layer(x)
        (y.double() * g.view(-1, 2, g.shape[-1]).transpose(0, 1).double()).sum().backward()
        return y, x.grad, layer

    sim.problems.clear()
    sim.all_gather_problems.clear()
    results = sim.run(batch_first)
    assert [problem.batch for problem in sim.problems + sim.all_gather_problems] == [2] * (2 * p)
    for rank, ((y, x_grad, layer), (y0, x_grad0, _)) in enumerate(zip(results, sequence_first)):
        assert torch.equal(y.transpose(0, 1).reshape(y0.shape), y0)
        assert torch.equal(x_grad.transpose(0, 1).reshape(x_grad0.shape), x_grad0)
        check_bound(f"rank {rank} weight.grad", layer.weight.grad, case.references(rank)["weight.grad"])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
@pytest.mark.parametrize("make_case", [column_case, row_case])
def test_two_micro_batches_accumulate_into_main_grad_in_fp32(groups, monkeypatch, recipe, make_case):
    """Megatron's gradient_accumulation_fusion with its DDP's attributes: two forwards (one layer, two cases'
    inputs; the weight gradient's reference does not depend on the weight), then both backwards, add both weight
    gradients into the FP32 main_grad (starting at 0.25); the weight's own gradient is the dummy of zeros."""
    p = 2
    cases = [make_case(p, recipe, seed=50), make_case(p, recipe, seed=51)]
    sim = fp8_group(groups[p], monkeypatch)

    def step(rank):
        layer = cases[0].layer(groups[p], rank, gradient_accumulation_fusion=True)
        layer.weight.main_grad = torch.full(layer.weight.shape, 0.25)
        layer.weight.grad_added_to_main_grad, layer.weight.zero_out_wgrad = False, True
        inputs = [case.inputs(rank) for case in cases]
        ys = [layer(x.clone().requires_grad_()) for x, _ in inputs]  # both forwards before either backward
        for y, (_, g) in reversed(list(zip(ys, inputs))):
            (y.double() * g.double()).sum().backward()
        return layer

    for rank, layer in enumerate(sim.run(step)):
        assert layer.weight.main_grad.dtype == torch.float32
        assert layer.weight.grad_added_to_main_grad and torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
        first, second = (case.references(rank)["weight.grad"] for case in cases)
        check_bound(f"rank {rank} main_grad", layer.weight.main_grad.double() - 0.25,
                    (first[0] + second[0], first[1] + second[1]))


def count_weight_quantizations(monkeypatch) -> list:
    """A list that gains an entry at each of tpfuse.autograd's quantizations of a weight (per 128 x 128 block)."""
    calls, quantize = [], tpfuse.autograd.quantize_blockwise

    def counted(x, block=(1, 128), power_of_2=False):
        if tuple(block) == WEIGHT_BLOCK:
            calls.append(tuple(x.shape))
        return quantize(x, block, power_of_2)

    monkeypatch.setattr(tpfuse.autograd, "quantize_blockwise", counted)
    return calls


@pytest.mark.parametrize("make_case", [column_case, row_case])
def test_the_fp8_weight_is_kept_for_the_micro_batches_of_a_step(groups, monkeypatch, make_case):
    """forward(x, is_first_microbatch=True) quantizes the weight and False reuses it: one quantization a rank for
    three micro-batches, against three with None, and the same outputs and gradients bit for bit. After an in-place
    change of the weight (as an optimizer's step makes), False quantizes it again and uses the new values."""
    p = 2
    cases = [make_case(p, RECIPES[1], seed=70 + i) for i in range(3)]
    sim = fp8_group(groups[p], monkeypatch)
    quantizations = count_weight_quantizations(monkeypatch)

    def micro_batches(rank, flags, layer=None):
        layer = layer or cases[0].layer(groups[p], rank)
        results = []
        for case, flag in zip(cases, flags):
            x, g = case.inputs(rank)
            x = x.clone().requires_grad_()
            y = layer(x, is_first_microbatch=flag)
            (y.double() * g.double()).sum().backward()
            results.append((y, x.grad))
        return results, layer.weight.grad.clone(), layer

    each_call = sim.run(lambda rank: micro_batches(rank, [None] * 3))
    assert len(quantizations) == 3 * p
    quantizations.clear()
    kept = sim.run(lambda rank: micro_batches(rank, [True, False, False]))
    assert len(quantizations) == p
    for (results, w_grad, _), (results0, w_grad0, _) in zip(kept, each_call):
        assert all(torch.equal(a, b) for pair, pair0 in zip(results, results0) for a, b in zip(pair, pair0))
        assert torch.equal(w_grad, w_grad0)

    def after_a_step(rank):
        layer = kept[rank][2]
        with torch.no_grad():
            layer.weight.mul_(0.5)
        fresh = cases[0].layer(groups[p], rank)
        with torch.no_grad():
            fresh.weight.copy_(layer.weight)
        return micro_batches(rank, [False], layer)[0], micro_batches(rank, [None], fresh)[0]

    quantizations.clear()
    for ours, reference in sim.run(after_a_step):
        assert torch.equal(ours[0][0], reference[0][0]) and torch.equal(ours[0][1], reference[0][1])
    assert len(quantizations) == 2 * p


def test_micro_batch_flag_and_fp8_weight_errors(groups):
    group = groups[4]
    layer = RowParallelLinear(512, 256, group, fp8=RECIPES[0])
    with pytest.raises(tpfuse.InvalidArgumentError, match="is_first_microbatch = 1 must be None, True or False"):
        layer(torch.zeros(8, 128, dtype=BF16), is_first_microbatch=1)
    weight = torch.zeros(256, 128, dtype=BF16)
    fp8_weight = tpfuse.autograd.quantize_weight(weight, RECIPES[0])
    assert fp8_weight[0].dtype == torch.float8_e4m3fn and fp8_weight[1].shape == (2, 1)
    x = torch.zeros(8, 128, dtype=BF16)
    with pytest.raises(tpfuse.InvalidArgumentError, match="fp8_weight is given without fp8"):
        row_parallel_linear(x, weight, None, group, fp8_weight=fp8_weight)
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"fp8_weight must be \(w_fp8, w_scale\)"):
        row_parallel_linear(x, weight, None, group, fp8=RECIPES[0], fp8_weight=fp8_weight[0])
    wrong = [(fp8_weight[0][:128], fp8_weight[1]), (fp8_weight[0], fp8_weight[1].double()),
             (weight, fp8_weight[1]), (fp8_weight[0], fp8_weight[1][:1])]
    needs = (r"fp8_weight is \(.*\); the weight \(256, 128\) on cpu needs \(torch.float8_e4m3fn \(256, 128\), "
             r"torch.float32 \(2, 1\)\) there")
    for candidate in wrong:
        with pytest.raises(tpfuse.InvalidArgumentError, match=needs):
            row_parallel_linear(x, weight, None, group, fp8=RECIPES[0], fp8_weight=candidate)


def test_bf16_layers_take_the_micro_batch_flag(groups, monkeypatch):
    """is_first_microbatch on a layer without the recipe: accepted, nothing kept, the same output."""
    p = 2
    case = column_case(p, RECIPES[0], seed=80)
    sim = SimulatedGroup(groups[p], monkeypatch)

    def both(rank):
        layer = case.layer(groups[p], rank, fp8=None)
        x, _ = case.inputs(rank)
        return layer(x), layer(x, is_first_microbatch=True), layer(x, is_first_microbatch=False), layer

    for y, first, later, layer in sim.run(both):
        assert torch.equal(y, first) and torch.equal(y, later) and layer._fp8_weight is None


# --- the named errors ---

def test_recipe_and_shape_errors(groups):
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"wgrad = 'fp16' must be one of \('bf16', 'fp8'\)"):
        BlockwiseRecipe(wgrad="fp16")
    with pytest.raises(tpfuse.InvalidArgumentError, match="power_of_2_scales = 1 must be True or False"):
        BlockwiseRecipe(power_of_2_scales=1)
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"fp8 = 'blockwise' must be None \(BF16\) or a "
                                                          r"tpfuse.float8.BlockwiseRecipe"):
        ColumnParallelLinear(256, 512, groups[4], fp8="blockwise")
    recipe = BlockwiseRecipe()
    cases = [(ColumnParallelLinear, 200, 512, r"128 x 200 .* its 200 input features, the forward's reduction"),
             (ColumnParallelLinear, 256, 256, r"64 x 256 .* its 64 output features, the input gradient's reduction"),
             (RowParallelLinear, 256, 256, r"256 x 64 .* its 64 input features, the forward's reduction"),
             (RowParallelLinear, 512, 200, r"200 x 128 .* its 200 output features, the input gradient's reduction")]
    for layer_type, in_features, out_features, message in cases:
        name = f"{layer_type.__name__}\\(in_features={in_features}, out_features={out_features}\\) on 4 ranks"
        with pytest.raises(tpfuse.InvalidArgumentError, match=f"{name} with fp8=.* weight shard is {message}"):
            layer_type(in_features, out_features, groups[4], fp8=recipe)
    # The functional form checks at the call.
    with pytest.raises(tpfuse.InvalidArgumentError, match="not a multiple of 128"):
        column_parallel_linear(torch.zeros(4, 200, dtype=BF16), torch.zeros(128, 200, dtype=BF16), None, groups[4],
                               fp8=recipe)


def test_default_is_bf16_and_repr_names_the_recipe(groups):
    assert ColumnParallelLinear(256, 512, groups[4]).fp8 is None and RowParallelLinear(512, 256, groups[4]).fp8 is None
    assert ("fp8=BlockwiseRecipe(wgrad='fp8', power_of_2_scales=False)" in
            repr(RowParallelLinear(512, 256, groups[4], fp8=RECIPES[1])))


# --- torch.compile ---

def test_compile_traces_forward_and_backward_with_the_fp8_ops(groups):
    group = groups[4]
    column = ColumnParallelLinear(256, 1024, group, device="meta", fp8=RECIPES[1])
    row = RowParallelLinear(1024, 256, group, device="meta", fp8=RECIPES[1])
    graphs = GraphsOf()
    model = torch.compile(torch.nn.Sequential(column, torch.nn.GELU(), row), fullgraph=True, backend=graphs.backend)
    x = torch.empty(64, 2, 256, dtype=BF16, device="meta", requires_grad=True)
    y = model(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and column.weight.grad.shape == (256, 256) and row.weight.grad.shape == (256, 256)
    fp8_calls = [node for graph in graphs.forward + graphs.backward for node in graph.graph.nodes
                 if node.op == "call_function" and "tpfuse" in str(node.target)
                 and node.args[0].meta["val"].dtype == torch.float8_e4m3fn]
    assert len(fp8_calls) == 4


def test_compile_with_dynamic_shapes_traces_the_fp8_ops(groups):
    """dynamic=True, two sequence lengths through one graph: x's features are settled as the weight's before the
    autograd functions are traced (torch 2.11 failed to trace them where only the ops settled it)."""
    column = ColumnParallelLinear(256, 1024, groups[4], device="meta", fp8=RECIPES[0])
    row = RowParallelLinear(1024, 256, groups[4], device="meta", fp8=RECIPES[0])
    graphs = GraphsOf()
    model = torch.compile(torch.nn.Sequential(column, torch.nn.GELU(), row), fullgraph=True, backend=graphs.backend,
                          dynamic=True)
    for tokens in (64, 96):
        x = torch.empty(tokens, 2, 256, dtype=BF16, device="meta", requires_grad=True)
        y = model(x)
        y.sum().backward()
        assert y.shape == x.shape and x.grad.shape == x.shape
    assert len(graphs.forward) == 1


def test_compiled_micro_batches_quantize_the_weight_on_the_first_only(groups, monkeypatch):
    """fullgraph compiled with is_first_microbatch: True's graph quantizes the weight (once, as traced), False's
    uses the kept one (no quantization in its graph; compiled, no version check)."""
    quantizations = count_weight_quantizations(monkeypatch)
    column = ColumnParallelLinear(256, 1024, groups[4], device="meta", fp8=RECIPES[0])
    compiled = torch.compile(lambda x, first: column(x, is_first_microbatch=first), fullgraph=True, backend="eager")
    x = torch.empty(64, 256, dtype=BF16, device="meta", requires_grad=True)
    for first in (True, False, False):
        compiled(x, first).sum().backward()
        assert len(quantizations) == 1, (first, quantizations)
    assert column._fp8_weight[0].dtype == torch.float8_e4m3fn


# --- the FP8 weight gradient alone ---

def test_blockwise_weight_grad_is_the_product_of_the_token_blocks():
    """Against float64 of the operands quantized per 128 tokens and dequantized (300 tokens: two whole blocks and a
    partial one), FP32 out; and not the unquantized product."""
    generator = torch.Generator().manual_seed(60)
    grad, operand = draws(300, 48, generator=generator), draws(300, 64, generator=generator)
    ours = blockwise_weight_grad(grad, operand)
    assert ours.dtype == torch.float32 and ours.shape == (48, 64)
    reference = wgrad_reference(grad, operand, RECIPES[1])
    check_bound("blockwise_weight_grad", ours, reference)
    # FP32 sums only: far inside the bound
    assert ((ours.double() - reference[0]).abs() <= 2 ** -20 * reference[1]).all()
    with pytest.raises(AssertionError, match="past the bound"):
        check_bound("the unquantized product", grad.double().t() @ operand.double(), reference)

