"""The backward wiring on a simulated group (simulated_group.py: P threads, reference collectives in
plain torch) at P = 2, 4 and 8: a two-layer TP MLP (ColumnParallelLinear, ReLU, RowParallelLinear) against
one device's float64 MLP, each op's backward against the reference, main_grad accumulation, and
deliberately wrong backends (rank order, layout) that the comparison must catch.

Exactness: the entries are small integers (x, weights, biases and the upstream gradient in {-1, 0, 1}), so
every product and sum is an integer; the tests check that every reference value is at most 256 in
magnitude, where BF16 holds integers exactly. So BF16 results equal the float64 reference exactly
(torch.equal), and any wrong row, transpose or layout shows as a mismatch."""

import pytest
import torch

import tpfuse
from tpfuse import autograd as tpfuse_autograd
from tpfuse.nn import ColumnParallelLinear, RowParallelLinear
from simulated_group import SimulatedGroup

BF16 = torch.bfloat16
SIZES = [2, 4, 8]
EXACT_LIMIT = 256  # integers up to 2^8 are exact in BF16 (8 significant bits)


def small_integers(*shape, generator, sparse=False):
    values = torch.tensor([-1.0, 0.0, 0.0, 1.0] if sparse else [-1.0, 0.0, 1.0], dtype=torch.float64)
    return values[torch.randint(len(values), shape, generator=generator)]


def exact(reference: torch.Tensor) -> torch.Tensor:
    assert reference.abs().max() <= EXACT_LIMIT, "the test's premise: every reference value exact in BF16"
    return reference


class MlpCase:
    """One device's float64 MLP and its P shards: tokens (S, B, D) sharded on dim 0, hidden H."""

    def __init__(self, p, seed, d=16, h_per_rank=8, rows_per_rank=2, batch=2):
        generator = torch.Generator().manual_seed(seed)
        self.p, self.d, self.h = p, d, h_per_rank * p
        self.x, self.g = self.activations(rows_per_rank * p, batch, d, generator)  # g: d loss / d output
        self.fc1 = torch.nn.Linear(d, self.h, dtype=torch.float64)
        self.fc2 = torch.nn.Linear(self.h, d, dtype=torch.float64)
        with torch.no_grad():
            for parameter in (*self.fc1.parameters(), *self.fc2.parameters()):
                parameter.copy_(small_integers(*parameter.shape, generator=generator, sparse=True))
        x = self.x.clone().requires_grad_()
        self.y = self.fc2(torch.relu(self.fc1(x)))
        (self.y * self.g).sum().backward()
        self.x_grad = x.grad
        for reference in (self.y, self.x_grad, self.fc1.weight.grad, self.fc2.weight.grad, self.fc1.bias.grad,
                          self.fc2.bias.grad):
            exact(reference)

    @staticmethod
    def activations(tokens, batch, d, generator):
        """x and the upstream gradient, (S, B, D) each."""
        return (small_integers(tokens, batch, d, generator=generator),
                small_integers(tokens, batch, d, generator=generator))

    def shard(self, tensor, rank):
        rows = tensor.shape[0] // self.p
        return tensor[rank * rows:(rank + 1) * rows]

    def layers(self, group, rank, save_gathered_input=True, **options):
        """This rank's BF16 layers, made with from_linear."""
        fc1, fc2 = (torch.nn.Linear(l.in_features, l.out_features, dtype=BF16) for l in (self.fc1, self.fc2))
        with torch.no_grad():
            for full, half in ((self.fc1, fc1), (self.fc2, fc2)):
                half.weight.copy_(full.weight)
                half.bias.copy_(full.bias)
        return (ColumnParallelLinear.from_linear(fc1, group, rank=rank, save_gathered_input=save_gathered_input,
                                                 **options),
                RowParallelLinear.from_linear(fc2, group, rank=rank, **options))

    def step(self, group, rank, **options):
        """This rank's forward and backward: (y, x.grad, column layer, row layer)."""
        column, row = self.layers(group, rank, **options)
        x = self.shard(self.x, rank).to(BF16).requires_grad_()
        y = row(torch.relu(column(x)))
        (y.double() * self.shard(self.g, rank)).sum().backward()
        return y, x.grad, column, row

    def mismatches(self, results, weight_grads=None):
        """Names of the results (every rank's) that differ from the reference; [] when all are exact."""
        wrong = []
        bias_grad_sum = torch.zeros_like(self.fc2.bias.grad)
        for rank, (y, x_grad, column, row) in enumerate(results):
            h = self.h // self.p
            w1_grad, w2_grad = (column.weight.grad, row.weight.grad) if weight_grads is None else weight_grads[rank]
            checks = {
                "y": (y, self.shard(self.y, rank)),
                "x.grad": (x_grad, self.shard(self.x_grad, rank)),
                "column.weight.grad": (w1_grad, self.fc1.weight.grad[rank * h:(rank + 1) * h]),
                "column.bias.grad": (column.bias.grad, self.fc1.bias.grad[rank * h:(rank + 1) * h]),
                "row.weight.grad": (w2_grad, self.fc2.weight.grad[:, rank * h:(rank + 1) * h]),
            }
            for name, (ours, reference) in checks.items():
                if ours is None or ours.shape != reference.shape or not torch.equal(ours.double(), reference):
                    wrong.append(f"rank {rank} {name}")
            bias_grad_sum += row.bias.grad.double()
        if not torch.equal(bias_grad_sum, self.fc2.bias.grad):  # each rank has its rows' part
            wrong.append("row.bias.grad summed over the ranks")
        return wrong


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("save_gathered_input", [True, False])
def test_two_layer_mlp_equals_one_device(groups, monkeypatch, p, save_gathered_input):
    case = MlpCase(p, seed=p)
    sim = SimulatedGroup(groups[p], monkeypatch)
    results = sim.run(lambda rank: case.step(groups[p], rank, save_gathered_input=save_gathered_input))
    assert case.mismatches(results) == []
    launched = {op for _, op in sim.launches}
    assert launched == {"gemm_reduce_scatter", "all_gather_gemm"}  # forward and backward ran the fused ops
    # forward: one of each per rank; backward: one of each per rank (the input's grad skips nothing here)
    assert len(sim.launches) == 4 * p
    assert all(getattr(row.bias, "sequence_parallel", False) for _, _, _, row in results)


@pytest.mark.parametrize("p", SIZES)
def test_wrong_rank_order_is_caught(groups, monkeypatch, p):
    case = MlpCase(p, seed=p)
    wrong_order = list(range(p))[1:] + [0]
    sim = SimulatedGroup(groups[p], monkeypatch, rank_order=wrong_order)
    results = sim.run(lambda rank: case.step(groups[p], rank))
    assert any(name.endswith(" y") for name in case.mismatches(results))


def test_wrong_layout_is_caught(groups, monkeypatch):
    # Square shards (D = H/P = 8): a backward that forgot to swap the layout runs, with W for W^T.
    p = 2
    case = MlpCase(p, seed=5, d=8, h_per_rank=8)
    monkeypatch.setattr(tpfuse_autograd, "SWAPPED_LAYOUT", {"nk": "nk", "kn": "kn"})
    sim = SimulatedGroup(groups[p], monkeypatch)
    results = sim.run(lambda rank: case.step(groups[p], rank))
    wrong = case.mismatches(results)
    assert any("x.grad" in name for name in wrong) and not any(name.endswith(" y") for name in wrong)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("megatron_ddp", [False, True])
def test_main_grad_accumulates_in_fp32(groups, monkeypatch, p, megatron_ddp):
    case = MlpCase(p, seed=10 + p)
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        column, row = case.layers(groups[p], rank, gradient_accumulation_fusion=True)
        for layer in (column, row):
            layer.weight.main_grad = torch.full(layer.weight.shape, 0.25)  # accumulated onto, in FP32
            if megatron_ddp:
                layer.weight.grad_added_to_main_grad = False
                layer.weight.zero_out_wgrad = True
        x = case.shard(case.x, rank).to(BF16).requires_grad_()
        y = row(torch.relu(column(x)))
        (y.double() * case.shard(case.g, rank)).sum().backward()
        return y, x.grad, column, row

    results = sim.run(step)
    main_grads = [(column.weight.main_grad - 0.25, row.weight.main_grad - 0.25) for _, _, column, row in results]
    assert case.mismatches(results, weight_grads=main_grads) == []
    for _, _, column, row in results:
        for weight in (column.weight, row.weight):
            assert weight.main_grad.dtype == torch.float32
            if megatron_ddp:  # a dummy gradient (zeros: zero_out_wgrad), so that DDP's hooks run
                assert weight.grad_added_to_main_grad and torch.equal(weight.grad, torch.zeros_like(weight))
            else:
                assert weight.grad is None


def test_main_grad_missing_is_an_argument_error(groups):
    column = ColumnParallelLinear(16, 32, groups[2], gradient_accumulation_fusion=True)
    with pytest.raises(tpfuse.InvalidArgumentError, match="no main_grad attribute"):
        column(torch.zeros(4, 16, dtype=BF16))
    column.weight.main_grad = torch.zeros(column.weight.shape, dtype=BF16)
    with pytest.raises(tpfuse.InvalidArgumentError, match="must be torch.float32"):
        column(torch.zeros(4, 16, dtype=BF16))


def test_layer_shapes_and_from_linear_errors(groups):
    column = ColumnParallelLinear(16, 64, groups[4])
    row = RowParallelLinear(64, 16, groups[4])
    assert column.weight.shape == (16, 16) and column.bias.shape == (16,)
    assert row.weight.shape == (16, 16) and row.bias.shape == (16,) and row.bias.sequence_parallel
    with pytest.raises(tpfuse.InvalidArgumentError, match="out_features = 18 does not divide"):
        ColumnParallelLinear(16, 18, groups[4])
    with pytest.raises(tpfuse.InvalidArgumentError, match="rank = 4 is not a rank"):
        RowParallelLinear.from_linear(torch.nn.Linear(64, 16, dtype=BF16), groups[4], rank=4)


# --- each op's backward (register_autograd), against float64 autograd of the same function ---

def reference_grads(fn, *tensors):
    """fn's output and the gradients of (output * upstream).sum(), in float64 on one device."""
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    out = fn(*leaves)
    return out, leaves


def kn(w, layout):
    return w.t() if layout == "nk" else w


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemm_reduce_scatter_backward(groups, monkeypatch, p, layout):
    generator = torch.Generator().manual_seed(p)
    m, n, k_per_rank = 4 * p, 16, 8
    a = [small_integers(m, k_per_rank, generator=generator) for _ in range(p)]
    w = [small_integers(*((n, k_per_rank) if layout == "nk" else (k_per_rank, n)), generator=generator)
         for _ in range(p)]
    g = small_integers(m, n, generator=generator)
    a_ref = [t.clone().requires_grad_() for t in a]
    w_ref = [t.clone().requires_grad_() for t in w]
    full = sum(x @ kn(y, layout) for x, y in zip(a_ref, w_ref))
    (exact(full) * g).sum().backward()
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        a_r, w_r = a[rank].to(BF16).requires_grad_(), w[rank].to(BF16).requires_grad_()
        out = tpfuse.gemm_reduce_scatter(a_r, w_r, groups[p], weight_layout=layout)
        (out.double() * g[rank * m // p:(rank + 1) * m // p]).sum().backward()
        return out, a_r.grad, w_r.grad

    for rank, (out, a_grad, w_grad) in enumerate(sim.run(step)):
        assert torch.equal(out.double(), full[rank * m // p:(rank + 1) * m // p])
        assert torch.equal(a_grad.double(), exact(a_ref[rank].grad))
        assert torch.equal(w_grad.double(), exact(w_ref[rank].grad))


@pytest.mark.parametrize("needs_grad", ["a", "a_scale"])
def test_fp8_forward_runs_and_its_backward_is_refused(groups, monkeypatch, needs_grad):
    """FP8 inputs: the forward runs (exact on small integers and power-of-2 scales), and a backward through it
    raises UnsupportedError, whether the FP8 input or a scale asked for the gradient."""
    generator = torch.Generator().manual_seed(9)
    a, w = small_integers(8, 16, generator=generator), small_integers(16, 16, generator=generator)
    a_scale, w_scale = torch.full((8, 1), 0.5), torch.full((1, 16), 4.0)
    sim = SimulatedGroup(groups[1], monkeypatch)
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    if needs_grad == "a":
        a8.requires_grad_()
    else:
        a_scale.requires_grad_()
    [out] = sim.run(lambda rank: tpfuse.gemm_reduce_scatter(a8, w8, groups[1], a_scale=a_scale, w_scale=w_scale))
    assert out.requires_grad and torch.equal(out.double(), exact(a @ w.t() * 2))
    with pytest.raises(tpfuse.UnsupportedError, match=r"tpfuse.gemm_reduce_scatter on FP8 inputs "
                                                      r"\(torch.float8_e4m3fn\) has no backward pass"):
        out.float().sum().backward()


@pytest.mark.parametrize("needs_grad", ["x", "x_scale"])
@pytest.mark.parametrize("gathered", [False, True])
def test_fp8_all_gather_forward_runs_and_its_backward_is_refused(groups, monkeypatch, needs_grad, gathered):
    generator = torch.Generator().manual_seed(10)
    x, w = small_integers(8, 16, generator=generator), small_integers(16, 16, generator=generator)
    x_scale, w_scale = torch.full((8, 1), 0.5), torch.full((1, 16), 4.0)
    sim = SimulatedGroup(groups[1], monkeypatch)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    (x8 if needs_grad == "x" else x_scale).requires_grad_()
    [result] = sim.run(lambda rank: tpfuse.all_gather_gemm(x8, w8, groups[1], return_gathered=gathered,
                                                           x_scale=x_scale, w_scale=w_scale))
    y = result[0] if gathered else result
    assert y.requires_grad and torch.equal(y.double(), exact(x @ w.t() * 2))
    with pytest.raises(tpfuse.UnsupportedError, match=r"tpfuse.all_gather_gemm on FP8 inputs "
                                                      r"\(torch.float8_e4m3fn\) has no backward pass"):
        y.float().sum().backward()


def test_quantizing_all_gather_backward_is_refused(groups, monkeypatch):
    generator = torch.Generator().manual_seed(11)
    x = small_integers(8, 16, generator=generator).to(BF16).requires_grad_()
    w8 = small_integers(16, 16, generator=generator).to(torch.float8_e4m3fn)
    sim = SimulatedGroup(groups[1], monkeypatch)
    [y] = sim.run(lambda rank: tpfuse.quantize_all_gather_gemm(x, w8, groups[1], w_scale=torch.ones(1, 16)))
    assert y.requires_grad
    with pytest.raises(tpfuse.UnsupportedError, match=r"tpfuse.quantize_all_gather_gemm on rows it quantizes to "
                                                      r"torch.float8_e4m3fn has no backward pass"):
        y.float().sum().backward()


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("gathered", [False, True])
def test_all_gather_gemm_backward(groups, monkeypatch, p, layout, gathered):
    generator = torch.Generator().manual_seed(p)
    rows, n_per_rank, k = 2, 8, 16
    x = [small_integers(rows, k, generator=generator) for _ in range(p)]
    w = [small_integers(*((n_per_rank, k) if layout == "nk" else (k, n_per_rank)), generator=generator)
         for _ in range(p)]
    g = [small_integers(rows * p, n_per_rank, generator=generator) for _ in range(p)]
    g_x = [small_integers(rows * p, k, generator=generator) for _ in range(p)]  # upstream of the gathered X
    x_ref = [t.clone().requires_grad_() for t in x]
    w_ref = [t.clone().requires_grad_() for t in w]
    X = torch.cat(x_ref)
    loss = sum((exact(X @ kn(w_ref[r], layout)) * g[r]).sum() for r in range(p))
    if gathered:
        loss = loss + sum((X * g_x[r]).sum() for r in range(p))
    loss.backward()
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        x_r, w_r = x[rank].to(BF16).requires_grad_(), w[rank].to(BF16).requires_grad_()
        if gathered:
            y, X_r = tpfuse.all_gather_gemm(x_r, w_r, groups[p], weight_layout=layout, return_gathered=True)
            loss = (y.double() * g[rank]).sum() + (X_r.double() * g_x[rank]).sum()
        else:
            y = tpfuse.all_gather_gemm(x_r, w_r, groups[p], weight_layout=layout)
            loss = (y.double() * g[rank]).sum()
        loss.backward()
        return x_r.grad, w_r.grad

    for rank, (x_grad, w_grad) in enumerate(sim.run(step)):
        assert torch.equal(x_grad.double(), exact(x_ref[rank].grad))
        assert torch.equal(w_grad.double(), exact(w_ref[rank].grad))


@pytest.mark.parametrize("p", SIZES)
def test_drop_in_backwards(groups, monkeypatch, p):
    """fused_matmul_reduce_scatter with an nn.Linear weight's transpose view, and fused_all_gather_matmul
    with two Bs (SwiGLU's gate and up: a weight's transpose view and a K x N matrix), return_A on."""
    generator = torch.Generator().manual_seed(p)
    rows, k, n = 2, 16, 8
    x = [small_integers(rows, 3, k, generator=generator) for _ in range(p)]
    gate = [small_integers(n, k, generator=generator, sparse=True) for _ in range(p)]  # nn.Linear's: B = gate.t()
    up = [small_integers(k, n, generator=generator, sparse=True) for _ in range(p)]    # K x N as stored
    down = [small_integers(k, n, generator=generator, sparse=True) for _ in range(p)]  # nn.Linear's: B = down.t()
    g = small_integers(rows * p, 3, k, generator=generator)
    g_a = [small_integers(rows * p, 3, k, generator=generator) for _ in range(p)]
    refs = [[t.clone().requires_grad_() for t in ts] for ts in (x, gate, up, down)]
    X = torch.cat(refs[0])
    hidden = [exact(X @ refs[1][r].t()) * exact(X @ refs[2][r]) for r in range(p)]
    out = sum(exact(hidden[r]) @ refs[3][r].t() for r in range(p))
    loss = (exact(out) * g).sum() + sum((X * g_a[r]).sum() for r in range(p))
    loss.backward()
    out_ref = out.detach()
    sim = SimulatedGroup(groups[p], monkeypatch)

    def step(rank):
        x_r, gate_r, up_r, down_r = (t[rank].to(BF16).requires_grad_() for t in (x, gate, up, down))
        A, (h_gate, h_up) = tpfuse.fused_all_gather_matmul(x_r, [gate_r.t(), up_r], 0, groups[p].group_name)
        out = tpfuse.fused_matmul_reduce_scatter((h_gate * h_up).contiguous(), down_r.t(), "sum", 0,
                                                 groups[p].group_name)
        part = slice(rank * rows, (rank + 1) * rows)
        ((out.double() * g[part]).sum() + (A.double() * g_a[rank]).sum()).backward()
        return out, x_r.grad, gate_r.grad, up_r.grad, down_r.grad

    for rank, (out, *grads) in enumerate(sim.run(step)):
        assert torch.equal(out.double(), out_ref[rank * rows:(rank + 1) * rows])
        for name, ours, ref in zip(("x", "gate", "up", "down"), grads, refs):
            assert torch.equal(ours.double(), exact(ref[rank].grad)), f"rank {rank}: {name}'s grad"



# --- torch.compile(fullgraph=True): forward and backward in graphs, no graph break ---

@pytest.mark.parametrize("main_grad, save_gathered_input", [(False, True), (True, True), (False, False)])
def test_compiled_mlp_equals_one_device(groups, monkeypatch, main_grad, save_gathered_input):
    """The MLP step compiled (AOT autograd, graphs run as traced) on a simulated group of one (torch.compile
    in several threads at once is not something torch supports): exact results, the weight gradients in
    main_grad when asked. Forward and backward graphs at P = 4 are checked below."""
    p = 1
    case = MlpCase(p, seed=3)
    sim = SimulatedGroup(groups[p], monkeypatch)
    torch._dynamo.reset()

    def step(rank):
        column, row = case.layers(groups[p], rank, gradient_accumulation_fusion=main_grad,
                                  save_gathered_input=save_gathered_input)
        if main_grad:
            for layer in (column, row):
                layer.weight.main_grad = torch.zeros(layer.weight.shape)
        model = torch.compile(torch.nn.Sequential(column, torch.nn.ReLU(), row), fullgraph=True, backend="aot_eager")
        x = case.shard(case.x, rank).to(BF16).requires_grad_()
        y = model(x)
        (y.double() * case.shard(case.g, rank)).sum().backward()
        return y, x.grad, column, row

    results = sim.run(step)
    weight_grads = [(c.weight.main_grad, r.weight.main_grad) for _, _, c, r in results] if main_grad else None
    assert case.mismatches(results, weight_grads=weight_grads) == []


class GraphsOf:
    """An AOT-autograd backend that keeps the forward and backward graphs and runs them as they are."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd
        self.forward, self.backward = [], []

        def keep(graphs):
            def compiler(graph_module, example_inputs):
                graphs.append(graph_module)
                return graph_module.forward
            return compiler

        self.backend = aot_autograd(fw_compiler=keep(self.forward), bw_compiler=keep(self.backward))

    @staticmethod
    def ops(graphs):
        return sorted(str(node.target) for graph in graphs for node in graph.graph.nodes
                      if node.op == "call_function" and "tpfuse" in str(node.target))


@pytest.mark.parametrize("save_gathered_input", [True, False])
def test_compile_traces_forward_and_backward_with_fused_ops(groups, save_gathered_input):
    group = groups[4]
    column = ColumnParallelLinear(64, 256, group, device="meta", save_gathered_input=save_gathered_input)
    row = RowParallelLinear(256, 64, group, device="meta")
    graphs = GraphsOf()
    model = torch.compile(torch.nn.Sequential(column, torch.nn.GELU(), row), fullgraph=True, backend=graphs.backend)
    x = torch.empty(8, 2, 64, dtype=BF16, device="meta", requires_grad=True)
    y = model(x)
    assert y.shape == (8, 2, 64)
    y.sum().backward()
    assert x.grad.shape == x.shape and column.weight.grad.shape == (64, 64) and row.bias.grad.shape == (64,)
    gathered = "tpfuse.all_gather_gemm_gathered.default" if save_gathered_input else "tpfuse.all_gather_gemm.default"
    assert GraphsOf.ops(graphs.forward) == [gathered, "tpfuse.gemm_reduce_scatter.default"]
    # backward: the row layer's dgrad is the all-gather + GEMM, the column layer's the GEMM + reduce-scatter
    assert GraphsOf.ops(graphs.backward) == ["tpfuse.all_gather_gemm_gathered.default",
                                             "tpfuse.gemm_reduce_scatter.default"]


def test_compile_traces_the_ops_backward(groups):
    group = groups[4]
    graphs = GraphsOf()

    def f(a, w, x, w2):
        out = tpfuse.gemm_reduce_scatter(a, w, group).float().sum()
        return out + tpfuse.all_gather_gemm(x, w2, group).float().sum()

    tensors = [torch.empty(*shape, dtype=BF16, device="meta", requires_grad=True)
               for shape in ((64, 32), (48, 32), (16, 32), (24, 32))]
    torch.compile(f, fullgraph=True, backend=graphs.backend)(*tensors).backward()
    assert all(t.grad.shape == t.shape for t in tensors)
    assert GraphsOf.ops(graphs.backward) == ["tpfuse.all_gather_gemm_gathered.default",
                                             "tpfuse.gemm_reduce_scatter.default"]
