"""tpfuse.use_for_symm_mem: the override registers as the CUDA kernel of torch's symm_mem ops and gives
them back; by case, a call goes to tpfuse (on any dimension of A but the last, with the strides of torch's
Meta implementation) or falls back to torch's kernel, logged once per (op, reason) and counted by
tpfuse.stats(); the FP8 scaled ops pass to torch's, logged once; and Inductor's micro-pipeline TP pass, run
on CPU, puts the symm_mem ops into a compiled graph whose calls reach tpfuse.

No GPU here: the dispatch tests register the same override on the CPU key (SymmMemOverride("CPU")), the
device check is replaced (a Hopper GPU is assumed unless a test says otherwise), tpfuse's launches are
simulated (simulated_group.py), and torch's kernels are replaced by recorders where a test needs to see the
fallback taken."""

import logging

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed._symmetric_memory as symmetric_memory
from torch.testing._internal.distributed.fake_pg import FakeStore

import tpfuse
from tpfuse import _ops, symm_mem
from simulated_group import SimulatedGroup

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()


def kernel_of(op_name: str, key: str = "CUDA") -> str:
    """Where the active `key` kernel of symm_mem::op_name was registered (the dispatcher's table)."""
    for line in torch._C._dispatch_dump(f"symm_mem::{op_name}").splitlines():
        if line.startswith(f"{key}: "):
            return line
    return ""


def test_registers_on_cuda_and_restores_torchs_kernel():
    # The dispatcher's table names where each kernel was registered where torch keeps that record (2.8 on);
    # before, every Python registration reads the same, so the test compares the active kernel's line.
    before = {name: kernel_of(name) for name in symm_mem.OPS}
    assert all(line and "tpfuse" not in line for line in before.values())

    def ours(name: str) -> bool:
        line = kernel_of(name)
        named = "(none)" not in line
        return line != before[name] and (not named or ("tpfuse" in line and "symm_mem.py" in line))

    override = tpfuse.use_for_symm_mem()
    try:
        assert all(ours(name) for name in symm_mem.OPS)
        with tpfuse.use_for_symm_mem():  # nested: the inner one leaves the registration to the outer
            pass
        assert all(ours(name) for name in symm_mem.OPS)
    finally:
        override.restore()
    assert {name: kernel_of(name) for name in symm_mem.OPS} == before
    assert not override.active
    override.restore()  # a second restore does nothing
    with tpfuse.use_for_symm_mem():  # and it can be turned on again
        assert all(ours(name) for name in symm_mem.OPS)
    assert {name: kernel_of(name) for name in symm_mem.OPS} == before


@pytest.fixture
def on_cpu(group, monkeypatch):
    """The override on the CPU key, a Hopper GPU assumed, tpfuse's launches simulated (one process is rank 0 of
    2: every test that launches runs both ranks), torch's kernels recorded, the counts and the log-once memory
    fresh."""
    monkeypatch.setattr(symm_mem, "_device_fallback", lambda device: None)
    monkeypatch.setattr(symm_mem, "_logged", set())
    monkeypatch.setattr(symm_mem, "_counts", type(symm_mem._counts)())
    torch_calls = []

    def recorder(name, result):
        def kernel(*args, **kwargs):
            torch_calls.append(name)
            return result(*args, **kwargs)
        return kernel

    zeros = lambda A, *args, **kwargs: A.new_zeros(A.shape)  # noqa: E731 -- the shape does not matter here
    monkeypatch.setattr(symmetric_memory, "_fused_matmul_reduce_scatter", recorder("fused_matmul_reduce_scatter", zeros))
    monkeypatch.setattr(symmetric_memory, "_fused_all_gather_matmul", recorder(
        "fused_all_gather_matmul", lambda A, Bs, *args, return_A=True: (None, [A.new_zeros(A.shape) for B in Bs])))
    monkeypatch.setattr(symmetric_memory, "_fused_scaled_matmul_reduce_scatter", recorder(
        "fused_scaled_matmul_reduce_scatter", zeros))
    monkeypatch.setattr(symmetric_memory, "_fused_all_gather_scaled_matmul", recorder(
        "fused_all_gather_scaled_matmul", lambda A, Bs, *args: (A, [A.new_zeros(A.shape) for B in Bs])))
    sim = SimulatedGroup(group, monkeypatch)
    with symm_mem.SymmMemOverride("CPU"):
        yield sim, torch_calls


def ints(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, shape, generator=generator).to(BF16)


def test_served_by_tpfuse_with_nn_linear_weights_and_two_bs(on_cpu, group):
    sim, torch_calls = on_cpu
    xs = [ints(4, 3, 16, seed=rank) for rank in range(2)]
    gate, up = [ints(8, 16, seed=10 + r) for r in range(2)], [ints(16, 8, seed=20 + r) for r in range(2)]
    down = [ints(16, 8, seed=30 + r) for r in range(2)]

    def step(rank):
        A, (h_gate, h_up) = torch.ops.symm_mem.fused_all_gather_matmul(xs[rank], [gate[rank].t(), up[rank]], 0,
                                                                       group.group_name)
        out = torch.ops.symm_mem.fused_matmul_reduce_scatter(h_gate, down[rank].t(), "sum", 0, group.group_name)
        return A, h_gate, h_up, out

    results = sim.run(step)
    assert torch_calls == []
    assert sorted(op for _, op in sim.launches) == ["all_gather_gemm"] * 2 + ["gemm"] * 2 + ["gemm_reduce_scatter"] * 2
    X = torch.cat(xs).double()
    full_out = sum(X @ gate[r].double().t() @ down[r].double().t() for r in range(2))
    for rank, (A, h_gate, h_up, out) in enumerate(results):
        assert torch.equal(A.double(), X)
        assert torch.equal(h_gate.double(), X @ gate[rank].double().t())
        assert torch.equal(h_up.double(), X @ up[rank].double())
        assert out.shape == (4, 3, 16) and torch.equal(out.double(), full_out[4 * rank:4 * (rank + 1)])
    assert tpfuse.stats()["fused_all_gather_matmul"] == {"served": 2, "fallbacks": {}}
    assert tpfuse.stats()["fused_matmul_reduce_scatter"] == {"served": 2, "fallbacks": {}}


def test_avg_is_the_sum_over_p(on_cpu, group):
    """reduce_op "avg": vLLM's async-TP pass asked for it before it asked for "sum"."""
    sim, torch_calls = on_cpu
    a = [ints(8, 16, seed=40 + r) for r in range(2)]
    w = [ints(8, 16, seed=50 + r) for r in range(2)]
    outs = sim.run(lambda r: torch.ops.symm_mem.fused_matmul_reduce_scatter(a[r], w[r].t(), "avg", 0,
                                                                            group.group_name))
    assert torch_calls == []
    full = sum(a[r].double() @ w[r].double().t() for r in range(2)) / 2
    for rank, out in enumerate(outs):
        assert torch.equal(out.double(), full[4 * rank:4 * (rank + 1)])


def meta_strides(op, *args, **kwargs):
    """The strides of torch's Meta implementation of symm_mem.<op> (what compiled graphs assert) for these
    arguments, moved to the meta device with their strides."""
    moved = [[t.to("meta") for t in a] if isinstance(a, list) else a.to("meta") if isinstance(a, torch.Tensor) else a
             for a in args]
    result = getattr(torch.ops.symm_mem, op)(*moved, **kwargs)
    if isinstance(result, torch.Tensor):
        return result.stride()
    gathered, outs = result
    return None if gathered is None else gathered.stride(), [out.stride() for out in outs]


def token_major(shape, dim, seed):
    """A tensor of `shape` laid out so that its movedim(dim, 0) is contiguous, as Inductor's async-TP pass lays
    out A."""
    moved = list(shape)
    moved.insert(0, moved.pop(dim))
    return ints(*moved, seed=seed).movedim(0, dim)


# (A's shape on each rank, the dimension, how A lies); P = 2. Contiguous A of more than one sequence needs each
# rank's rows of a sequence in whole slabs of 64 for the reduce-scatter.
REDUCE_SCATTER_CASES = {
    "dim1_contiguous": ((2, 128, 16), 1, "contiguous"),
    "dim1_token_major": ((2, 6, 16), 1, "token_major"),
    "dim1_4d_token_major": ((3, 4, 2, 16), 1, "token_major"),
    "dim2_4d_contiguous": ((2, 2, 128, 16), 2, "contiguous"),
}


@pytest.mark.parametrize("case", REDUCE_SCATTER_CASES)
def test_reduce_scatter_on_a_dimension_past_0(on_cpu, group, case):
    sim, torch_calls = on_cpu
    shape, dim, layout = REDUCE_SCATTER_CASES[case]
    A = [token_major(shape, dim, seed=60 + r) if layout == "token_major" else ints(*shape, seed=60 + r)
         for r in range(2)]
    w = [ints(8, 16, seed=70 + r) for r in range(2)]
    outs = sim.run(lambda r: torch.ops.symm_mem.fused_matmul_reduce_scatter(A[r], w[r].t(), "sum", dim,
                                                                            group.group_name))
    assert torch_calls == [] and len(sim.launches) == 2
    full = sum(A[r].double() @ w[r].double().t() for r in range(2))
    for rank, out in enumerate(outs):
        assert torch.equal(out.double(), full.chunk(2, dim=dim)[rank])
        assert out.stride() == meta_strides("fused_matmul_reduce_scatter", A[rank], w[rank].t(), "sum", dim,
                                            group.group_name)


@pytest.mark.parametrize("shape, dim, layout", [((2, 3, 16), 1, "token_major"), ((2, 3, 16), 1, "contiguous"),
                                                ((3, 2, 2, 16), 1, "token_major"), ((2, 2, 3, 16), 2, "contiguous")])
@pytest.mark.parametrize("return_A", [True, False])
def test_all_gather_on_a_dimension_past_0_has_torchs_strides(on_cpu, group, monkeypatch, shape, dim, layout,
                                                              return_A):
    """The outputs are A.movedim(dim, 0) gathered, moved back, as torch's: a token-major shard (Inductor's
    layout) is gathered in place, another is copied token-major first."""
    sim, torch_calls = on_cpu
    shards = [token_major(shape, dim, seed=80 + r) if layout == "token_major" else ints(*shape, seed=80 + r)
              for r in range(2)]
    weights, ups = [ints(8, 16, seed=90 + r) for r in range(2)], [ints(16, 8, seed=95 + r) for r in range(2)]
    gathered_x = []
    launch = sim._launch_all_gather

    def recording_launch(x, *args):
        gathered_x.append(x.data_ptr())
        launch(x, *args)

    monkeypatch.setattr(_ops, "_launch_all_gather", recording_launch)
    results = sim.run(lambda r: torch.ops.symm_mem.fused_all_gather_matmul(
        shards[r], [weights[r].t(), ups[r]], dim, group.group_name, return_A=return_A))
    assert torch_calls == []
    assert (sorted(gathered_x) == sorted(shard.data_ptr() for shard in shards)) == (layout == "token_major")
    A = torch.cat([shard.double() for shard in shards], dim=dim)
    for rank, (gathered, (y, y_up)) in enumerate(results):
        assert torch.equal(y.double(), A @ weights[rank].double().t())
        assert torch.equal(y_up.double(), A @ ups[rank].double())
        assert (None if gathered is None else gathered.stride(), [y.stride(), y_up.stride()]) == meta_strides(
            "fused_all_gather_matmul", shards[rank], [weights[rank].t(), ups[rank]], dim, group.group_name,
            return_A=return_A)
        assert (gathered is None) != return_A and (gathered is None or torch.equal(gathered.double(), A))


def call_reduce_scatter(group, A, B, reduce_op="sum", scatter_dim=0):
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group.group_name)


def call_all_gather(group, A, Bs, gather_dim=0):
    return torch.ops.symm_mem.fused_all_gather_matmul(A, Bs, gather_dim, group.group_name, return_A=False)


def misaligned(*shape):
    count = torch.Size(shape).numel()
    return torch.zeros(count + 1, dtype=BF16)[1:].view(*shape)


FALLBACKS = {
    # case: (call, op, reason, what the log says)
    "reduce_op": (lambda g: call_reduce_scatter(g, ints(8, 16), ints(16, 8), reduce_op="max"),
                  "fused_matmul_reduce_scatter", "reduce_op", "reduce_op = 'max'"),
    "scatter_dim_last": (lambda g: call_reduce_scatter(g, ints(2, 8, 16), ints(16, 8), scatter_dim=2),
                         "fused_matmul_reduce_scatter", "dim", "scatter_dim = 2 of A (2, 8, 16)"),
    "gather_dim_last": (lambda g: call_all_gather(g, ints(2, 8, 16), [ints(16, 8)], gather_dim=2),
                        "fused_all_gather_matmul", "dim", "gather_dim = 2 of A (2, 8, 16)"),
    "fp16": (lambda g: call_reduce_scatter(g, ints(8, 16).half(), ints(16, 8).half()),
             "fused_matmul_reduce_scatter", "dtype", "torch.float16"),
    "n": (lambda g: call_reduce_scatter(g, ints(8, 16), ints(16, 12)),
          "fused_matmul_reduce_scatter", "n_or_k", "N = 12 is not a multiple of 8"),
    "k": (lambda g: call_all_gather(g, ints(8, 12), [ints(12, 8)]),
          "fused_all_gather_matmul", "n_or_k", "K = 12 is not a multiple of 8"),
    "A_layout": (lambda g: call_reduce_scatter(g, ints(16, 8).t(), ints(16, 8)),
                 "fused_matmul_reduce_scatter", "layout", "A (8, 16) with strides (1, 8)"),
    "B_layout": (lambda g: call_all_gather(g, ints(8, 16), [ints(16, 16)[:, :8]]),
                 "fused_all_gather_matmul", "layout", "B[0] (16, 8) with strides"),
    "rows": (lambda g: call_reduce_scatter(g, ints(7, 16), ints(16, 8)),
             "fused_matmul_reduce_scatter", "rows", "A.shape[0] = 7 does not divide"),
    "dim1_rows": (lambda g: call_reduce_scatter(g, ints(2, 5, 16), ints(16, 8), scatter_dim=1),
                  "fused_matmul_reduce_scatter", "rows", "A.shape[1] = 5 does not divide"),
    "shard": (lambda g: call_reduce_scatter(g, ints(2, 8, 16), ints(16, 8), scatter_dim=1),
              "fused_matmul_reduce_scatter", "shard", "is 2 sequences whose share on each of the 2 ranks is 4 rows"),
    "alignment": (lambda g: call_all_gather(g, misaligned(8, 16), [ints(16, 8)]),
                  "fused_all_gather_matmul", "alignment", "A's data is not 16-byte aligned"),
    "empty": (lambda g: call_all_gather(g, ints(8, 16), []), "fused_all_gather_matmul", "empty", "Bs is empty"),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_falls_back_to_torch_and_logs_each_reason_once(on_cpu, group, caplog, case):
    _, torch_calls = on_cpu
    call, op, reason, message = FALLBACKS[case]
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        call(group)
        call(group)
    assert torch_calls == [op, op]
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert len(logged) == 1 and f"symm_mem.{op} call ({reason}: " in logged[0] and message in logged[0] and \
        "torch's own kernel runs it" in logged[0], logged
    assert tpfuse.stats()[op] == {"served": 0, "fallbacks": {reason: 2}}


def test_the_log_is_once_per_op_and_reason(on_cpu, group, caplog):
    """The same reason from the other op is logged again; another reason of the same op too."""
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        for _ in range(2):
            call_reduce_scatter(group, ints(8, 16).half(), ints(16, 8).half())
            call_all_gather(group, ints(8, 16).half(), [ints(16, 8).half()])
            call_reduce_scatter(group, ints(8, 16), ints(16, 8), reduce_op="max")
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert [message.split(" call (")[0].split(".")[-1] + " " + message.split(" call (")[1].split(":")[0]
            for message in logged] == ["fused_matmul_reduce_scatter dtype", "fused_all_gather_matmul dtype",
                                       "fused_matmul_reduce_scatter reduce_op"]


def test_stats_count_served_calls_and_fallbacks_by_op_and_reason(on_cpu, group):
    sim, _ = on_cpu
    a, w = [ints(8, 16, seed=r) for r in range(2)], [ints(8, 16, seed=10 + r) for r in range(2)]
    for _ in range(3):
        sim.run(lambda r: call_reduce_scatter(group, a[r], w[r].t()))
    call_reduce_scatter(group, ints(7, 16), ints(16, 8))
    call_all_gather(group, ints(8, 16), [])
    assert tpfuse.stats() == {
        "fused_matmul_reduce_scatter": {"served": 6, "fallbacks": {"rows": 1}},
        "fused_all_gather_matmul": {"served": 0, "fallbacks": {"empty": 1}},
        "fused_scaled_matmul_reduce_scatter": {"served": 0, "fallbacks": {}},
        "fused_all_gather_scaled_matmul": {"served": 0, "fallbacks": {}},
    }
    tpfuse.reset_stats()
    assert all(entry == {"served": 0, "fallbacks": {}} for entry in tpfuse.stats().values())


def call_by_schema(op, values):
    """op called with, for each argument of its schema without a default, the value of that name (the FP8
    ops' arguments differ between torch versions)."""
    return op(**{argument.name: values[argument.name] for argument in op.default._schema.arguments
                 if not argument.has_default_value()})


def test_fp8_scaled_ops_pass_to_torch_logged_once(on_cpu, group, caplog):
    _, torch_calls = on_cpu
    A, B, scale = ints(8, 16), ints(16, 8), torch.ones(1)
    values = {"A": A, "B": B, "Bs": [B], "A_scale": scale, "B_scale": scale, "B_scales": [scale], "reduce_op": "sum",
              "scatter_dim": 0, "orig_scatter_dim": 0, "scatter_dim_after_maybe_reshape": 0, "output_shape": None,
              "gather_dim": 0, "group_name": group.group_name, "biases": [None], "result_scales": [None],
              "out_dtypes": [BF16], "use_fast_accum": [False]}
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        for _ in range(2):
            call_by_schema(torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter, values)
            call_by_schema(torch.ops.symm_mem.fused_all_gather_scaled_matmul, values)
    assert torch_calls == ["fused_scaled_matmul_reduce_scatter", "fused_all_gather_scaled_matmul"] * 2
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert len(logged) == 2 and all("(fp8: tpfuse does not serve the FP8 scaled symm_mem ops yet)" in message
                                    for message in logged)
    stats = tpfuse.stats()
    assert stats["fused_scaled_matmul_reduce_scatter"] == stats["fused_all_gather_scaled_matmul"] == \
        {"served": 0, "fallbacks": {"fp8": 2}}


def test_a_gpu_other_than_hopper_falls_back(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert symm_mem._check_device(torch.device("cuda", 0)) == \
        ("gpu", "the GPU is sm_80, tpfuse's kernels need Hopper (sm_90)")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(symm_mem, "library", lambda: (_ for _ in ()).throw(tpfuse.UnsupportedError("not built")))
    assert symm_mem._check_device(torch.device("cuda", 0)) == \
        ("library", "tpfuse's library cannot be loaded: not built")


def test_reached_from_inductors_async_tp_pass(on_cpu, group):
    """Inductor's micro-pipeline TP pass (TorchTitan's async TP) rewrites all-gather + two matmuls (SwiGLU's
    gate and up) and matmul + reduce-scatter into the symm_mem ops, which the compiled graph calls, and
    which reach tpfuse: exact results on both ranks. Compiled once, in the rehearsal (simulated_group.py
    says why not per rank thread); test_async_tp.py runs a whole layer, forward and backward."""
    sim, torch_calls = on_cpu

    def mlp(x, gate, up, down):
        X = funcol.all_gather_tensor(x, 0, group)
        return funcol.reduce_scatter_tensor((X @ gate.t()) * (X @ up.t()) @ down.t(), "sum", 0, group)

    xs = [ints(8, 16, seed=r) for r in range(2)]
    weights = [[ints(16, 16, seed=10 * i + r) for r in range(2)] for i in (1, 2, 3)]
    compiled = torch.compile(mlp, fullgraph=True)
    torch._dynamo.reset()
    # symm_mem's test mode makes every group count as symm_mem-enabled, as enable_symm_mem_for_group would.
    with torch._inductor.config.patch(_micro_pipeline_tp=True), symmetric_memory._test_mode():
        sim.rehearse(lambda r: compiled(xs[0], *(w[0] for w in weights)))
        results = sim.run(lambda r: compiled(xs[r], *(w[r] for w in weights)))
    assert torch_calls == []
    assert sorted(op for _, op in sim.launches) == ["all_gather_gemm"] * 2 + ["gemm"] * 2 + ["gemm_reduce_scatter"] * 2
    X = torch.cat(xs).double()
    gate, up, down = ([t.double() for t in w] for w in weights)
    full = sum((X @ gate[r].t()) * (X @ up[r].t()) @ down[r].t() for r in range(2))
    for rank, out in enumerate(results):
        assert torch.equal(out.double(), full[8 * rank:8 * (rank + 1)])
