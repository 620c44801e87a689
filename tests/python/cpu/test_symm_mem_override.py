"""tpfuse.use_for_symm_mem: the override registers as the CUDA kernel of torch's symm_mem ops and gives
them back; by case, a call goes to tpfuse or falls back to torch's kernel, each reason logged once; and
Inductor's micro-pipeline TP pass, run on CPU, puts the symm_mem ops into a compiled graph whose calls
reach tpfuse.

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
from tpfuse import symm_mem
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
    2: every test that launches runs both ranks), torch's kernels recorded, the log-once memory fresh."""
    monkeypatch.setattr(symm_mem, "_device_reason", lambda device: None)
    monkeypatch.setattr(symm_mem, "_logged", set())
    torch_calls = []

    def recorder(name, result):
        def kernel(*args, **kwargs):
            torch_calls.append(name)
            return result(*args, **kwargs)
        return kernel

    monkeypatch.setattr(symmetric_memory, "_fused_matmul_reduce_scatter", recorder(
        "fused_matmul_reduce_scatter", lambda A, B, *args: A.new_zeros((A.shape[0] // 2, *A.shape[1:-1], B.shape[1]))))
    monkeypatch.setattr(symmetric_memory, "_fused_all_gather_matmul", recorder(
        "fused_all_gather_matmul", lambda A, Bs, *args, return_A=True: (
            None, [A.new_zeros((2 * A.shape[0], *A.shape[1:-1], B.shape[1])) for B in Bs])))
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
    if not sim.launches:
        # Some torch versions' pass leaves this CPU graph unfused (2.15 does; 2.7 and 2.11 fuse it).
        pytest.skip(f"torch {torch.__version__}'s async-TP pass did not rewrite the graph on CPU")
    assert sorted(op for _, op in sim.launches) == ["all_gather_gemm"] * 2 + ["gemm"] * 2 + ["gemm_reduce_scatter"] * 2
    X = torch.cat(xs).double()
    full_out = sum(X @ gate[r].double().t() @ down[r].double().t() for r in range(2))
    for rank, (A, h_gate, h_up, out) in enumerate(results):
        assert torch.equal(A.double(), X)
        assert torch.equal(h_gate.double(), X @ gate[rank].double().t())
        assert torch.equal(h_up.double(), X @ up[rank].double())
        assert out.shape == (4, 3, 16) and torch.equal(out.double(), full_out[4 * rank:4 * (rank + 1)])


def test_avg_is_the_sum_over_p(on_cpu, group):
    """vLLM's async-TP pass asks for reduce_op "avg"."""
    sim, torch_calls = on_cpu
    a = [ints(8, 16, seed=40 + r) for r in range(2)]
    w = [ints(8, 16, seed=50 + r) for r in range(2)]
    outs = sim.run(lambda r: torch.ops.symm_mem.fused_matmul_reduce_scatter(a[r], w[r].t(), "avg", 0,
                                                                            group.group_name))
    assert torch_calls == []
    full = sum(a[r].double() @ w[r].double().t() for r in range(2)) / 2
    for rank, out in enumerate(outs):
        assert torch.equal(out.double(), full[4 * rank:4 * (rank + 1)])


def call_reduce_scatter(group, A, B, reduce_op="sum", scatter_dim=0):
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group.group_name)


def call_all_gather(group, A, Bs, gather_dim=0):
    return torch.ops.symm_mem.fused_all_gather_matmul(A, Bs, gather_dim, group.group_name, return_A=False)


FALLBACKS = {
    # reason: (call, what the log says)
    "reduce_op": (lambda g: call_reduce_scatter(g, ints(8, 16), ints(16, 8), reduce_op="max"), "reduce_op = 'max'"),
    "scatter_dim": (lambda g: call_reduce_scatter(g, ints(2, 8, 16), ints(16, 8), scatter_dim=1), "scatter_dim = 1"),
    "gather_dim": (lambda g: call_all_gather(g, ints(2, 8, 16), [ints(16, 8)], gather_dim=1), "gather_dim = 1"),
    "fp16": (lambda g: call_reduce_scatter(g, ints(8, 16).half(), ints(16, 8).half()), "torch.float16"),
    "n": (lambda g: call_reduce_scatter(g, ints(8, 16), ints(16, 12)), "N = 12 is not a multiple of 8"),
    "k": (lambda g: call_all_gather(g, ints(8, 12), [ints(12, 8)]), "K = 12 is not a multiple of 8"),
    "A_layout": (lambda g: call_reduce_scatter(g, ints(16, 8).t(), ints(16, 8)), "A (8, 16) with strides (1, 8)"),
    "B_layout": (lambda g: call_all_gather(g, ints(8, 16), [ints(16, 16)[:, :8]]), "B[0] (16, 8) with strides"),
    "rows": (lambda g: call_reduce_scatter(g, ints(7, 16), ints(16, 8)), "A.shape[0] = 7 does not divide"),
}


@pytest.mark.parametrize("reason", FALLBACKS)
def test_falls_back_to_torch_and_logs_each_reason_once(on_cpu, group, caplog, reason):
    _, torch_calls = on_cpu
    call, message = FALLBACKS[reason]
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        call(group)
        call(group)
    assert len(torch_calls) == 2
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert len(logged) == 1 and message in logged[0] and "torch's own kernel runs it" in logged[0], logged


def test_a_gpu_other_than_hopper_falls_back(group, monkeypatch, caplog):
    monkeypatch.setattr(symm_mem, "_logged", set())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert symm_mem._device_reason(torch.device("cuda", 0)) == \
        "gpu: the GPU is sm_80, tpfuse's kernels need Hopper (sm_90)"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(symm_mem, "library", lambda: (_ for _ in ()).throw(tpfuse.UnsupportedError("not built")))
    assert symm_mem._device_reason(torch.device("cuda", 0)) == "library: tpfuse's library cannot be loaded: not built"


def test_reached_from_inductors_async_tp_pass(on_cpu, group, monkeypatch):
    """Inductor's micro-pipeline TP pass (TorchTitan's async TP) rewrites all-gather + two matmuls (SwiGLU's
    gate and up) and matmul + reduce-scatter into the symm_mem ops, which the compiled graph calls, and
    which reach tpfuse: exact results on both ranks."""
    sim, torch_calls = on_cpu
    monkeypatch.setattr(torch._inductor.config, "_micro_pipeline_tp", True)

    def mlp(x, gate, up, down):
        X = funcol.all_gather_tensor(x, 0, group)
        return funcol.reduce_scatter_tensor((X @ gate.t()) * (X @ up.t()) @ down.t(), "sum", 0, group)

    xs = [ints(8, 16, seed=r) for r in range(2)]
    weights = [[ints(16, 16, seed=10 * i + r) for r in range(2)] for i in (1, 2, 3)]
    compiled = torch.compile(mlp, fullgraph=True)
    torch._dynamo.reset()
    # symm_mem's test mode makes every group count as symm_mem-enabled, as enable_symm_mem_for_group would.
    with symmetric_memory._test_mode():
        results = sim.run(lambda r: compiled(xs[r], *(w[r] for w in weights)))
    assert torch_calls == []
    if not sim.launches:
        # Some torch versions' pass leaves this CPU graph unfused (2.15 does; 2.7 and 2.11 fuse it).
        pytest.skip(f"torch {torch.__version__}'s async-TP pass did not rewrite the graph on CPU")
    assert sorted(op for _, op in sim.launches) == ["all_gather_gemm"] * 2 + ["gemm"] * 2 + ["gemm_reduce_scatter"] * 2
    X = torch.cat(xs).double()
    gate, up, down = ([t.double() for t in w] for w in weights)
    full = sum((X @ gate[r].t()) * (X @ up[r].t()) @ down[r].t() for r in range(2))
    for rank, out in enumerate(results):
        assert torch.equal(out.double(), full[8 * rank:8 * (rank + 1)])
