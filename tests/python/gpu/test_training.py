"""Training on GPUs, at any world size (torchrun --nproc-per-node=N, or alone as a group of one): a two-layer
TP + SP MLP step (ColumnParallelLinear, GELU, RowParallelLinear) eager (activations [s, b, h] sharded on s,
and [b, s, h] sharded on s), compiled and CUDA-graphed, its output and every gradient against the unfused
path (all_gather / reduce_scatter of torch's functional collectives + torch.mm, with autograd; compiled too
where tpfuse's is) by docs/SPEC.md's 1.1x rule, bit-identical reruns, tpfuse's kernels in forward and
backward (profiler), and the symm_mem override running tpfuse under torch.compile's async-TP pass. Each layer
with a bias within the rule of nn.Linear's error against an FP64 reference; sequence_dim=1 against
sequence_dim=0 on the same rows. The blockwise FP8 recipe: a few training steps, their losses close to the BF16
layers'."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import tpfuse
from tpfuse import _checks
from tpfuse.checking import Errors, errors
from tpfuse.float8 import BlockwiseRecipe
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear, allreduce_sequence_parallel_grads

BF16 = torch.bfloat16
ROWS_PER_RANK, BATCH, D, H = 128, 2, 512, 2048  # tokens (S/P, B) per rank, model width, hidden width
SEQUENCE_DIMS = [0, 1]  # Megatron's [s, b, h], and [b, s, h] (TorchTitan's), sharded on s


def full_mlp(device, seed=0):
    """The whole MLP and its inputs, the same on every rank (one seed)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    fc1 = torch.nn.Linear(D, H, device=device, dtype=BF16)
    fc2 = torch.nn.Linear(H, D, device=device, dtype=BF16)
    with torch.no_grad():
        for parameter in (*fc1.parameters(), *fc2.parameters()):
            scale = parameter.shape[-1] ** -0.5
            parameter.copy_(torch.randn(parameter.shape, generator=generator, device=device) * scale)
    return fc1, fc2, generator


class Step:
    """One rank's inputs: x (its tokens of the sequence, dim sequence_dim) and the upstream gradient of its
    output's tokens."""

    def __init__(self, group, device, seed=0, sequence_dim=0):
        self.group, self.p, self.rank, self.sequence_dim = group, group.size(), group.rank(), sequence_dim
        self.fc1, self.fc2, generator = full_mlp(device, seed)
        shape = [ROWS_PER_RANK * self.p, BATCH, D] if sequence_dim == 0 else [BATCH, ROWS_PER_RANK * self.p, D]
        self.x_full = torch.randn(shape, generator=generator, device=device).to(BF16)
        self.g_full = torch.randn(shape, generator=generator, device=device).to(BF16)
        self.x = self.shard(self.x_full).contiguous()
        self.g = self.shard(self.g_full)

    def shard(self, tensor):
        return tensor.chunk(self.p, dim=self.sequence_dim)[self.rank]

    def run(self, forward, params):
        """(loss, y, x.grad, [grads of params]) of forward(x) with loss = sum(y * g) over every rank."""
        for parameter in params:
            parameter.grad = None
        x = self.x.clone().requires_grad_()
        y = forward(x)
        loss = (y.float() * self.g.float()).sum()
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=self.group)
        # Copies: a CUDA graph's outputs are overwritten by its next replay.
        return total, y.detach().clone(), x.grad.clone(), [parameter.grad.clone() for parameter in params]

    def reference(self):
        """FP32 on the whole batch, from the same BF16 values: y, x.grad, and the full parameters' gradients."""
        fc1, fc2 = (torch.nn.Linear(full.in_features, full.out_features, device=full.weight.device)
                    for full in (self.fc1, self.fc2))
        with torch.no_grad():
            for full, ref in ((self.fc1, fc1), (self.fc2, fc2)):
                ref.weight.copy_(full.weight.float())
                ref.bias.copy_(full.bias.float())
        x = self.x_full.float().requires_grad_()
        y = fc2(torch.nn.functional.gelu(fc1(x)))
        loss = (y * self.g_full.float()).sum()
        loss.backward()
        return loss.detach(), y.detach(), x.grad, fc1, fc2


def unfused_layers(step):
    """The same TP layers from torch's differentiable functional collectives and torch.mm: the unfused path."""
    group, rank, p, sequence_dim = step.group, step.rank, step.p, step.sequence_dim
    w1, b1 = (t.detach().chunk(p)[rank].clone().requires_grad_() for t in (step.fc1.weight, step.fc1.bias))
    w2 = step.fc2.weight.detach().chunk(p, dim=1)[rank].clone().requires_grad_()
    b2 = step.fc2.bias.detach().clone().requires_grad_()

    def forward(x):
        X = funcol.all_gather_tensor_autograd(x, sequence_dim, group)
        h = torch.nn.functional.gelu(X @ w1.t() + b1)
        return funcol.reduce_scatter_tensor_autograd(h @ w2.t(), "sum", sequence_dim, group) + b2

    return forward, [w1, b1, w2, b2]


def tpfuse_layers(step, **options):
    column = ColumnParallelLinear.from_linear(step.fc1, step.group, sequence_dim=step.sequence_dim, **options)
    row = RowParallelLinear.from_linear(step.fc2, step.group, sequence_dim=step.sequence_dim)
    return torch.nn.Sequential(column, torch.nn.GELU(), row), [column.weight, column.bias, row.weight, row.bias]


def references_of(step):
    """Per quantity this rank checks: its part of the FP32 reference."""
    loss, y, x_grad, fc1, fc2 = step.reference()
    p, rank = step.p, step.rank
    return [loss, step.shard(y), step.shard(x_grad), fc1.weight.grad.chunk(p)[rank], fc1.bias.grad.chunk(p)[rank],
            fc2.weight.grad.chunk(p, dim=1)[rank], fc2.bias.grad]


def results_of(step, result):
    loss, y, x_grad, (w1, b1, w2, b2) = result
    b2 = b2.clone()
    dist.all_reduce(b2, group=step.group)  # each rank has its rows' part of the row layer's bias gradient
    return [loss, y, x_grad, w1, b1, w2, b2]


NAMES = ["loss", "y", "x.grad", "column.weight.grad", "column.bias.grad", "row.weight.grad", "row.bias.grad"]


def check_loss_is_the_outputs(step, result):
    """The loss is sum(y * g) of the returned y, up to FP32 summation (relative to sum |y * g|). The scalar
    loss is not held to the rule: a sum of products that cancel, its two paths' relative errors are two
    small random numbers (one of them may lie near zero by chance); the rule holds on y, whose error is the
    loss's."""
    loss, y = result[0], result[1]
    products = y.double() * step.g.double().reshape(y.shape)
    sums = torch.stack([products.sum(), products.abs().sum()])
    dist.all_reduce(sums, group=step.group)
    assert abs(loss.double() - sums[0]) <= 1e-5 * sums[1], f"loss {loss.item()} is not sum(y * g) = {sums[0].item()}"


def check_within_the_rule(step, fused, *unfused_runs):
    """Each quantity's errors within the rule of the unfused path's; given several unfused runs, of the
    largest of their errors. The loss: check_loss_is_the_outputs."""
    check_loss_is_the_outputs(step, fused)
    references = references_of(step)
    unfused_results = [results_of(step, run) for run in unfused_runs]
    for index, (name, ours, reference) in enumerate(zip(NAMES, results_of(step, fused), references)):
        if name == "loss":
            continue
        reference = reference.float().reshape(ours.shape)
        fused_errors = errors(ours, reference, step.group)
        baselines = [errors(results[index], reference, step.group) for results in unfused_results]
        baseline = Errors(max(e.max_rel for e in baselines), max(e.norm_rel for e in baselines),
                          max(e.nonfinite for e in baselines))
        assert fused_errors.within(baseline), f"{name}: fused {fused_errors} against unfused {baselines}"


@pytest.mark.parametrize("sequence_dim", SEQUENCE_DIMS)
@pytest.mark.parametrize("save_gathered_input", [True, False])
def test_mlp_step_eager_within_the_rule_and_bit_identical(group, device, save_gathered_input, sequence_dim):
    step = Step(group, device, sequence_dim=sequence_dim)
    model, params = tpfuse_layers(step, save_gathered_input=save_gathered_input)
    fused = step.run(model, params)
    check_within_the_rule(step, fused, step.run(*unfused_layers(step)))
    for _ in range(2):
        again = step.run(model, params)
        for name, first, second in zip(NAMES, results_of(step, fused), results_of(step, again)):
            assert torch.equal(first, second), f"{name} differs on a rerun"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_mlp_step_compiled_within_the_rule(group, device, mode):
    step = Step(group, device, seed=1)
    model, params = tpfuse_layers(step)
    eager = step.run(model, params)  # sizes the communicator's buffers before any capture
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    results = [step.run(compiled, params) for _ in range(3)]  # reduce-overhead: warm-up, then graph replays
    # Against the unfused path both eager and compiled the same way, the larger error counting: Inductor's
    # rounding moves the loss of both paths alike, and, in the unfused graph only, sums the column layer's
    # bias gradient from FP32 values, where tpfuse's op boundary (its kernels take BF16) rounds them first.
    unfused, unfused_params = unfused_layers(step)
    eager_unfused = step.run(unfused, unfused_params)
    unfused = torch.compile(unfused, fullgraph=True, mode=mode)
    check_within_the_rule(step, results[-1], eager_unfused, [step.run(unfused, unfused_params) for _ in range(3)][-1])
    for name, first, last in zip(NAMES, results_of(step, results[0]), results_of(step, results[-1])):
        assert torch.equal(first, last), f"compiled: {name} differs on a rerun"
    del eager


def test_mlp_step_in_cuda_graphs(group, device):
    step = Step(group, device, seed=2)
    model, params = tpfuse_layers(step)
    eager = results_of(step, step.run(model, params))
    x = step.x.clone().requires_grad_()
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    replayed = step.run(graphed, params)
    for name, ours, theirs in zip(NAMES, results_of(step, replayed), eager):
        assert torch.equal(ours, theirs), f"CUDA graph replay: {name} differs from eager"
    check_within_the_rule(step, replayed, step.run(*unfused_layers(step)))


def tpfuse_kernels(profile):
    return sorted({event.name for event in profile.events()
                   if event.device_type == torch.autograd.DeviceType.CUDA and "tpfuse" in event.name})


def has_both_fused_kernels(kernels):
    """tpfuse's all-gather + GEMM (tpfuse::kernels::all_gather_kernel) and GEMM + reduce-scatter (gemm_rs_kernel)."""
    return any("all_gather" in name for name in kernels) and any("gemm_rs" in name for name in kernels)


def test_profiler_shows_tpfuse_kernels_in_forward_and_backward(group, device):
    step = Step(group, device, seed=3)
    model, params = tpfuse_layers(step)
    step.run(model, params)  # warm-up: communicators made
    activities = [torch.profiler.ProfilerActivity.CUDA]
    x = step.x.clone().requires_grad_()
    with torch.profiler.profile(activities=activities) as forward:
        y = model(x)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as backward:
        (y.float() * step.g.float()).sum().backward()
        torch.cuda.synchronize()
    for phase, kernels in (("forward", tpfuse_kernels(forward)), ("backward", tpfuse_kernels(backward))):
        assert has_both_fused_kernels(kernels), f"{phase}: {kernels}"


def test_symm_mem_override_runs_tpfuse_under_async_tp(group, device):
    """TorchTitan's path: Inductor's micro-pipeline TP pass makes symm_mem ops; with the override they run
    tpfuse's kernels, and the result is within the rule of the unfused computation."""
    import torch.distributed._symmetric_memory as symmetric_memory

    symmetric_memory.enable_symm_mem_for_group(group.group_name)
    step = Step(group, device, seed=4)
    p, rank = step.p, step.rank
    w1 = step.fc1.weight.detach().chunk(p)[rank].contiguous()
    w2 = step.fc2.weight.detach().chunk(p, dim=1)[rank].contiguous()

    def mlp(x):
        X = funcol.all_gather_tensor(x, 0, group)
        return funcol.reduce_scatter_tensor(torch.relu(X @ w1.t()) @ w2.t(), "sum", 0, group)

    x = step.x.view(-1, D)
    unfused = mlp(x)
    torch._dynamo.reset()
    # Inductor's config.patch: monkeypatch.setattr's undo deletes the option from the config module.
    with tpfuse.use_for_symm_mem(), torch._inductor.config.patch(_micro_pipeline_tp=True):
        compiled = torch.compile(mlp, fullgraph=True)
        compiled(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            out = compiled(x)
            torch.cuda.synchronize()
    torch._dynamo.reset()
    kernels = tpfuse_kernels(profile)
    assert has_both_fused_kernels(kernels), kernels
    X = torch.cat([t.float() for t in step.x_full.view(-1, D).chunk(p)])
    reference = torch.relu(X @ w1.float().t()) @ w2.float().t()  # this rank's partial, summed over the ranks
    dist.all_reduce(reference, group=group)
    reference = reference.chunk(p)[rank]
    assert errors(out, reference, group).within(errors(unfused, reference, group))


def test_multi_gpu_regathered_input_and_rank_order(multi_gpu, device):
    """At 2 or more ranks: every rank's output rows are its own shard's (rank order), with the input gathered
    again in backward."""
    step = Step(multi_gpu, device, seed=5)
    model, params = tpfuse_layers(step, save_gathered_input=False)
    check_within_the_rule(step, step.run(model, params), step.run(*unfused_layers(step)))


@pytest.mark.parametrize("layer_type", [ColumnParallelLinear, RowParallelLinear])
def test_layer_with_bias_within_the_rule_of_nn_linear(group, device, layer_type, record_property):
    """The bias is added inside the kernel, before the output's one rounding, as nn.Linear's cuBLAS adds it
    in its epilogue: the layer's error against an FP64 reference within the rule of nn.Linear's (BF16, the
    whole layer on one GPU) on the same entries. A bias as large as the product shows a second rounding.
    The errors go into the JUnit record, with those of the op's output plus the bias added after it (the
    layers' way before the bias was in the kernel), for the docs."""
    p, rank = group.size(), group.rank()
    generator = torch.Generator(device=device).manual_seed(6)
    full = torch.nn.Linear(D, H, device=device, dtype=BF16) if layer_type is ColumnParallelLinear \
        else torch.nn.Linear(H, D, device=device, dtype=BF16)
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=generator, device=device) * full.in_features ** -0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=generator, device=device))
    x_full = torch.randn(ROWS_PER_RANK * p, BATCH, full.in_features, generator=generator, device=device).to(BF16)
    reference = torch.nn.functional.linear(x_full.double(), full.weight.double(), full.bias.double())
    linear = full(x_full)
    layer = layer_type.from_linear(full, group)
    if layer_type is ColumnParallelLinear:  # this rank's tokens in, its output features of every token out
        x = x_full.chunk(p)[rank].contiguous()
        out = layer(x)
        after_op = torch.ops.tpfuse.all_gather_gemm(x.view(-1, D), layer.weight, "nk", group.group_name) + layer.bias
        part = slice(rank * (H // p), (rank + 1) * (H // p))
        reference, linear = reference[..., part], linear[..., part]
    else:  # its input features in, its tokens out
        x = x_full.chunk(p, dim=-1)[rank].contiguous()
        out = layer(x)
        after_op = torch.ops.tpfuse.gemm_reduce_scatter(x.view(-1, H // p), layer.weight, "nk", group.group_name) \
            + layer.bias
        reference, linear = reference.chunk(p)[rank], linear.chunk(p)[rank]
    fused, baseline = errors(out, reference, group), errors(linear, reference, group)
    for name, measured in (("fused", fused), ("nn_linear", baseline),
                           ("bias_after_op", errors(after_op.view(out.shape), reference, group))):
        record_property(f"{name}_max_rel", measured.max_rel)
        record_property(f"{name}_norm_rel", measured.norm_rel)
    assert fused.within(baseline), f"{layer_type.__name__}: {fused} against nn.Linear's {baseline}"


@pytest.mark.parametrize("layer_type", [ColumnParallelLinear, RowParallelLinear])
def test_sequence_dim_1_against_sequence_dim_0_on_the_same_rows(group, device, layer_type):
    """[b, s, h] sharded on s (sequence_dim=1, the kernels' batch) against the same tokens as [s, b, h]
    (sequence_dim=0): bit for bit at world size 1 (the same call on rows in another order), within the rule
    of it at more ranks; and both within the rule of torch's computation rounded once (nn.Linear's), each
    against an FP64 reference."""
    p = group.size()
    generator = torch.Generator(device=device).manual_seed(7)
    full = torch.nn.Linear(D, H, device=device, dtype=BF16) if layer_type is ColumnParallelLinear \
        else torch.nn.Linear(H, D, device=device, dtype=BF16)
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=generator, device=device) * full.in_features ** -0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=generator, device=device))
    tokens = ROWS_PER_RANK * (1 if layer_type is ColumnParallelLinear else p)
    features = full.in_features if layer_type is ColumnParallelLinear else full.in_features // p
    x_generator = torch.Generator(device=device).manual_seed(70 + group.rank())  # this rank's part differs
    x = torch.randn(BATCH, tokens, features, generator=x_generator, device=device).to(BF16)  # [b, s, h]
    by_sequence_layer = layer_type.from_linear(full, group, sequence_dim=0)
    by_batch = layer_type.from_linear(full, group, sequence_dim=1)(x)
    by_sequence = by_sequence_layer(x.transpose(0, 1).contiguous()).transpose(0, 1)
    assert by_batch.shape == by_sequence.shape

    weight, bias = by_sequence_layer.weight, by_sequence_layer.bias
    if layer_type is ColumnParallelLinear:  # torch's all-gather on dim 1, then nn.Linear's GEMM
        X = funcol.all_gather_tensor(x, 1, group)
        reference = torch.nn.functional.linear(X.double(), weight.double(), bias.double())
        linear = torch.nn.functional.linear(X, weight, bias)
    else:  # torch's reduce-scatter on dim 1 of the partials, in FP64 and in FP32 rounded once
        reference = funcol.reduce_scatter_tensor(torch.nn.functional.linear(x.double(), weight.double()), "sum", 1,
                                                 group) + bias.double()
        linear = (funcol.reduce_scatter_tensor(torch.nn.functional.linear(x.float(), weight.float()), "sum", 1,
                                               group) + bias.float()).to(BF16)
    baseline = errors(linear, reference, group)
    for name, out in (("sequence_dim=1", by_batch), ("sequence_dim=0", by_sequence)):
        assert errors(out, reference, group).within(baseline), f"{name}: {errors(out, reference, group)} against " \
                                                               f"torch's {baseline}"
    if p == 1:
        assert torch.equal(by_batch, by_sequence)
    else:
        assert errors(by_batch, reference, group).within(errors(by_sequence, reference, group))


# --- the blockwise FP8 recipe (tpfuse.float8.BlockwiseRecipe) ---

FP8_STEPS = 5
FP8_RECIPES = [BlockwiseRecipe(), BlockwiseRecipe(wgrad="fp8")]


def training_losses(group, device, fp8, sequence_dim=0, save_gathered_input=True, micro_batches=1):
    """Each step's loss (mean squared error, every rank's tokens) of FP8_STEPS AdamW steps of the MLP (column,
    GELU, row) on tpfuse's layers, with the recipe fp8 or in BF16 (None), from the same weights and data. With
    micro_batches = 2 (sequence_dim 0), each step's sequences go in two micro-batches whose gradients add up, the
    layers told which is first (is_first_microbatch: the FP8 weight quantized once a step)."""
    p, rank = group.size(), group.rank()
    fc1, fc2, generator = full_mlp(device, seed=8)
    model = torch.nn.Sequential(
        ColumnParallelLinear.from_linear(fc1, group, sequence_dim=sequence_dim, fp8=fp8,
                                         save_gathered_input=save_gathered_input),
        torch.nn.GELU(), RowParallelLinear.from_linear(fc2, group, sequence_dim=sequence_dim, fp8=fp8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    shape = (FP8_STEPS, ROWS_PER_RANK * p, BATCH, D)  # [s, b, h] per step; this rank's tokens below
    inputs, targets = (torch.randn(shape, generator=generator, device=device).chunk(p, dim=1)[rank] for _ in range(2))
    if sequence_dim == 1:
        inputs, targets = inputs.transpose(1, 2), targets.transpose(1, 2)
    losses = []
    for x, target in zip(inputs.to(BF16), targets):
        optimizer.zero_grad(set_to_none=True)
        loss = 0
        for i, (x_micro, target_micro) in enumerate(zip(x.chunk(micro_batches, 1), target.chunk(micro_batches, 1))):
            first = None if micro_batches == 1 else i == 0
            hidden = model[1](model[0](x_micro.contiguous(), is_first_microbatch=first))
            micro_loss = torch.nn.functional.mse_loss(model[2](hidden, is_first_microbatch=first).float(),
                                                      target_micro, reduction="sum")
            micro_loss.backward()
            loss = loss + micro_loss
        allreduce_sequence_parallel_grads(model, group)
        optimizer.step()
        total = loss.detach()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / (math.prod(shape[1:])))
    return losses


def check_losses_close(fp8_losses, bf16_losses):
    """Within 1% of BF16's at every step (the recipe's quantization moves the output by a few percent of its own
    size, and the loss, of outputs against unit-variance targets, by much less), training (the last loss below
    the first), and not BF16's (the recipe ran)."""
    for step, (ours, theirs) in enumerate(zip(fp8_losses, bf16_losses)):
        assert abs(ours - theirs) <= 0.01 * theirs, f"step {step}: FP8 {fp8_losses} against BF16 {bf16_losses}"
    assert fp8_losses[-1] < fp8_losses[0] and fp8_losses != bf16_losses, f"FP8 {fp8_losses}, BF16 {bf16_losses}"


@pytest.mark.parametrize("recipe", FP8_RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
def test_fp8_blockwise_training_losses_close_to_bf16(group, device, recipe):
    check_losses_close(training_losses(group, device, recipe), training_losses(group, device, None))


def test_fp8_power_of_2_scales_in_two_micro_batches(group, device):
    """power_of_2_scales, each step in two micro-batches with the weight quantized on the first only: close to BF16
    in the same micro-batches."""
    recipe = BlockwiseRecipe(wgrad="fp8", power_of_2_scales=True)
    check_losses_close(training_losses(group, device, recipe, micro_batches=2),
                       training_losses(group, device, None, micro_batches=2))


@pytest.mark.parametrize("recipe", FP8_RECIPES, ids=lambda recipe: f"wgrad_{recipe.wgrad}")
def test_multi_gpu_fp8_blockwise_regathered_input_on_b_s_h(multi_gpu, device, recipe):
    """At 2 or more ranks: [b, s, h] sharded on s (the kernels' batch), the column layer's FP8 input gathered
    again in backward with its scales."""
    check_losses_close(training_losses(multi_gpu, device, recipe, sequence_dim=1, save_gathered_input=False),
                       training_losses(multi_gpu, device, None, sequence_dim=1, save_gathered_input=False))
