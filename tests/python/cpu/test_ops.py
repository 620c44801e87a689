"""The custom ops: registered with their schemas, fake implementations that give the output's shape,
torch.compile(fullgraph=True) traces them without a graph break, the drop-in has symm_mem's schema."""

import contextlib
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.distributed._symmetric_memory  # noqa: F401 -- registers torch.ops.symm_mem

import tpfuse
from tpfuse import _checks, _library, _ops

BF16 = torch.bfloat16


FP8 = torch.float8_e4m3fn


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_ops_are_registered_with_their_schemas():
    schemas = {name: str(getattr(torch.ops.tpfuse, name).default._schema) for name in
               ("gemm_reduce_scatter", "gemm_reduce_scatter_out", "fused_matmul_reduce_scatter")}
    assert schemas["gemm_reduce_scatter"] == "tpfuse::gemm_reduce_scatter(Tensor a, Tensor w, str weight_layout, " \
        "str group_name, Tensor? bias=None, int batch=1, Tensor? a_scale=None, Tensor? w_scale=None, " \
        "bool use_fast_accum=False) -> Tensor"
    assert schemas["gemm_reduce_scatter_out"] == "tpfuse::gemm_reduce_scatter_out(Tensor a, Tensor w, " \
        "str weight_layout, str group_name, Tensor(a!) out, Tensor? bias=None, int batch=1, Tensor? a_scale=None, " \
        "Tensor? w_scale=None, bool use_fast_accum=False) -> ()"
    assert schemas["fused_matmul_reduce_scatter"] == str(
        torch.ops.symm_mem.fused_matmul_reduce_scatter.default._schema).replace("symm_mem::", "tpfuse::")


def test_drop_in_has_the_signature_of_symm_mem_op():
    schema = torch.ops.symm_mem.fused_matmul_reduce_scatter.default._schema
    python_types = {"Tensor": torch.Tensor, "str": str, "int": int}
    expected = [(argument.name, python_types[str(argument.type)]) for argument in schema.arguments]
    signature = inspect.signature(tpfuse.fused_matmul_reduce_scatter)
    assert [(p.name, p.annotation) for p in signature.parameters.values()] == expected
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in signature.parameters.values())
    assert [str(r.type) for r in schema.returns] == ["Tensor"] and signature.return_annotation is torch.Tensor


@pytest.mark.parametrize("weight_layout, w_shape", [("nk", (48, 32)), ("kn", (32, 48))])
@pytest.mark.parametrize("batch", [1, 2])
def test_fake_shapes(group, weight_layout, w_shape, batch):
    m = 256 * batch  # with batch 2, each rank's share of a sequence is one slab of 64 rows
    for bias in (None, meta(48)):
        out = torch.ops.tpfuse.gemm_reduce_scatter(meta(m, 32), meta(*w_shape), weight_layout, group.group_name, bias,
                                                   batch)
        assert out.shape == (m // group.size(), 48) and out.dtype == BF16 and out.device.type == "meta"


def test_out_is_the_tensor_the_launch_writes(group, monkeypatch):
    """tpfuse.gemm_reduce_scatter(..., out=out) launches into `out` itself and returns it: a stand-in launch
    writes its rows' number, which the returned tensor and `out` must both show."""
    launched = []

    def launch(a, w, bias, out, problem, group_name, a_scale=None, w_scale=None):
        launched.append((out, problem.batch, bias))
        out.copy_(torch.arange(out.shape[0], dtype=BF16)[:, None].expand_as(out))

    monkeypatch.setattr(_ops, "_launch", launch)
    monkeypatch.setattr(_ops, "check_placement", lambda *named, scales=(): None)
    out, bias = torch.full((128, 48), float("nan"), dtype=BF16), torch.zeros(48, dtype=BF16)
    result = tpfuse.gemm_reduce_scatter(torch.zeros(512, 32, dtype=BF16), torch.zeros(48, 32, dtype=BF16), group,
                                        out=out, bias=bias, batch=2)
    [(launched_out, batch, launched_bias)] = launched
    assert launched_out.data_ptr() == out.data_ptr() and launched_out.shape == out.shape
    assert batch == 2 and launched_bias is bias
    rows = torch.arange(128, dtype=BF16)[:, None].expand(128, 48)
    assert torch.equal(out, rows) and torch.equal(result, rows)


@pytest.mark.parametrize("scales", [((), (1,)), ((256, 1), (1, 48)), ((256,), (48,))])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_fp8_fake_shapes_are_bf16_rows(group, scales, use_fast_accum):
    """FP8 in, BF16 out: this rank's M/P x N rows, the same shape as BF16 inputs give."""
    a_scale, w_scale = (meta(*shape, dtype=torch.float32) for shape in scales)
    for bias in (None, meta(48)):
        out = torch.ops.tpfuse.gemm_reduce_scatter(meta(256, 32, dtype=FP8), meta(48, 32, dtype=FP8), "nk",
                                                   group.group_name, bias, 1, a_scale, w_scale, use_fast_accum)
        assert out.shape == (256 // group.size(), 48) and out.dtype == BF16 and out.device.type == "meta"
        out = meta(256 // group.size(), 48)
        tpfuse.gemm_reduce_scatter(meta(256, 32, dtype=FP8), meta(48, 32, dtype=FP8), group, out=out, bias=bias,
                                   a_scale=a_scale, w_scale=w_scale, use_fast_accum=use_fast_accum)


@pytest.mark.parametrize("a_shape, scatter_dim", [((16, 32), 0), ((8, 3, 32), 0), ((4, 2, 5, 32), 0),
                                                  ((2, 256, 32), 1), ((2, 3, 256, 32), 2), ((2, 64, 4, 32), 1)])
def test_drop_in_fake_shape_is_symm_mems(group, a_shape, scatter_dim):
    weight = meta(48, 32)
    expected = list(a_shape[:-1]) + [48]
    expected[scatter_dim] //= group.size()
    for B in (weight.t(), meta(32, 48)):
        ours = tpfuse.fused_matmul_reduce_scatter(meta(*a_shape), B, "sum", scatter_dim, group.group_name)
        theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter(meta(*a_shape), B, "sum", scatter_dim,
                                                                group.group_name)
        assert ours.shape == theirs.shape == tuple(expected)
        assert ours.stride() == theirs.stride() and ours.dtype == BF16


class GraphCapture:
    """A torch.compile backend that keeps the FX graphs and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module)
        return graph_module.forward

    def calls_of(self, op):
        """How many nodes of the graphs call `op` (an op packet, as Dynamo records it, or its overload)."""
        return sum(node.op == "call_function" and node.target in (op, op.default)
                   for graph in self.graphs for node in graph.graph.nodes)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_traces_the_op_in_one_graph(group, dynamic):
    def layer(a, w):
        return tpfuse.gemm_reduce_scatter(a, w, group).float() * 2

    capture = GraphCapture()
    compiled = torch.compile(layer, fullgraph=True, backend=capture, dynamic=dynamic)
    for m in (64, 128):
        out = compiled(meta(m, 32), meta(48, 32))
        assert out.shape == (m // group.size(), 48) and out.dtype == torch.float32
    assert len(capture.graphs) == (1 if dynamic else 2)
    assert capture.calls_of(torch.ops.tpfuse.gemm_reduce_scatter) == len(capture.graphs)


@pytest.mark.parametrize("rowwise", [False, True])
def test_compile_traces_the_fp8_op_in_one_graph(group, rowwise):
    """FP8 inputs with their scales and use_fast_accum in the graph's call, through AOT autograd (which needs no
    backward: nothing requires a gradient)."""
    def layer(a, w, a_scale, w_scale):
        return tpfuse.gemm_reduce_scatter(a, w, group, a_scale=a_scale, w_scale=w_scale, use_fast_accum=True) * 2

    capture = GraphCapture()
    scales = ((64, 1), (1, 48)) if rowwise else ((), ())
    out = torch.compile(layer, fullgraph=True, backend=capture)(
        meta(64, 32, dtype=FP8), meta(48, 32, dtype=FP8), *(meta(*shape, dtype=torch.float32) for shape in scales))
    assert out.shape == (64 // group.size(), 48) and out.dtype == BF16
    assert capture.calls_of(torch.ops.tpfuse.gemm_reduce_scatter) == 1
    [node] = [node for node in capture.graphs[0].graph.nodes if node.op == "call_function" and
              node.target in (torch.ops.tpfuse.gemm_reduce_scatter, torch.ops.tpfuse.gemm_reduce_scatter.default)]
    assert node.args[-1] is True or node.kwargs.get("use_fast_accum") is True
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(
        meta(64, 32, dtype=FP8), meta(48, 32, dtype=FP8), *(meta(*shape, dtype=torch.float32) for shape in scales))
    assert out.shape == (64 // group.size(), 48)


def test_compile_traces_the_blockwise_op_in_one_graph(group):
    """Blockwise scales (N = 200: a partial block of w) through the fake implementation, in one graph and through
    AOT autograd: BF16 rows of the BF16 call's shape."""
    def layer(a, w, a_scale, w_scale):
        return tpfuse.gemm_reduce_scatter(a, w, group, a_scale=a_scale, w_scale=w_scale) * 2

    inputs = (meta(256, 384, dtype=FP8), meta(200, 384, dtype=FP8), meta(256, 3, dtype=torch.float32),
              meta(2, 3, dtype=torch.float32))
    capture = GraphCapture()
    out = torch.compile(layer, fullgraph=True, backend=capture)(*inputs)
    assert out.shape == (256 // group.size(), 200) and out.dtype == BF16
    assert capture.calls_of(torch.ops.tpfuse.gemm_reduce_scatter) == 1
    assert torch.compile(layer, fullgraph=True, backend="aot_eager")(*inputs).shape == (256 // group.size(), 200)


def test_compile_through_aot_autograd_default_group_and_out(group):
    def layer(a, w, out):
        tpfuse.gemm_reduce_scatter(a, w, weight_layout="kn", out=out)
        return out + 1

    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(meta(64, 32), meta(32, 48),
                                                                     meta(64 // group.size(), 48))
    assert out.shape == (64 // group.size(), 48)


def test_compile_traces_the_drop_in(group):
    capture = GraphCapture()
    weight = meta(48, 32)

    def layer(x):
        return tpfuse.fused_matmul_reduce_scatter(x, weight.t(), "sum", 0, group.group_name)

    out = torch.compile(layer, fullgraph=True, backend=capture)(meta(8, 3, 32))
    assert out.shape == (8 // group.size(), 3, 48)
    assert capture.calls_of(torch.ops.tpfuse.fused_matmul_reduce_scatter) == 1


def test_compile_reports_bad_shapes_at_trace_time(group):
    compiled = torch.compile(lambda a, w: tpfuse.gemm_reduce_scatter(a, w, group), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="M = 6 rows of a do not divide over the group's 4 ranks"):
        compiled(meta(6, 32), meta(48, 32))


@pytest.mark.parametrize("fullgraph", [True, False])
def test_compile_errors_carry_the_tpfuse_error(group, fullgraph):
    """torch.compile wraps an error of the op's fake implementation in its own exception; the tpfuse
    error stays in its chain, where tpfuse.tpfuse_error_of finds it."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, w: tpfuse.gemm_reduce_scatter(a, w, group), fullgraph=fullgraph,
                             backend="aot_eager")
    with pytest.raises(Exception) as caught:
        compiled(meta(6, 32), meta(48, 32))
    error = tpfuse.tpfuse_error_of(caught.value)
    assert isinstance(error, tpfuse.InvalidArgumentError)
    assert str(error) == "M = 6 rows of a do not divide over the group's 4 ranks"
    assert tpfuse.tpfuse_error_of(RuntimeError("not tpfuse's")) is None


def test_all_gather_ops_are_registered_with_their_schemas():
    assert str(torch.ops.tpfuse.all_gather_gemm.default._schema) == "tpfuse::all_gather_gemm(Tensor x, Tensor w, " \
        "str weight_layout, str group_name, Tensor? bias=None, int batch=1, Tensor? x_scale=None, " \
        "Tensor? w_scale=None, bool use_fast_accum=False) -> Tensor"
    assert str(torch.ops.tpfuse.all_gather_gemm_gathered.default._schema) == "tpfuse::all_gather_gemm_gathered(" \
        "Tensor x, Tensor w, str weight_layout, str group_name, Tensor? bias=None, int batch=1, " \
        "Tensor? x_scale=None, Tensor? w_scale=None, bool use_fast_accum=False) -> (Tensor, Tensor)"
    assert str(torch.ops.tpfuse.quantize_all_gather_gemm.default._schema) == "tpfuse::quantize_all_gather_gemm(" \
        "Tensor x, Tensor w, Tensor w_scale, str group_name, Tensor? bias=None, int batch=1, " \
        "bool use_fast_accum=False, str scaling=\"rowwise\") -> Tensor"


@pytest.mark.parametrize("scales", [((), (1,)), ((64, 1), (1, 48)), ((64,), (48,))])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_all_gather_fp8_fake_shapes(group, scales, use_fast_accum):
    """FP8 in: Y is BF16, the gathered X e4m3, of the shapes BF16 inputs give."""
    x_scale, w_scale = (meta(*shape, dtype=torch.float32) for shape in scales)
    p = group.size()
    for bias in (None, meta(48)):
        y = tpfuse.all_gather_gemm(meta(64, 32, dtype=FP8), meta(48, 32, dtype=FP8), group, bias=bias, x_scale=x_scale,
                                   w_scale=w_scale, use_fast_accum=use_fast_accum)
        assert y.shape == (64 * p, 48) and y.dtype == BF16
        y, gathered = tpfuse.all_gather_gemm(meta(64, 32, dtype=FP8), meta(48, 32, dtype=FP8), group,
                                             return_gathered=True, bias=bias, x_scale=x_scale, w_scale=w_scale,
                                             use_fast_accum=use_fast_accum)
        assert (y.shape, y.dtype, gathered.shape, gathered.dtype) == ((64 * p, 48), BF16, (64 * p, 32), FP8)
    y = tpfuse.quantize_all_gather_gemm(meta(64, 32), meta(48, 32, dtype=FP8), group, w_scale=meta(1, 48,
                                        dtype=torch.float32), use_fast_accum=use_fast_accum)
    assert y.shape == (64 * p, 48) and y.dtype == BF16


@pytest.mark.parametrize("batch", [1, 2])
def test_all_gather_blockwise_fake_shapes(group, batch):
    """Blockwise scales (N/P = 200: a partial block of w): Y BF16 and the gathered X e4m3, the BF16 call's
    shapes; quantize_all_gather_gemm's blockwise form too."""
    p, scales = group.size(), (meta(128, 3, dtype=torch.float32), meta(2, 3, dtype=torch.float32))
    x, w = meta(128, 384, dtype=FP8), meta(200, 384, dtype=FP8)
    y, gathered = tpfuse.all_gather_gemm(x, w, group, return_gathered=True, batch=batch, x_scale=scales[0],
                                         w_scale=scales[1])
    assert (y.shape, y.dtype, gathered.shape, gathered.dtype) == ((128 * p, 200), BF16, (128 * p, 384), FP8)
    y = tpfuse.quantize_all_gather_gemm(meta(128, 384), w, group, w_scale=scales[1], batch=batch,
                                        scaling="blockwise")
    assert y.shape == (128 * p, 200) and y.dtype == BF16


@pytest.mark.parametrize("rowwise", [False, True])
def test_compile_traces_the_fp8_all_gather_in_one_graph(group, rowwise):
    def layer(x, w, x_scale, w_scale):
        y, gathered = tpfuse.all_gather_gemm(x, w, group, return_gathered=True, x_scale=x_scale, w_scale=w_scale,
                                             use_fast_accum=True)
        return y.float() + gathered.float().sum()

    capture = GraphCapture()
    scales = ((16, 1), (1, 48)) if rowwise else ((), ())
    out = torch.compile(layer, fullgraph=True, backend=capture)(
        meta(16, 32, dtype=FP8), meta(48, 32, dtype=FP8), *(meta(*shape, dtype=torch.float32) for shape in scales))
    assert out.shape == (16 * group.size(), 48)
    assert capture.calls_of(torch.ops.tpfuse.all_gather_gemm_gathered) == 1
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(
        meta(16, 32, dtype=FP8), meta(48, 32, dtype=FP8), *(meta(*shape, dtype=torch.float32) for shape in scales))
    assert out.shape == (16 * group.size(), 48)


@pytest.mark.parametrize("scaling, k, w_scale", [("rowwise", 32, (1, 48)), ("blockwise", 256, (1, 2))])
def test_compile_traces_the_quantizing_all_gather_in_one_graph(group, scaling, k, w_scale):
    capture = GraphCapture()

    def layer(x, w, w_scale):
        return tpfuse.quantize_all_gather_gemm(x, w, group, w_scale=w_scale, scaling=scaling)

    out = torch.compile(layer, fullgraph=True, backend=capture)(meta(16, k), meta(48, k, dtype=FP8),
                                                                 meta(*w_scale, dtype=torch.float32))
    assert out.shape == (16 * group.size(), 48) and out.dtype == BF16
    assert capture.calls_of(torch.ops.tpfuse.quantize_all_gather_gemm) == 1


def test_compile_traces_the_blockwise_all_gather_in_one_graph(group):
    def layer(x, w, x_scale, w_scale):
        y, gathered = tpfuse.all_gather_gemm(x, w, group, return_gathered=True, x_scale=x_scale, w_scale=w_scale)
        return y.float() + gathered.float().sum()

    inputs = (meta(16, 256, dtype=FP8), meta(200, 256, dtype=FP8), meta(16, 2, dtype=torch.float32),
              meta(2, 2, dtype=torch.float32))
    capture = GraphCapture()
    out = torch.compile(layer, fullgraph=True, backend=capture)(*inputs)
    assert out.shape == (16 * group.size(), 200)
    assert capture.calls_of(torch.ops.tpfuse.all_gather_gemm_gathered) == 1
    assert torch.compile(layer, fullgraph=True, backend="aot_eager")(*inputs).shape == (16 * group.size(), 200)


@pytest.mark.parametrize("weight_layout, w_shape", [("nk", (48, 32)), ("kn", (32, 48))])
@pytest.mark.parametrize("batch", [1, 3])
def test_all_gather_fake_shapes(group, weight_layout, w_shape, batch):
    p, rows = group.size(), 64 * batch
    for bias in (None, meta(48)):
        y = tpfuse.all_gather_gemm(meta(rows, 32), meta(*w_shape), group, weight_layout=weight_layout, bias=bias,
                                   batch=batch)
        assert y.shape == (rows * p, 48) and y.dtype == BF16 and y.device.type == "meta"
        y, gathered = tpfuse.all_gather_gemm(meta(rows, 32), meta(*w_shape), group, weight_layout=weight_layout,
                                             return_gathered=True, bias=bias, batch=batch)
        assert y.shape == (rows * p, 48) and gathered.shape == (rows * p, 32)


def test_compile_traces_the_all_gather_in_one_graph(group):
    capture = GraphCapture()

    def layer(x, w):
        y, gathered = tpfuse.all_gather_gemm(x, w, group, return_gathered=True)
        return y.float() + gathered.float().sum()

    out = torch.compile(layer, fullgraph=True, backend=capture)(meta(16, 32), meta(48, 32))
    assert out.shape == (16 * group.size(), 48)
    assert capture.calls_of(torch.ops.tpfuse.all_gather_gemm_gathered) == 1


def test_all_gather_drop_in_has_symm_mems_schema():
    ours = str(torch.ops.tpfuse.fused_all_gather_matmul.default._schema)
    assert ours == str(torch.ops.symm_mem.fused_all_gather_matmul.default._schema).replace("symm_mem::", "tpfuse::")


@pytest.mark.parametrize("a_shape, gather_dim", [((16, 32), 0), ((8, 3, 32), 0), ((2, 64, 32), 1),
                                                 ((2, 3, 64, 32), 2), ((2, 16, 4, 32), 1)])
@pytest.mark.parametrize("return_A", [True, False])
def test_all_gather_drop_in_fake_shapes_are_symm_mems(group, a_shape, gather_dim, return_A):
    Bs = [meta(48, 32).t(), meta(32, 24)]  # an nn.Linear weight's transpose, and a K x N matrix
    ours = tpfuse.fused_all_gather_matmul(meta(*a_shape), Bs, gather_dim, group.group_name, return_A=return_A)
    theirs = torch.ops.symm_mem.fused_all_gather_matmul(meta(*a_shape), Bs, gather_dim, group.group_name,
                                                        return_A=return_A)
    gathered = list(a_shape)
    gathered[gather_dim] *= group.size()
    gathered = tuple(gathered)
    if return_A:
        assert ours[0].shape == theirs[0].shape == gathered
    else:
        assert ours[0] is None and theirs[0] is None
    assert [out.shape for out in ours[1]] == [out.shape for out in theirs[1]] == \
        [(*gathered[:-1], 48), (*gathered[:-1], 24)]


def test_every_launch_passes_the_c_abis_arguments_with_the_inputs_dtype(group, monkeypatch):
    """The launches of the custom ops call the C ABI with as many arguments as its signatures take, the
    dtype's code (TPFUSE_DTYPE_BF16, then E4M3), the scaling and accumulation codes and the scales' pointers
    where the header has them; the problem carries the codes, computed once."""
    calls = []

    class Recorder:
        def call(self, name, *args):
            assert len(args) == len(_library._SIGNATURES[name]), name
            calls.append((name, args))

    monkeypatch.setattr(_ops, "library", lambda: Recorder())
    monkeypatch.setattr(_ops, "check_placement", lambda *named, scales=(): None)
    monkeypatch.setattr(_ops, "communicator", lambda group, device: SimpleNamespace(reserve=lambda *extents: 1))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    a, w, y = torch.zeros(64, 32, dtype=BF16), torch.zeros(48, 32, dtype=BF16), torch.zeros(64, 48, dtype=BF16)
    problem = _checks.check_problem(a, w, "nk", group.size())
    ag_problem = _checks.check_all_gather_problem(a, w, "nk", 1)
    assert problem.dtype_code == ag_problem.dtype_code == _library.DTYPE_CODES[BF16] == 0
    _ops._launch(a, w, None, torch.zeros(problem.rows_per_rank, 48, dtype=BF16), problem, group.group_name)
    _ops._launch_all_gather(a, w, None, y, None, ag_problem, group.group_name)
    _ops._gemm(a, w, y, ag_problem)
    # The dtype, scaling and accumulation follow weight_layout in each: comm, m, n, k, world_size, weight_layout,
    # dtype, scaling, accumulation, batch, a, w, a_scale, w_scale, ...; and m, n, k, weight_layout, dtype, scaling,
    # accumulation, a, w, a_scale, w_scale, ... for the plain GEMM. BF16: no scaling, null scales.
    codes = {name: (args[6:9] + args[12:14]) if name != "tpfuse_gemm" else (args[4:7] + args[9:11])
             for name, args in calls}
    assert codes == {"tpfuse_gemm_reduce_scatter": (0, 0, 0, None, None),
                     "tpfuse_all_gather_gemm": (0, 0, 0, None, None), "tpfuse_gemm": (0, 0, 0, None, None)}
    calls.clear()
    a_scale, w_scale = torch.ones(64, 1), torch.ones(1, 48)
    for use_fast_accum, scales in ((True, (a_scale, w_scale)), (False, (a_scale[:1, 0], w_scale[0, :1]))):
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        problem = _checks.check_problem(a8, w8, "nk", group.size(), a_scale=scales[0], w_scale=scales[1],
                                        use_fast_accum=use_fast_accum)
        _ops._launch(a8, w8, None, torch.zeros(problem.rows_per_rank, 48, dtype=BF16), problem, group.group_name,
                     a_scale=scales[0], w_scale=scales[1])
    assert [args[6:9] + args[12:14] for _, args in calls] == [
        (1, 2, 1, a_scale.data_ptr(), w_scale.data_ptr()), (1, 1, 0, a_scale.data_ptr(), w_scale.data_ptr())]
    calls.clear()
    # Blockwise, through the public function, its op and the out= op: TPFUSE_SCALING_BLOCKWISE, promoted.
    a8, w8 = torch.zeros(64, 256, dtype=torch.float8_e4m3fn), torch.zeros(200, 256, dtype=torch.float8_e4m3fn)
    a_blocks, w_blocks = torch.ones(64, 2), torch.ones(2, 2)
    tpfuse.gemm_reduce_scatter(a8, w8, group, a_scale=a_blocks, w_scale=w_blocks)
    tpfuse.gemm_reduce_scatter(a8, w8, group, out=torch.zeros(64 // group.size(), 200, dtype=BF16),
                               a_scale=a_blocks, w_scale=w_blocks)
    assert [args[1:9] + args[12:14] for _, args in calls] == [
        (64, 200, 256, group.size(), 1, 1, 3, 0, a_blocks.data_ptr(), w_blocks.data_ptr())] * 2
    calls.clear()
    gathered = torch.zeros(64, 32, dtype=torch.float8_e4m3fn)
    for use_fast_accum, scales in ((True, (a_scale, w_scale)), (False, (a_scale[:1, 0], w_scale[0, :1]))):
        x8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        ag_problem = _checks.check_all_gather_problem(x8, w8, "nk", 1, x_scale=scales[0], w_scale=scales[1],
                                                      use_fast_accum=use_fast_accum)
        _ops._launch_all_gather(x8, w8, None, y, gathered, ag_problem, group.group_name, x_scale=scales[0],
                                w_scale=scales[1])
    # The all-gather's: ..., dtype, scaling, accumulation, batch, x, w, x_scale, w_scale, bias, y, gathered_x
    assert [args[6:9] + args[12:17] for _, args in calls] == [
        (1, 2, 1, a_scale.data_ptr(), w_scale.data_ptr(), None, y.data_ptr(), gathered.data_ptr()),
        (1, 1, 0, a_scale.data_ptr(), w_scale.data_ptr(), None, y.data_ptr(), gathered.data_ptr())]
    calls.clear()
    # Blockwise, through the public all-gather (both ops) and quantize_all_gather_gemm: TPFUSE_SCALING_BLOCKWISE,
    # promoted, x_scale this rank's (M/P, K/128).
    x8, w8 = torch.zeros(64, 256, dtype=torch.float8_e4m3fn), torch.zeros(200, 256, dtype=torch.float8_e4m3fn)
    x_blocks, w_blocks = torch.ones(64, 2), torch.ones(2, 2)
    tpfuse.all_gather_gemm(x8, w8, group, x_scale=x_blocks, w_scale=w_blocks)
    tpfuse.all_gather_gemm(x8, w8, group, return_gathered=True, x_scale=x_blocks, w_scale=w_blocks)
    p = group.size()
    # comm, m, n, k, world_size, weight_layout, dtype, scaling, accumulation, batch, x, w, x_scale, w_scale
    assert [args[1:10] + args[12:14] for _, args in calls] == [
        (64 * p, 200, 256, p, 1, 1, 3, 0, 1, x_blocks.data_ptr(), w_blocks.data_ptr())] * 2
    calls.clear()
    tpfuse.quantize_all_gather_gemm(torch.zeros(64, 256, dtype=BF16), w8, group, w_scale=w_blocks,
                                    scaling="blockwise")
    [(_, args)] = calls
    assert args[1:10] + args[13:14] == (64 * p, 200, 256, p, 1, 1, 3, 0, 1, w_blocks.data_ptr())
    assert args[12] is not None
