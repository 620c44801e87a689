"""tpfuse.nn's layers on the simulated group (simulated_group.py) at P = 2, 4 and 8: [b, s, h] activations
sharded on s (sequence_dim=1), served by the kernels' batch or, where they cannot, by a sequence-major copy;
Megatron's conventions: a pipeline-shaped step (two micro-batches forward, then both backward) accumulating
into main_grad, the FP32 weight gradient with and without torch.mm's out_dtype, the parameters'
tensor-parallel attributes, init_method and the RNG tracker, skip_bias_add, the named error of a sequence
that does not divide; and SwiGLU's gate and up costing one reduce-scatter in backward.

Exactness as in test_autograd.py: small-integer entries, every reference value an integer of at most 256,
so BF16 results equal the float64 reference exactly."""

import contextlib
import logging

import pytest
import torch

import tpfuse
from tpfuse import _ops, autograd as tpfuse_autograd
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear
from simulated_group import SimulatedGroup
from test_autograd import BF16, SIZES, GraphsOf, MlpCase, exact, small_integers

TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


# --- [b, s, h] sharded on s: sequence_dim=1 ---

class BatchFirstMlpCase(MlpCase):
    """MlpCase's MLP on [b, s, h] activations sharded on s (dim 1). The upstream gradient is on about one token
    in 8, so that the weights' and biases' gradients, sums over every token, stay exact in BF16."""

    @staticmethod
    def activations(tokens, batch, d, generator):
        x = small_integers(batch, tokens, d, generator=generator)
        on = torch.rand(batch, tokens, 1, generator=generator) < 0.125
        return x, small_integers(batch, tokens, d, generator=generator) * on

    def shard(self, tensor, rank):
        rows = tensor.shape[1] // self.p
        return tensor[:, rank * rows:(rank + 1) * rows]


def record_batches(monkeypatch):
    """The batch of every simulated launch (after SimulatedGroup has replaced the launches)."""
    batches = []
    for name in ("_launch", "_launch_all_gather"):
        launch = getattr(_ops, name)

        def recording(*args, launch=launch, **scales):
            batches.append(args[-2].batch)  # (..., problem, group_name), the reduce-scatter's scales by name
            return launch(*args, **scales)

        monkeypatch.setattr(_ops, name, recording)
    return batches


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("save_gathered_input", [True, False])
def test_sequence_dim_1_is_the_kernels_batch(groups, monkeypatch, caplog, p, save_gathered_input):
    """64 tokens of each of 2 sequences per rank (whole slabs): every launch, forward and backward, takes the
    rows as they lie with batch 2, and the MLP equals one device's."""
    case = BatchFirstMlpCase(p, seed=70 + p, rows_per_rank=64)
    sim = SimulatedGroup(groups[p], monkeypatch)
    batches = record_batches(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tpfuse.autograd"):
        results = sim.run(lambda rank: case.step(groups[p], rank, sequence_dim=1,
                                                 save_gathered_input=save_gathered_input))
    assert case.mismatches(results) == []
    assert batches == [2] * (4 * p) and caplog.records == []
    assert results[0][0].shape == (2, 64, case.d)


@pytest.mark.parametrize("p", SIZES)
def test_sequence_dim_1_off_the_slabs_runs_sequence_major_and_says_so_once(groups, monkeypatch, caplog, p):
    """2 tokens of each sequence per rank, which the kernels do not serve with several sequences: the layers
    run on a sequence-major copy (batch 1), exactly, and log it once per layer kind."""
    case = BatchFirstMlpCase(p, seed=80 + p)
    sim = SimulatedGroup(groups[p], monkeypatch)
    batches = record_batches(monkeypatch)
    monkeypatch.setattr(tpfuse_autograd, "_logged_fallbacks", set())
    with caplog.at_level(logging.WARNING, logger="tpfuse.autograd"):
        for _ in range(2):
            results = sim.run(lambda rank: case.step(groups[p], rank, sequence_dim=1))
            assert case.mismatches(results) == []
    assert batches == [1] * (2 * 4 * p)
    assert sorted(record.getMessage().split(":")[0] for record in caplog.records) == \
        ["ColumnParallelLinear", "RowParallelLinear"]
    assert "not a multiple of 64" in caplog.records[0].getMessage()


@pytest.mark.parametrize("tokens, batch", [(64, 2), (2, 1)])
def test_sequence_dim_1_compiles_without_a_graph_break(groups, tokens, batch):
    """Forward and backward graphs hold the fused ops with the kernels' batch, or, off the slabs, the
    sequence-major path (whose log is left out under torch.compile)."""
    group = groups[4]
    column = ColumnParallelLinear(64, 256, group, device="meta", sequence_dim=1)
    row = RowParallelLinear(256, 64, group, device="meta", sequence_dim=1)
    graphs = GraphsOf()
    model = torch.compile(torch.nn.Sequential(column, torch.nn.GELU(), row), fullgraph=True, backend=graphs.backend)
    x = torch.empty(2, tokens, 64, dtype=BF16, device="meta", requires_grad=True)
    y = model(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    ops = [node for graph in graphs.forward + graphs.backward for node in graph.graph.nodes
           if node.op == "call_function" and "tpfuse" in str(node.target)]
    # (x, w, weight_layout, group_name, bias, batch): the graph leaves out trailing defaults
    assert len(ops) == 4 and {node.args[5] if len(node.args) > 5 else 1 for node in ops} == {batch}


def test_sequence_dim_errors(groups):
    column = ColumnParallelLinear(16, 64, groups[4], sequence_dim=2)
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"sequence_dim = 2 is not a dimension of x \(4, 16\)"):
        column(torch.zeros(4, 16, dtype=BF16))
    row = RowParallelLinear(32, 16, groups[4], sequence_dim=1)
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"sequence \(dim 1\) of 6 tokens does not divide"):
        row(torch.zeros(2, 6, 8, dtype=BF16))


def test_features_errors(groups):
    """x's features against the weight shard's input features, named before any op runs."""
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"x \(4, 2, 24\) has 24 features and the weight shard "
                                                          r"\(16, 16\) .* takes 16"):
        ColumnParallelLinear(16, 64, groups[4])(torch.zeros(4, 2, 24, dtype=BF16))
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"x \(8, 32\) has 32 features and the weight shard "
                                                          r"\(16, 8\) .* takes 8"):
        RowParallelLinear(32, 16, groups[4])(torch.zeros(8, 32, dtype=BF16))


# --- main_grad: two micro-batches forward, then both backward (a pipeline's 1F1B warm-up) ---

class MicroBatches:
    """MlpCase's float64 MLP on two micro-batches: their outputs and input gradients, and the parameters'
    gradients summed over both, as one device's autograd accumulates them."""

    def __init__(self, p, seed):
        self.case = MlpCase(p, seed)
        generator = torch.Generator().manual_seed(seed + 100)
        shape = self.case.x.shape
        self.inputs = [(self.case.x, self.case.g),
                       (small_integers(*shape, generator=generator), small_integers(*shape, generator=generator))]
        fc1, fc2 = self.case.fc1, self.case.fc2
        for parameter in (*fc1.parameters(), *fc2.parameters()):
            parameter.grad = None
        self.ys, self.x_grads = [], []
        for x, g in self.inputs:
            x = x.clone().requires_grad_()
            y = fc2(torch.relu(fc1(x)))
            (y * g).sum().backward()
            self.ys.append(exact(y.detach()))
            self.x_grads.append(exact(x.grad))
        for parameter in (*fc1.parameters(), *fc2.parameters()):
            exact(parameter.grad)


def megatron_ddp_weights(layers):
    """main_grad buffers (FP32, starting at 0.25: accumulated onto) and Megatron's DDP attributes."""
    for layer in layers:
        layer.weight.main_grad = torch.full(layer.weight.shape, 0.25)
        layer.weight.grad_added_to_main_grad = False
        layer.weight.zero_out_wgrad = True


@pytest.mark.parametrize("p", SIZES)
def test_two_micro_batches_forward_then_backward_accumulate_into_main_grad(groups, monkeypatch, p):
    steps = MicroBatches(p, seed=20 + p)
    case = steps.case
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        column, row = case.layers(groups[p], rank, gradient_accumulation_fusion=True)
        megatron_ddp_weights((column, row))
        xs = [case.shard(x, rank).to(BF16).requires_grad_() for x, _ in steps.inputs]
        ys = [row(torch.relu(column(x))) for x in xs]  # both forwards before either backward
        for y, (_, g) in reversed(list(zip(ys, steps.inputs))):
            (y.double() * case.shard(g, rank)).sum().backward()
        return ys, [x.grad for x in xs], column, row

    h = case.h // p
    bias_grad_sum = torch.zeros_like(case.fc2.bias.grad)
    for rank, (ys, x_grads, column, row) in enumerate(sim.run(step)):
        for micro_batch in range(2):
            assert torch.equal(ys[micro_batch].double(), case.shard(steps.ys[micro_batch], rank))
            assert torch.equal(x_grads[micro_batch].double(), case.shard(steps.x_grads[micro_batch], rank))
        assert torch.equal(column.weight.main_grad.double() - 0.25, case.fc1.weight.grad[rank * h:(rank + 1) * h])
        assert torch.equal(row.weight.main_grad.double() - 0.25, case.fc2.weight.grad[:, rank * h:(rank + 1) * h])
        assert torch.equal(column.bias.grad.double(), case.fc1.bias.grad[rank * h:(rank + 1) * h])
        for weight in (column.weight, row.weight):
            assert weight.grad_added_to_main_grad and torch.equal(weight.grad, torch.zeros_like(weight))
        bias_grad_sum += row.bias.grad.double()
    assert torch.equal(bias_grad_sum, case.fc2.bias.grad)


@pytest.mark.xfail(TORCH_VERSION < (2, 8), strict=True, raises=RuntimeError,
                   reason="torch 2.7's compiled autograd.Function saves a tensor kept on its context for backward, "
                          "with save_for_backward's version check (seen at 2.7; 2.15 passes)")
def test_two_compiled_forwards_then_backwards_accumulate_into_main_grad(groups, monkeypatch):
    steps = MicroBatches(1, seed=30)
    case = steps.case
    sim = SimulatedGroup(groups[1], monkeypatch)
    torch._dynamo.reset()

    def step(rank):
        column, row = case.layers(groups[1], rank, gradient_accumulation_fusion=True)
        for layer in (column, row):
            layer.weight.main_grad = torch.zeros(layer.weight.shape)
        model = torch.compile(torch.nn.Sequential(column, torch.nn.ReLU(), row), fullgraph=True, backend="aot_eager")
        ys = [model(x.to(BF16)) for x, _ in steps.inputs]
        for y, (_, g) in reversed(list(zip(ys, steps.inputs))):
            (y.double() * g).sum().backward()
        return column, row

    [(column, row)] = sim.run(step)
    assert torch.equal(column.weight.main_grad.double(), case.fc1.weight.grad)
    assert torch.equal(row.weight.main_grad.double(), case.fc2.weight.grad)


# --- the FP32 weight gradient: torch.mm(out_dtype=) from torch 2.8, FP32 copies before ---

def fp32_product_calls(monkeypatch):
    """fp32_product on fake CUDA tensors (no GPU needed), recording each torch.mm call's operand dtypes and
    keyword arguments."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    calls, mm = [], torch.mm

    def recording_mm(a, b, **kwargs):
        calls.append((a.dtype, b.dtype, kwargs))
        return mm(a, b, **kwargs)

    monkeypatch.setattr(torch, "mm", recording_mm)
    with FakeTensorMode():
        a = torch.empty(16, 8, dtype=BF16, device="cuda")
        b = torch.empty(8, 24, dtype=BF16, device="cuda")
        product = tpfuse_autograd.fp32_product(a, b)
        assert product.dtype == torch.float32 and product.shape == (16, 24) and product.is_cuda
    return calls


@pytest.mark.skipif(not tpfuse_autograd.MM_HAS_OUT_DTYPE,
                    reason=f"torch {torch.__version__} has no torch.mm(..., out_dtype=) (it came with 2.8)")
def test_fp32_product_uses_out_dtype_where_torch_has_it(monkeypatch):
    assert fp32_product_calls(monkeypatch) == [(BF16, BF16, {"out_dtype": torch.float32})]


def test_fp32_product_converts_the_operands_where_torch_has_no_out_dtype(monkeypatch):
    monkeypatch.setattr(tpfuse_autograd, "MM_HAS_OUT_DTYPE", False)
    assert fp32_product_calls(monkeypatch) == [(torch.float32, torch.float32, {})]


def test_out_dtype_is_detected_by_the_installed_torchs_schema():
    assert tpfuse_autograd.MM_HAS_OUT_DTYPE == (TORCH_VERSION >= (2, 8))


# --- the parameters: Megatron's attributes, init_method, the RNG tracker ---

def tensor_parallel_attributes(parameter):
    return parameter.tensor_model_parallel, parameter.partition_dim, parameter.partition_stride


def test_megatron_attributes(groups):
    column = ColumnParallelLinear(16, 64, groups[4])
    gate_up = ColumnParallelLinear(16, 64, groups[4], stride=2)
    row = RowParallelLinear(64, 16, groups[4])
    assert tensor_parallel_attributes(column.weight) == (True, 0, 1)
    assert tensor_parallel_attributes(column.bias) == (True, 0, 1)
    assert tensor_parallel_attributes(gate_up.weight) == (True, 0, 2)
    assert tensor_parallel_attributes(gate_up.bias) == (True, 0, 2)
    assert tensor_parallel_attributes(row.weight) == (True, 1, 1)
    # Replicated: no tensor-parallel attributes (Megatron's defaults: not tensor-parallel), sequence-parallel.
    assert not getattr(row.bias, "tensor_model_parallel", False) and row.bias.sequence_parallel
    assert not hasattr(column.bias, "sequence_parallel")


class RankTracker:
    """Megatron's CudaRNGStatesTracker in miniature, on the CPU generator: fork() runs its block on this
    rank's own generator state (seeded apart per rank) and restores the default one after."""

    def __init__(self, seed):
        self.state = torch.Generator().manual_seed(seed).get_state()
        self.forks = 0

    @contextlib.contextmanager
    def fork(self):
        self.forks += 1
        default = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(default)


def layers_of_every_rank(group, make_tracker):
    """Each rank's (column, row) layers and its default generator's state after building them, every rank
    seeding its default generator alike (as Megatron's model_parallel_cuda_manual_seed does)."""
    built = []
    for rank in range(group.size()):
        torch.manual_seed(1234)
        tracker = make_tracker(rank)
        column = ColumnParallelLinear(16, 64, group, rng_tracker=tracker)
        row = RowParallelLinear(64, 16, group, rng_tracker=tracker)
        built.append((column, row, torch.get_rng_state(), tracker))
    return built


def test_rng_tracker_makes_shards_differ_and_replicated_bias_agree(groups):
    built = layers_of_every_rank(groups[4], lambda rank: RankTracker(seed=1234 + 2718 + rank))
    for column, row, default_state, tracker in built:
        assert tracker.forks == 2  # each weight initialised inside the tracker's fork
        assert torch.equal(default_state, built[0][2])  # the default generator untouched (and alike)
        assert torch.equal(column.bias, torch.zeros(16, dtype=BF16)) and torch.equal(row.bias, built[0][1].bias)
    for a, b in ((0, 1), (0, 3), (2, 3)):
        assert not torch.equal(built[a][0].weight, built[b][0].weight)
        assert not torch.equal(built[a][1].weight, built[b][1].weight)


def test_without_tracker_one_seed_gives_every_rank_the_same_shard(groups):
    """What the docs say: without an rng_tracker, the weight comes from the default generator."""
    built = layers_of_every_rank(groups[2], lambda rank: None)
    assert torch.equal(built[0][0].weight, built[1][0].weight)


def test_init_method_initialises_the_weight_shard(groups):
    shapes = []

    def init_method(weight):
        shapes.append(tuple(weight.shape))
        torch.nn.init.constant_(weight, 0.5)

    column = ColumnParallelLinear(16, 64, groups[4], init_method=init_method)
    row = RowParallelLinear(64, 16, groups[4], init_method=init_method)
    assert shapes == [(16, 16), (16, 16)]
    for layer in (column, row):
        assert torch.equal(layer.weight, torch.full((16, 16), 0.5, dtype=BF16)) and not layer.weight.grad_fn
        assert torch.equal(layer.bias, torch.zeros(16, dtype=BF16))


def test_default_init_is_nn_linears_with_the_whole_fan_in(groups):
    column = ColumnParallelLinear(64, 256, groups[4])
    bound = 64 ** -0.5
    assert column.weight.abs().max() <= bound and column.weight.abs().max() > bound / 2


# --- skip_bias_add; a sequence that does not divide ---

@pytest.mark.parametrize("p", SIZES)
def test_skip_bias_add_returns_the_bias_for_the_caller_to_add(groups, monkeypatch, p):
    case = MlpCase(p, seed=40 + p)
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        column, row = case.layers(groups[p], rank, skip_bias_add=True)
        x = case.shard(case.x, rank).to(BF16).requires_grad_()
        hidden, column_bias = column(x)
        out, row_bias = row(torch.relu(hidden + column_bias))
        assert column_bias is column.bias and row_bias is row.bias
        y = out + row_bias
        (y.double() * case.shard(case.g, rank)).sum().backward()
        return y, x.grad, column, row

    assert case.mismatches(sim.run(step)) == []


def test_a_sequence_that_does_not_divide_is_named(groups):
    row = RowParallelLinear(32, 16, groups[4])
    # 6 x 2 tokens divide over 4 ranks; the sequence of 6 does not.
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"sequence \(dim 0\) of 6 tokens does not divide over "
                                                          r"the group's 4 ranks"):
        row(torch.zeros(6, 2, 8, dtype=BF16))


def test_stride_and_sequence_dim_errors(groups):
    with pytest.raises(tpfuse.InvalidArgumentError, match="out_features = 36 does not divide over the group's "
                                                          "4 ranks in each of its stride = 2 blocks"):
        ColumnParallelLinear(16, 36, groups[4], stride=2)
    column = ColumnParallelLinear(16, 64, groups[4])
    with pytest.raises(tpfuse.InvalidArgumentError, match="must have 2 or more dimensions"):
        column(torch.zeros(16, dtype=BF16))


# --- SwiGLU: gate and up cost one reduce-scatter in backward ---

class SwigluCase:
    """x (tokens, K) sharded on dim 0, gate and up (F x K each, nn.Linear's layout), the upstream gradient of
    gate(x) * up(x) and its float64 gradients."""

    def __init__(self, p, seed, rows_per_rank=2, k=16, f_per_rank=8):
        generator = torch.Generator().manual_seed(seed)
        self.p, self.rows = p, rows_per_rank
        self.x = small_integers(rows_per_rank * p, k, generator=generator)
        self.gate = small_integers(f_per_rank * p, k, generator=generator, sparse=True)
        self.up = small_integers(f_per_rank * p, k, generator=generator, sparse=True)
        self.g = small_integers(rows_per_rank * p, f_per_rank * p, generator=generator)
        x, gate, up = (t.clone().requires_grad_() for t in (self.x, self.gate, self.up))
        (exact(x @ gate.t()) * exact(x @ up.t()) * self.g).sum().backward()
        self.x_grad, self.gate_grad, self.up_grad = exact(x.grad), exact(gate.grad), exact(up.grad)

    def rows_of(self, tensor, rank):
        return tensor[rank * self.rows:(rank + 1) * self.rows]

    def features_of(self, tensor, rank):
        f = tensor.shape[0] // self.p
        return tensor[rank * f:(rank + 1) * f]


def reduce_scatters_in_backward(sim, monkeypatch, step):
    """Run step(rank) -> (loss, results) on every rank; the fused and plain reduce-scatters each rank's
    loss.backward() launched, and the results."""
    plain = []
    reduce_scatter_rows = tpfuse_autograd.reduce_scatter_rows  # the simulated group's

    def counting(x, group_name, world_size):
        plain.append(sim.rank)
        return reduce_scatter_rows(x, group_name, world_size)

    monkeypatch.setattr(tpfuse_autograd, "reduce_scatter_rows", counting)
    counts = {}

    def counted(rank):
        loss, results = step(rank)
        before = len([r for r, op in sim.launches if r == rank and op == "gemm_reduce_scatter"])
        loss.backward()
        after = len([r for r, op in sim.launches if r == rank and op == "gemm_reduce_scatter"])
        counts[rank] = (after - before, plain.count(rank))
        return results

    return counts, sim.run(counted)


@pytest.mark.parametrize("p", SIZES)
def test_swiglu_drop_in_backward_is_one_reduce_scatter(groups, monkeypatch, p):
    """fused_all_gather_matmul with gate and up (both nn.Linear weights' transpose views, as Inductor's
    async-TP pass passes them): x's gradient is one fused GEMM + reduce-scatter, and exact."""
    case = SwigluCase(p, seed=50 + p)
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        x, gate, up = (t.to(BF16).requires_grad_() for t in (case.rows_of(case.x, rank),
                                                           case.features_of(case.gate, rank),
                                                           case.features_of(case.up, rank)))
        _, (h_gate, h_up) = tpfuse.fused_all_gather_matmul(x, [gate.t(), up.t()], 0, groups[p].group_name)
        g = case.g[:, rank * gate.shape[0]:(rank + 1) * gate.shape[0]]
        return (h_gate.double() * h_up.double() * g).sum(), (x, gate, up)

    counts, results = reduce_scatters_in_backward(sim, monkeypatch, step)
    assert counts == {rank: (1, 0) for rank in range(p)}  # one fused reduce-scatter, no plain one
    for rank, (x, gate, up) in enumerate(results):
        assert torch.equal(x.grad.double(), case.rows_of(case.x_grad, rank))
        assert torch.equal(gate.grad.double(), case.features_of(case.gate_grad, rank))
        assert torch.equal(up.grad.double(), case.features_of(case.up_grad, rank))


@pytest.mark.parametrize("p", SIZES)
def test_swiglu_gate_up_layer_backward_is_one_reduce_scatter(groups, monkeypatch, p):
    """A ColumnParallelLinear of stride 2 from an nn.Linear whose weight is [gate; up]: this rank's output is
    [its gate features, its up features], and the backward reduce-scatters once."""
    case = SwigluCase(p, seed=60 + p)
    sim = SimulatedGroup(groups[p], monkeypatch)
    gate_up = torch.nn.Linear(case.x.shape[1], 2 * case.gate.shape[0], bias=False, dtype=BF16)
    with torch.no_grad():
        gate_up.weight.copy_(torch.cat([case.gate, case.up]))

    def step(rank):
        layer = ColumnParallelLinear.from_linear(gate_up, groups[p], rank=rank, stride=2)
        x = case.rows_of(case.x, rank).to(BF16).requires_grad_()
        h_gate, h_up = layer(x).chunk(2, dim=-1)
        g = case.features_of(case.g.t(), rank).t()
        return (h_gate.double() * h_up.double() * g).sum(), (x, layer)

    counts, results = reduce_scatters_in_backward(sim, monkeypatch, step)
    assert counts == {rank: (1, 0) for rank in range(p)}
    for rank, (x, layer) in enumerate(results):
        assert torch.equal(x.grad.double(), case.rows_of(case.x_grad, rank))
        gate_grad, up_grad = layer.weight.grad.double().chunk(2)
        assert torch.equal(gate_grad, case.features_of(case.gate_grad, rank))
        assert torch.equal(up_grad, case.features_of(case.up_grad, rank))
