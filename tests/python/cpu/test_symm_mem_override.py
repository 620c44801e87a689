"""tpfuse.use_for_symm_mem: the override registers as the CUDA kernel of torch's symm_mem ops and gives
them back; by case, a call goes to tpfuse (on any dimension of A but the last, with the strides of torch's
Meta implementation) or falls back to torch's kernel, logged once per (op, reason) and counted by
tpfuse.stats(); the same for the FP8 scaled ops in the installed torch's schemas; and Inductor's
micro-pipeline TP pass, run on CPU, puts the symm_mem ops into a compiled graph whose calls reach tpfuse.

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
    def to_meta(value):
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    moved = [[to_meta(t) for t in a] if isinstance(a, list) else to_meta(a) for a in args]
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


FP8 = torch.float8_e4m3fn
SCALED = "fused_scaled_matmul_reduce_scatter"
# torch 2.7's schema has scatter_dim; later ones orig_scatter_dim, scatter_dim_after_maybe_reshape and output_shape.
LATER_SCHEMA = "output_shape" in [argument.name for argument in
                                  torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default._schema.arguments]


def scaled_args(A, B, A_scale, B_scale, dim, group, reduce_op="sum", output_shape=None, dim_after_reshape=None,
                **optional):
    """(args, kwargs) of a symm_mem.fused_scaled_matmul_reduce_scatter call in the installed torch's schema:
    the product viewed as output_shape (default A's leading dimensions and N) reduce-scattered along dim (torch
    2.7: A's dim; later: the output's dim, and A scattered along dim_after_reshape by torch's own kernel)."""
    values = {"A": A, "B": B, "A_scale": A_scale, "B_scale": B_scale, "reduce_op": reduce_op, "scatter_dim": dim,
              "orig_scatter_dim": dim, "scatter_dim_after_maybe_reshape": dim if dim_after_reshape is None else
              dim_after_reshape, "group_name": group.group_name,
              "output_shape": [*A.shape[:-1], B.shape[1]] if output_shape is None else list(output_shape)}
    schema = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default._schema
    args = [values[argument.name] for argument in schema.arguments if not argument.has_default_value()]
    return args, {"out_dtype": BF16, **optional}


def call_scaled(*args, **kwargs):
    args, kwargs = scaled_args(*args, **kwargs)
    return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*args, **kwargs)


def fp8_ints(*shape, seed=0):
    """FP8 (e4m3) entries in {-1, 0, 1}."""
    return ints(*shape, seed=seed).to(FP8)


def powers_of_2(*shape, seed=0):
    """FP32 scales 2^-2 to 2^2: scaled sums of small integers stay exact in BF16."""
    generator = torch.Generator().manual_seed(seed)
    return torch.pow(2.0, torch.randint(-2, 3, shape, generator=generator).float())


def fp8_operands(A_shape, dim, layout, scaling, seed, n=16):
    """Each of the 2 ranks' A (FP8, A_shape, contiguous or token-major), its weight (n x K, B is its transpose view)
    and their scales (tensorwise: one element each; rowwise: A's leading dimensions and 1, and (1, n))."""
    A = [(token_major(A_shape, dim, seed=seed + r) if layout == "token_major" else ints(*A_shape, seed=seed + r))
         .to(FP8) for r in range(2)]
    weights = [fp8_ints(n, A_shape[-1], seed=seed + 10 + r) for r in range(2)]
    a_shape, w_shape = ((), ()) if scaling == "tensorwise" else ((*A_shape[:-1], 1), (1, n))
    a_scale, w_scale = powers_of_2(*a_shape, seed=seed + 20), powers_of_2(*w_shape, seed=seed + 30)
    # Rank 1's a_scale twice rank 0's: every sum is (an integer of at most 3 K/P) * a_scale * w_scale, exact.
    return A, weights, [(a_scale * 2**r, w_scale) for r in range(2)]


def dequantized_product(A, weight, A_scale, B_scale):
    """torch._scaled_mm's product of A's rows and weight^T, exactly (FP64), in A's leading shape."""
    return (A.double() * A_scale.double()) @ (weight.double() * B_scale.double().reshape(-1, 1)).t()


# (A's shape on each rank, the scattered dimension, how A lies, the output's shape for the later schema's 2-D A
# or None); P = 2. A contiguous A of more than one sequence needs each rank's rows of a sequence in whole slabs.
SCALED_CASES = {
    "dim0": ((8, 32), 0, "contiguous", None),
    "dim0_3d": ((4, 3, 32), 0, "contiguous", None),
    "dim1_contiguous": ((2, 128, 32), 1, "contiguous", None),
    "dim1_token_major": ((2, 6, 32), 1, "token_major", None),
    "dim1_4d_token_major": ((3, 4, 2, 32), 1, "token_major", None),
    # Later schema: Inductor's reshape of A to 2-D before _scaled_mm, the output's shape given
    "reshaped_dim1": ((256, 32), 1, "contiguous", (2, 128, 16)),
    "reshaped_dim0": ((12, 32), 0, "contiguous", (4, 3, 16)),
}


@pytest.mark.parametrize("case", SCALED_CASES)
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_fp8_reduce_scatter_served(on_cpu, group, case, scaling, use_fast_accum):
    """fused_scaled_matmul_reduce_scatter in the installed torch's schema: served by tpfuse's FP8 launch with
    the scaling and accumulation asked for, exact against the dequantized product reduce-scattered along the
    output's dimension, with the strides of torch's Meta implementation."""
    sim, torch_calls = on_cpu
    A_shape, dim, layout, output_shape = SCALED_CASES[case]
    if output_shape is not None and not LATER_SCHEMA:
        pytest.skip("torch 2.7's schema has no output_shape: A is passed in the output's leading shape")
    A, weights, scales = fp8_operands(A_shape, dim, layout, scaling, seed=200)
    kwargs = dict(output_shape=output_shape, dim_after_reshape=0 if output_shape else None,
                  use_fast_accum=use_fast_accum)
    outs = sim.run(lambda r: call_scaled(A[r], weights[r].t(), *scales[r], dim, group, **kwargs))
    assert torch_calls == [] and len(sim.launches) == 2
    assert {(p.dtype_code, p.scaling, p.accumulation) for p in sim.problems} == {
        (1, 1 if scaling == "tensorwise" else 2, int(use_fast_accum))}
    full = sum(dequantized_product(A[r], weights[r], *scales[r]) for r in range(2))
    shape = output_shape or (*A_shape[:-1], 16)
    for rank, out in enumerate(outs):
        expected = full.reshape(shape).chunk(2, dim=dim)[rank]
        assert out.dtype == BF16 and torch.equal(out.double(), expected)
        args, meta_kwargs = scaled_args(A[rank], weights[rank].t(), *scales[rank], dim, group, **kwargs)
        assert out.stride() == meta_strides(SCALED, *args, **meta_kwargs)
    assert tpfuse.stats()[SCALED] == {"served": 2, "fallbacks": {}}


def test_fp8_avg_is_the_sum_over_p(on_cpu, group):
    sim, torch_calls = on_cpu
    A, weights, scales = fp8_operands((8, 32), 0, "contiguous", "rowwise", seed=300)
    outs = sim.run(lambda r: call_scaled(A[r], weights[r].t(), *scales[r], 0, group, reduce_op="avg"))
    assert torch_calls == []
    full = sum(dequantized_product(A[r], weights[r], *scales[r]) for r in range(2)) / 2
    for rank, out in enumerate(outs):
        assert torch.equal(out.double(), full[4 * rank:4 * (rank + 1)])


def fp8_misaligned(*shape):
    count = torch.Size(shape).numel()
    return torch.zeros(count + 1, dtype=FP8)[1:].view(*shape)


def scaled_fallback(A=None, B=None, A_scale=None, B_scale=None, dim=0, **optional):
    """A call of the scaled reduce-scatter, each argument tpfuse serves unless given."""
    A = fp8_ints(8, 32) if A is None else A
    B = fp8_ints(16, 32).t() if B is None else B
    A_scale = torch.ones(()) if A_scale is None else A_scale
    B_scale = torch.ones(()) if B_scale is None else B_scale
    return lambda g: call_scaled(A, B, A_scale, B_scale, dim, g, **optional)


SCALED_FALLBACKS = {
    # case: (call, reason, what the log says)
    "reduce_op": (scaled_fallback(reduce_op="max"), "reduce_op", "reduce_op = 'max'"),
    "bias": (scaled_fallback(bias=torch.zeros(16, dtype=BF16)), "bias",
             "torch adds the bias to every rank's partial product (P times in the sum)"),
    "result_scale": (scaled_fallback(result_scale=torch.ones(())), "result_scale", "result_scale is given"),
    "out_dtype_none": (scaled_fallback(out_dtype=None), "out_dtype",
                       "out_dtype = None (A's dtype, torch.float8_e4m3fn); tpfuse's outputs are torch.bfloat16"),
    "out_dtype_fp32": (scaled_fallback(out_dtype=torch.float32), "out_dtype", "out_dtype = torch.float32"),
    "e5m2": (scaled_fallback(A=fp8_ints(8, 32).to(torch.float8_e5m2)), "dtype",
             "A is torch.float8_e5m2; tpfuse's FP8 kernels take torch.float8_e4m3fn"),
    "bf16": (scaled_fallback(A=ints(8, 32), B=ints(16, 32).t()), "dtype", "A is torch.bfloat16"),
    "row_major_B": (scaled_fallback(B=fp8_ints(32, 16)), "layout",
                    "B (32, 16) with strides (16, 1) is not column-major (the transpose view of a contiguous N x K "
                    "weight)"),
    "k": (scaled_fallback(A=fp8_ints(8, 24), B=fp8_ints(16, 24).t()), "n_or_k",
          "B's K = 24 is not a multiple of 16 (FP8 rows of whole 16 bytes)"),
    "n": (scaled_fallback(B=fp8_ints(12, 32).t()), "n_or_k", "B's N = 12 is not a multiple of 8"),
    "mixed_scales": (scaled_fallback(A_scale=torch.ones(8, 1)), "scales",
                     "A_scale (8, 1) and B_scale () are neither one element each (tensorwise) nor rowwise: "
                     "A_scale (8, 1) and B_scale (1, 16)"),
    "scale_dtype": (scaled_fallback(B_scale=torch.ones((), dtype=torch.float64)), "scales",
                    "B_scale is torch.float64; tpfuse's scales are torch.float32"),
    # Blockwise scales (A's one per row and 128 of K; B's per 128 x 128 block, in DeepSeek-V3's N/128 x K/128 or
    # torch's K/128 x N/128): the op cannot express them, though tpfuse's gemm_reduce_scatter takes them.
    "blockwise": (scaled_fallback(A=fp8_ints(8, 256), B=fp8_ints(16, 256).t(), A_scale=torch.ones(8, 2),
                                  B_scale=torch.ones(1, 2)), "scales",
                  "A_scale (8, 2) and B_scale (1, 2) are neither one element each (tensorwise) nor rowwise: "
                  "A_scale (8, 1) and B_scale (1, 16)"),
    "blockwise_k_by_n": (scaled_fallback(A=fp8_ints(8, 256), B=fp8_ints(16, 256).t(), A_scale=torch.ones(8, 2),
                                         B_scale=torch.ones(2, 1)), "scales", "A_scale (8, 2) and B_scale (2, 1)"),
    "blockwise_one_k_block": (scaled_fallback(A=fp8_ints(8, 128), B=fp8_ints(16, 128).t(), A_scale=torch.ones(8, 1),
                                              B_scale=torch.ones(1, 1)), "scales", "A_scale (8, 1) and B_scale (1, 1)"),
    "rows": (scaled_fallback(A=fp8_ints(7, 32)), "rows", "A.shape[0] = 7 does not divide"),
    "shard": (scaled_fallback(A=fp8_ints(2, 8, 32), dim=1), "shard",
              "is 2 sequences whose share on each of the 2 ranks is 4 rows"),
    "dim": (scaled_fallback(A=fp8_ints(2, 8, 32), dim=2), "dim", "scatter dimension 2 of A (2, 8, 32)"),
    "A_layout": (scaled_fallback(A=fp8_ints(32, 8).t()), "layout", "A (8, 32) with strides (1, 8)"),
    "alignment": (scaled_fallback(A=fp8_misaligned(8, 32)), "alignment", "A's data is not 16-byte aligned"),
}
if LATER_SCHEMA:
    SCALED_FALLBACKS["output_shape"] = (
        scaled_fallback(output_shape=[3, 5, 16]), "shape",
        "output_shape [3, 5, 16] is not the shape of the product of A (8, 32) and B (32, 16)")


@pytest.mark.parametrize("case", SCALED_FALLBACKS)
def test_fp8_reduce_scatter_falls_back_and_logs_each_reason_once(on_cpu, group, caplog, case):
    _, torch_calls = on_cpu
    call, reason, message = SCALED_FALLBACKS[case]
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        call(group)
        call(group)
    assert torch_calls == [SCALED, SCALED]
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert len(logged) == 1 and f"symm_mem.{SCALED} call ({reason}: " in logged[0] and message in logged[0], logged
    assert tpfuse.stats()[SCALED] == {"served": 0, "fallbacks": {reason: 2}}


SCALED_AG = "fused_all_gather_scaled_matmul"


def scaled_all_gather_args(A, Bs, A_scale, B_scales, gather_dim, group, biases=None, result_scales=None,
                           out_dtypes=None, use_fast_accum=None):
    """The arguments of a symm_mem.fused_all_gather_scaled_matmul call in the installed torch's schema (its
    lists one entry per B: no bias or result scale, BF16 out, promoted sums unless given)."""
    values = {"A": A, "Bs": Bs, "A_scale": A_scale, "B_scales": B_scales, "gather_dim": gather_dim,
              "group_name": group.group_name, "biases": biases or [None] * len(Bs),
              "result_scales": result_scales or [None] * len(Bs), "out_dtypes": out_dtypes or [BF16] * len(Bs),
              "use_fast_accum": use_fast_accum or [False] * len(Bs)}
    return [values[argument.name] for argument in torch.ops.symm_mem.fused_all_gather_scaled_matmul.default._schema
            .arguments]


def call_scaled_all_gather(*args, **kwargs):
    return torch.ops.symm_mem.fused_all_gather_scaled_matmul(*scaled_all_gather_args(*args, **kwargs))


def fp8_shard(shape, dim, layout, seed):
    return (token_major(shape, dim, seed=seed) if layout == "token_major" else ints(*shape, seed=seed)).to(FP8)


# (A_shard's shape on each rank, gather_dim, how A lies); P = 2
SCALED_ALL_GATHER_CASES = {
    "dim0": ((8, 32), 0, "contiguous"),
    "dim0_3d": ((4, 3, 32), 0, "contiguous"),
    "dim1_token_major": ((2, 3, 32), 1, "token_major"),
    "dim1_contiguous": ((2, 3, 32), 1, "contiguous"),
    "dim1_4d_token_major": ((3, 2, 2, 32), 1, "token_major"),
}


@pytest.mark.parametrize("case", SCALED_ALL_GATHER_CASES)
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("use_fast_accum", [False, True])
def test_fp8_all_gather_served(on_cpu, group, case, scaling, use_fast_accum):
    """fused_all_gather_scaled_matmul: served by tpfuse's FP8 all-gather, one fused call per B with the scaling
    and accumulation asked for, a BF16 bias on the second B; exact against the dequantized product of the
    gathered A (rowwise: every rank's rows with their own scales), with the strides of torch's Meta
    implementation."""
    sim, torch_calls = on_cpu
    shape, dim, layout = SCALED_ALL_GATHER_CASES[case]
    shards = [fp8_shard(shape, dim, layout, seed=600 + r) for r in range(2)]
    gate, up = [fp8_ints(16, 32, seed=610 + r) for r in range(2)], [fp8_ints(32, 32, seed=620 + r) for r in range(2)]
    biases = [ints(32, seed=630 + r) for r in range(2)]
    if scaling == "tensorwise":
        A_scales = [powers_of_2(seed=640 + r) for r in range(2)]
        B_scales = [[powers_of_2(seed=650 + r), powers_of_2(1, 1, seed=660 + r)] for r in range(2)]
    else:
        A_scales = [powers_of_2(*shape[:-1], 1, seed=640 + r) for r in range(2)]
        B_scales = [[powers_of_2(1, 16, seed=650 + r), powers_of_2(1, 32, seed=660 + r)] for r in range(2)]
    fast = [use_fast_accum, not use_fast_accum]

    def arguments(r):
        return scaled_all_gather_args(shards[r], [gate[r].t(), up[r].t()], A_scales[r], B_scales[r], dim, group,
                                      biases=[None, biases[r]], use_fast_accum=fast)

    results = sim.run(lambda r: torch.ops.symm_mem.fused_all_gather_scaled_matmul(*arguments(r)))
    assert torch_calls == [] and sorted(op for _, op in sim.launches) == ["all_gather_gemm"] * 4
    assert sorted((q.dtype_code, q.scaling, q.accumulation) for q in sim.all_gather_problems) == sorted(
        [(1, 1 if scaling == "tensorwise" else 2, int(f)) for f in fast] * 2)
    A = torch.cat([shard.double() for shard in shards], dim=dim)
    for rank, (gathered, (y_gate, y_up)) in enumerate(results):
        A_scale = A_scales[rank] if scaling == "tensorwise" else torch.cat(A_scales, dim=dim)
        assert gathered.dtype == FP8 and torch.equal(gathered.double(), A)
        assert y_gate.dtype == y_up.dtype == BF16
        assert torch.equal(y_gate.double(), dequantized_product(A, gate[rank], A_scale, B_scales[rank][0]))
        assert torch.equal(y_up.double(), dequantized_product(A, up[rank], A_scale, B_scales[rank][1]) +
                           biases[rank].double())
        assert (gathered.stride(), [y_gate.stride(), y_up.stride()]) == meta_strides(SCALED_AG, *arguments(rank))
    assert tpfuse.stats()[SCALED_AG] == {"served": 2, "fallbacks": {}}


def test_fp8_all_gather_of_one_row_per_rank_is_rowwise(on_cpu, group):
    """A shard of one row with an A_scale of (1, 1): torch takes it as that row's scale (rowwise), so every rank's
    row keeps its own scale."""
    sim, torch_calls = on_cpu
    shards = [fp8_ints(1, 32, seed=700 + r) for r in range(2)]
    weights = [fp8_ints(16, 32, seed=710 + r) for r in range(2)]
    A_scales = [torch.full((1, 1), 2.0 ** r) for r in range(2)]
    B_scales = [powers_of_2(1, 16, seed=720 + r) for r in range(2)]
    results = sim.run(lambda r: call_scaled_all_gather(shards[r], [weights[r].t()], A_scales[r], [B_scales[r]], 0,
                                                       group))
    assert torch_calls == [] and {q.scaling for q in sim.all_gather_problems} == {2}
    A = torch.cat([shard.double() for shard in shards])
    for rank, (_, [y]) in enumerate(results):
        assert torch.equal(y.double(), dequantized_product(A, weights[rank], torch.cat(A_scales), B_scales[rank]))


def scaled_all_gather_fallback(A=None, Bs=None, A_scale=None, B_scales=None, dim=0, **lists):
    """A call of the scaled all-gather, each argument tpfuse serves unless given."""
    A = fp8_ints(8, 32) if A is None else A
    Bs = [fp8_ints(16, 32).t()] if Bs is None else Bs
    A_scale = torch.ones(()) if A_scale is None else A_scale
    B_scales = [torch.ones(()) for _ in Bs] if B_scales is None else B_scales
    return lambda g: call_scaled_all_gather(A, Bs, A_scale, B_scales, dim, g, **lists)


SCALED_ALL_GATHER_FALLBACKS = {
    # case: (call, reason, what the log says)
    "empty": (scaled_all_gather_fallback(Bs=[], B_scales=[]), "empty", "Bs is empty"),
    "lists": (scaled_all_gather_fallback(biases=[None, None]), "arguments",
              "1 B_scales, 2 biases, 1 result_scales, 1 out_dtypes, 1 use_fast_accum for 1 Bs"),
    "dim": (scaled_all_gather_fallback(A=fp8_ints(2, 8, 32), dim=2), "dim", "gather_dim = 2 of A (2, 8, 32)"),
    "e5m2": (scaled_all_gather_fallback(A=fp8_ints(8, 32).to(torch.float8_e5m2)), "dtype",
             "A is torch.float8_e5m2; tpfuse's FP8 kernels take torch.float8_e4m3fn"),
    "e5m2_b": (scaled_all_gather_fallback(Bs=[fp8_ints(16, 32).to(torch.float8_e5m2).t()]), "dtype",
               "B[0] is torch.float8_e5m2"),
    "row_major_B": (scaled_all_gather_fallback(Bs=[fp8_ints(32, 16)]), "layout",
                    "B[0] (32, 16) with strides (16, 1) is not column-major"),
    "k_mismatch": (scaled_all_gather_fallback(Bs=[fp8_ints(16, 64).t()]), "shape",
                   "B[0] (64, 16) is K x N for K = 64, and A's rows have 32 elements"),
    "k": (scaled_all_gather_fallback(A=fp8_ints(8, 24), Bs=[fp8_ints(16, 24).t()]), "n_or_k",
          "B[0]'s K = 24 is not a multiple of 16"),
    "n": (scaled_all_gather_fallback(Bs=[fp8_ints(12, 32).t()]), "n_or_k", "B[0]'s N = 12 is not a multiple of 8"),
    "result_scale": (scaled_all_gather_fallback(result_scales=[torch.ones(())]), "result_scale",
                     "result_scales[0] is given; tpfuse takes none"),
    "out_dtype_none": (scaled_all_gather_fallback(out_dtypes=[None]), "out_dtype",
                       "out_dtypes[0] = None (A's dtype, torch.float8_e4m3fn); tpfuse's outputs are torch.bfloat16"),
    "out_dtype_fp32": (scaled_all_gather_fallback(out_dtypes=[torch.float32]), "out_dtype",
                       "out_dtypes[0] = torch.float32"),
    "bias_fp32": (scaled_all_gather_fallback(biases=[torch.zeros(16)]), "bias",
                  "biases[0] (16,) of torch.float32 on cpu: tpfuse adds a contiguous torch.bfloat16 bias of N = 16"),
    "scale_dtype": (scaled_all_gather_fallback(A_scale=torch.ones((), dtype=torch.float64)), "scales",
                    "A_scale is torch.float64 on cpu; tpfuse's scales are torch.float32"),
    "replicated_rowwise": (scaled_all_gather_fallback(A_scale=torch.ones(16, 1), B_scales=[torch.ones(1, 16)]),
                           "scales", "A_scale (16, 1) is neither one element (tensorwise) nor this rank's rowwise "
                           "scales (8, 1) (a rowwise A_scale of every rank's rows is torch's replicated form)"),
    "mixed_scales": (scaled_all_gather_fallback(A_scale=torch.ones(8, 1)), "scales",
                     "A_scale (8, 1) is rowwise, and B_scales[0] () is not (1, 16), one per output column"),
    "b_scale_rowwise": (scaled_all_gather_fallback(B_scales=[torch.ones(1, 16)]), "scales",
                        "A_scale () is one element (tensorwise), and B_scales[0] (1, 16) is not"),
    # Blockwise scales (A's this rank's rows' one per 128 of K; B's per 128 x 128 block, in DeepSeek-V3's N/128 x K/128
    # or torch's K/128 x N/128), which the op cannot express, though tpfuse.all_gather_gemm takes them
    "blockwise": (scaled_all_gather_fallback(A=fp8_ints(8, 256), Bs=[fp8_ints(16, 256).t()],
                                             A_scale=torch.ones(8, 2), B_scales=[torch.ones(1, 2)]), "scales",
                  "A_scale (8, 2) is neither one element (tensorwise) nor this rank's rowwise scales (8, 1)"),
    "blockwise_k_by_n": (scaled_all_gather_fallback(A=fp8_ints(8, 256), Bs=[fp8_ints(16, 256).t()],
                                                    A_scale=torch.ones(8, 2), B_scales=[torch.ones(2, 1)]), "scales",
                         "A_scale (8, 2) is neither one element (tensorwise) nor this rank's rowwise scales (8, 1)"),
    "blockwise_3d": (scaled_all_gather_fallback(A=fp8_ints(2, 4, 256), Bs=[fp8_ints(16, 256).t()],
                                                A_scale=torch.ones(2, 4, 2), B_scales=[torch.ones(1, 2)], dim=1),
                     "scales", "A_scale (2, 4, 2) is neither one element (tensorwise) nor this rank's rowwise scales "
                     "(2, 4, 1)"),
    "blockwise_one_k_block": (scaled_all_gather_fallback(A=fp8_ints(8, 128), Bs=[fp8_ints(16, 128).t()],
                                                         A_scale=torch.ones(8, 1), B_scales=[torch.ones(1, 1)]),
                              "scales", "A_scale (8, 1) is rowwise, and B_scales[0] (1, 1) is not (1, 16)"),
    # One row per rank, K = 128, N at most 128: every blockwise scale is one element; torch takes A_scale as the
    # row's (rowwise), and B_scale of one element is not one per column
    "blockwise_one_row": (scaled_all_gather_fallback(A=fp8_ints(1, 128), Bs=[fp8_ints(16, 128).t()],
                                                     A_scale=torch.ones(1, 1), B_scales=[torch.ones(1, 1)]),
                          "scales", "A_scale (1, 1) is rowwise, and B_scales[0] (1, 1) is not (1, 16)"),
    "alignment": (scaled_all_gather_fallback(A=fp8_misaligned(8, 32)), "alignment", "A's data is not 16-byte aligned"),
}


@pytest.mark.parametrize("case", SCALED_ALL_GATHER_FALLBACKS)
def test_fp8_all_gather_falls_back_and_logs_each_reason_once(on_cpu, group, caplog, case):
    _, torch_calls = on_cpu
    call, reason, message = SCALED_ALL_GATHER_FALLBACKS[case]
    with caplog.at_level(logging.WARNING, logger="tpfuse.symm_mem"):
        call(group)
        call(group)
    assert torch_calls == [SCALED_AG, SCALED_AG]
    logged = [record.getMessage() for record in caplog.records if record.name == "tpfuse.symm_mem"]
    assert len(logged) == 1 and f"symm_mem.{SCALED_AG} call ({reason}: " in logged[0] and message in logged[0], logged
    assert tpfuse.stats()[SCALED_AG] == {"served": 0, "fallbacks": {reason: 2}}


def test_stats_count_the_fp8_reduce_scatter_beside_the_bf16_one(on_cpu, group):
    sim, _ = on_cpu
    A, weights, scales = fp8_operands((8, 32), 0, "contiguous", "tensorwise", seed=400)
    for _ in range(2):
        sim.run(lambda r: call_scaled(A[r], weights[r].t(), *scales[r], 0, group))
    call_scaled(A[0], weights[0].t(), *scales[0], 0, group, out_dtype=None)
    a, w = [ints(8, 16, seed=r) for r in range(2)], [ints(8, 16, seed=10 + r) for r in range(2)]
    sim.run(lambda r: call_reduce_scatter(group, a[r], w[r].t()))
    sim.run(lambda r: call_scaled_all_gather(A[r], [weights[r].t()], *(scale for scale in scales[r][:1]),
                                             [scales[r][1]], 0, group))
    assert tpfuse.stats() == {
        "fused_matmul_reduce_scatter": {"served": 2, "fallbacks": {}},
        "fused_all_gather_matmul": {"served": 0, "fallbacks": {}},
        SCALED: {"served": 4, "fallbacks": {"out_dtype": 1}},
        SCALED_AG: {"served": 2, "fallbacks": {}},
    }


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


@pytest.mark.skipif(not LATER_SCHEMA, reason="torch 2.7 has no CPU kernel of torch._scaled_mm to compile")
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_fp8_reached_from_inductors_async_tp_pass(on_cpu, group, scaling):
    """Inductor's micro-pipeline TP pass turns _scaled_mm on [b, s, K] reshaped to 2-D, reshaped back and
    reduce-scattered along the sequence (dim 1), into symm_mem.fused_scaled_matmul_reduce_scatter with the
    later schema (A 2-D, output_shape [b, s, N], orig_scatter_dim 1), which tpfuse serves: exact on both ranks."""
    sim, torch_calls = on_cpu
    b, s, k, n = 2, 128, 32, 16

    def layer(x, weight, a_scale, w_scale):
        y = torch._scaled_mm(x.reshape(-1, k), weight.t(), a_scale, w_scale, out_dtype=BF16, use_fast_accum=True)
        return funcol.reduce_scatter_tensor(y.reshape(b, s, n), "sum", 1, group)

    A, weights, scales = fp8_operands((b * s, k), 0, "contiguous", scaling, seed=500)
    compiled = torch.compile(layer, fullgraph=True)
    torch._dynamo.reset()
    with torch._inductor.config.patch(_micro_pipeline_tp=True), symmetric_memory._test_mode():
        sim.rehearse(lambda r: compiled(A[0].view(b, s, k), weights[0], *scales[0]))
        tpfuse.reset_stats()  # the rehearsal's call
        outs = sim.run(lambda r: compiled(A[r].view(b, s, k), weights[r], *scales[r]))
    assert torch_calls == [] and tpfuse.stats()[SCALED] == {"served": 2, "fallbacks": {}}
    assert {(p.batch, p.accumulation) for p in sim.problems} == {(b, 1)}
    full = sum(dequantized_product(A[r], weights[r], *scales[r]) for r in range(2)).view(b, s, n)
    for rank, out in enumerate(outs):
        assert torch.equal(out.double(), full.chunk(2, dim=1)[rank])
