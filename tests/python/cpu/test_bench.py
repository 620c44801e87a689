"""The benchmark's pure parts: docs/SPEC.md's sweep, shape and option parsing, the input sets' count and FP8
operands, torch's FP8 op's arguments in the installed schema, the interleaved timing loop (on a fake clock), the
summary's counts, the table and JSON without NaN; the FP8 measurement with blockwise scales on stand-ins for
torch._scaled_mm, tpfuse's call and the timing loop (the scales' layouts each takes, the columns left out and why,
the checking path)."""

import argparse
import json
import math

import pytest
import torch

import tpfuse
from tpfuse import bench
from tpfuse.float8 import ACTIVATION_BLOCK, dequantize_blockwise


def test_the_sweep_is_specs_sixteen_shapes_with_k_over_tp():
    shapes = bench.parse_shapes("", 8)
    assert len(shapes) == 16
    assert {shape.m for shape in shapes} == {512, 2048, 8192, 32768}
    assert {(shape.proj, shape.n, shape.k_per_rank) for shape in shapes} == {
        ("llama3-70b.o_proj", 8192, 1024), ("llama3-70b.down_proj", 8192, 3584),
        ("mixtral-8x22b.o_proj", 6144, 768), ("mixtral-8x22b.down_proj", 6144, 2048)}
    assert bench.parse_shapes("512,8192,1024;96,72,40", 8) == [
        bench.Shape("llama3-70b.o_proj", 512, 8192, 1024), bench.Shape("custom", 96, 72, 40)]


def row(t_gemm, t_comm, t_fused, t_async_tp, rule="pass", rule_async_tp="pass"):
    row = {"t_gemm_ms": t_gemm, "t_comm_ms": t_comm, "t_seq_ms": t_gemm + t_comm, "rule": rule,
           "rule_async_tp": rule_async_tp, "wrong": 0, "status": "ok"}
    bench.efficiency(row, t_fused, "")
    bench.efficiency(row, t_async_tp, "_async_tp")
    row["t_fused_ms"], row["t_async_tp_ms"] = t_fused, t_async_tp
    return row


def test_efficiency_and_summary():
    compute_bound = row(2.0, 1.0, 2.05, 2.5)         # E = 0.95 and 0.5
    link_bound = row(1.0, 2.0, 2.2, 3.0, rule="FAIL")  # E_hideable = 0.8 and 0.0
    assert math.isclose(compute_bound["E"], 0.95) and math.isclose(compute_bound["speedup"], 3.0 / 2.05)
    assert math.isclose(link_bound["E_hideable"], 0.8) and math.isclose(link_bound["E_hideable_async_tp"], 0.0)
    summary = bench.summarize([compute_bound, link_bound, {"status": "skipped: M not divisible by 3 GPUs"}])
    assert summary["shapes"] == 3 and summary["fused_ran"] == 2 and summary["compute_bound"] == 1
    assert summary["E_met"] == 1 and summary["E_hideable_met"] == 1 and summary["async_tp_E_met"] == 0
    assert math.isclose(summary["E_min"], 0.95) and math.isclose(summary["async_tp_E_hideable_min"], 0.0)
    assert summary["rule_failures"] == 1 and summary["async_tp_rule_failures"] == 0 and summary["failed"] == 0
    assert math.isclose(summary["fused_over_async_tp_geomean"], math.sqrt(2.5 / 2.05 * 3.0 / 2.2))


def test_json_has_no_nan_and_the_table_shows_missing_values():
    document = bench.finite_or_none({"results": [{"E": float("nan"), "m": 512, "status": "ok"}]})
    assert json.loads(json.dumps(document, allow_nan=False)) == {"results": [{"E": None, "m": 512, "status": "ok"}]}
    line = bench.table_line({"proj": "custom", "m": 96, "status": "ok"})
    assert line.split()[:3] == ["custom", "96", "-"] and line.endswith("ok")
    assert len(bench.header_line().split()) == len(bench.COLUMNS) + 1  # "#" first


def test_without_torchs_communicator_the_symmetric_path_says_why(monkeypatch):
    # tpfuse cannot call NCCL on torch's communicator (another NCCL library): no window, only the ring.
    monkeypatch.setattr(bench, "torch_nccl_comm", lambda group, device: None)
    run = type("FakeRun", (), {"group": None, "device": None, "world_size": 8})()
    windows = bench.SymmetricWindows(run, 512, 8192, 3)
    assert windows.partials == [] and "torch's NCCL communicator" in windows.reason
    windows.free()  # nothing to free: no NCCL call


def test_fp8_options():
    args = bench.parse_args([])
    assert args.fp8 is None and not args.fast_accum
    args = bench.parse_args(["--fp8", "rowwise", "--fast-accum"])
    assert args.fp8 == "rowwise" and args.fast_accum
    assert bench.parse_args(["--fp8", "tensorwise"]).fp8 == "tensorwise"
    assert bench.parse_args(["--fp8", "blockwise"]).fp8 == "blockwise"
    for argv in (["--fast-accum"], ["--fp8", "columnwise"], ["--fp8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def test_fast_accumulation_is_refused_with_blockwise_scales(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--fp8", "blockwise", "--fast-accum"])
    assert "--fast-accum does not apply to --fp8 blockwise" in capsys.readouterr().err


def test_the_input_sets_stream_twice_the_l2_of_each_format():
    shape = bench.Shape("mixtral-8x22b.o_proj", 512, 6144, 768)
    # Per set: BF16 inputs 10,223,616 bytes, E4M3 ones 5,111,808, the BF16 partial, rows and out 7,864,320.
    assert bench.input_set_count(shape, 8, False, 40_000_000, 1 << 40) == 5  # 80 MB / 18,087,936
    assert bench.input_set_count(shape, 8, True, 40_000_000, 1 << 40) == 7   # 80 MB / 12,976,128
    assert bench.input_set_count(shape, 8, True, 50 << 20, 1 << 40) == bench.MAX_INPUT_SETS
    fp8_set_bytes = 18_087_936 + 5_111_808
    assert bench.input_set_count(shape, 8, True, 50 << 20, 4 * 3 * fp8_set_bytes) == 3  # a quarter of the free memory
    assert bench.input_set_count(shape, 8, True, 50 << 20, 0) == 1


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_fp8_input_sets_are_quantized_random_data(scaling):
    m, n, k = 64, 32, 48
    shape = bench.Shape("custom", m, n, k)

    def sets(rank):
        run = type("FakeRun", (), {"device": torch.device("cpu"), "world_size": 4, "rank": rank,
                                   "args": argparse.Namespace(fp8=scaling)})()
        return bench.fp8_input_sets(shape, run, seed=5, shape_index=2, count=3)

    rank_0, rank_1 = sets(0), sets(1)
    assert len(rank_0) == 3
    for a, w, a_scale, w_scale in rank_0:
        assert a.dtype == w.dtype == torch.float8_e4m3fn and a.shape == (m, k) and w.shape == (n, k)
        assert a_scale.dtype == w_scale.dtype == torch.float32
        if scaling == "tensorwise":
            assert a_scale.numel() == 1 and w_scale.numel() == 1
        else:
            assert a_scale.shape == (m, 1) and w_scale.shape == (1, n)
        for x, scale in ((a, a_scale), (w, w_scale.reshape(-1, 1))):
            values = x.float()
            # Each tensor's (row's) largest magnitude at E4M3's largest, most entries nonzero: normal draws.
            assert values.abs().max() == 448.0 and (values != 0).float().mean() > 0.9
            assert (values * scale).std().item() == pytest.approx(1.0, rel=0.2)
    assert not torch.equal(rank_0[0][0].float(), rank_0[1][0].float())  # sets differ
    assert not torch.equal(rank_0[0][0].float(), rank_1[0][0].float())  # and ranks


def blockwise_sets(m, n, k, count, rank=0):
    run = type("FakeRun", (), {"device": torch.device("cpu"), "world_size": 4, "rank": rank,
                               "args": argparse.Namespace(fp8="blockwise")})()
    return bench.fp8_input_sets(bench.Shape("custom", m, n, k), run, seed=5, shape_index=2, count=count)


def test_blockwise_input_sets_have_tpfuses_scales_and_torchs_layouts_of_them():
    m, n, k = 64, 160, 256  # N not a multiple of 128: w's last row of blocks partial
    rank_0 = blockwise_sets(m, n, k, 2)
    for a, w, a_scale, w_scale in rank_0:
        assert a.dtype == w.dtype == torch.float8_e4m3fn and a.shape == (m, k) and w.shape == (n, k)
        assert a_scale.dtype == w_scale.dtype == torch.float32
        assert a_scale.shape == (m, 2) and w_scale.shape == (2, 2)
        assert a_scale.is_contiguous() and w_scale.is_contiguous()  # tpfuse's form
        values = dequantize_blockwise(a, a_scale, ACTIVATION_BLOCK)
        assert values.std().item() == pytest.approx(1.0, rel=0.2)
        # torch._scaled_mm's blockwise form: scale_a (M, K/128) strides (1, M), scale_b (K/128, N/128) strides
        # (1, K/128); the same values.
        scale_a, scale_b = bench.scaled_mm_scales(a_scale, w_scale, "blockwise")
        assert scale_a.shape == (m, 2) and scale_a.stride() == (1, m) and torch.equal(scale_a, a_scale)
        assert scale_b.shape == (2, 2) and scale_b.stride() == (1, 2) and torch.equal(scale_b, w_scale.t())
    assert not torch.equal(rank_0[0][0].float(), rank_0[1][0].float())
    assert not torch.equal(rank_0[0][0].float(), blockwise_sets(m, n, k, 1, rank=1)[0][0].float())
    for scaling in ("tensorwise", "rowwise"):
        scales = (torch.ones(m, 1), torch.ones(1, n))
        assert bench.scaled_mm_scales(*scales, scaling) == scales


class FakeTimingRun:
    """measure_fp8's run: the group, the options, and a timing loop that calls each call once (i = its place)
    and gives it 1 + its place in ms."""

    def __init__(self, group, check):
        self.group = group
        self.args = argparse.Namespace(fp8="blockwise", fast_accum=False, check=check)
        self.timed = []

    def time_interleaved(self, calls):
        self.timed = list(calls)
        for i, call in enumerate(calls.values()):
            call(i)
        return {name: (1.0 + i, 10.0) for i, name in enumerate(calls)}


def measure_blockwise(group, monkeypatch, scaled_mm, check=False):
    """measure_fp8 on blockwise sets (M 64, N 384, K/P 256) with `scaled_mm` as torch._scaled_mm and a tpfuse call
    that takes only its contiguous scales; (the row, the run)."""
    m, n, k, p = 64, 384, 256, group.size()
    fp8_sets = blockwise_sets(m, n, k, 2)
    sets = [(None, None, None, None, torch.empty(m // p, n, dtype=torch.bfloat16)) for _ in fp8_sets]
    partials = [torch.empty(m, n, dtype=torch.bfloat16) for _ in fp8_sets]

    def fused(a, w, group, out, a_scale, w_scale, use_fast_accum):
        assert a_scale.shape == (m, 2) and w_scale.shape == (3, 2) and not use_fast_accum
        assert a_scale.is_contiguous() and w_scale.is_contiguous()
        out.fill_(1.0)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(tpfuse, "gemm_reduce_scatter", fused)
    run, row = FakeTimingRun(group, check), {"t_comm_ms": 0.5, "wrong": 0}
    bench.measure_fp8(row, run, sets, fp8_sets, partials, lambda i: None, lambda i: None)
    return row, run


def test_blockwise_fp8_times_torchs_blockwise_scaled_mm_and_leaves_its_fused_op_out(group, monkeypatch):
    seen = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum, out):
        # The layouts torch._scaled_mm's blockwise form takes (torch 2.11, H100); others raise there.
        assert scale_a.shape == (64, 2) and scale_a.stride() == (1, 64)
        assert scale_b.shape == (2, 3) and scale_b.stride() == (1, 2)
        assert b.shape == (256, 384) and out_dtype == torch.bfloat16 and not use_fast_accum
        seen.append(out.data_ptr())

    row, run = measure_blockwise(group, monkeypatch, scaled_mm)
    assert run.timed == ["gemm_fp8", "seq_fp8", "fused_fp8", "fused_bf16"]
    assert len(seen) == 3  # the trial, T_gemm_fp8's call and T_seq_fp8's
    assert row["gemm_fp8_status"] == "ok" and row["async_tp_fp8_status"] == bench.BLOCKWISE_ASYNC_TP_REASON
    assert "blockwise" in row["async_tp_fp8_status"]
    assert row["t_gemm_fp8_ms"] == 1.0 and row["t_fused_fp8_ms"] == 3.0 and row["fused_fp8_over_bf16"] == 4.0 / 3.0
    assert math.isclose(row["E_fp8"], (1.0 + 0.5 - 3.0) / 0.5) and row["speedup_fp8"] == 2.0 / 3.0
    assert not any("async_tp" in key for key in row if key != "async_tp_fp8_status")
    assert "rule_fp8" not in row  # no check


def test_where_torchs_scaled_mm_refuses_blockwise_scales_its_columns_are_left_out_with_the_reason(group, monkeypatch):
    def scaled_mm(*args, **kwargs):
        raise RuntimeError("Invalid scaling configuration.")

    row, run = measure_blockwise(group, monkeypatch, scaled_mm)
    assert run.timed == ["fused_fp8", "fused_bf16"]
    assert row["gemm_fp8_status"] == "RuntimeError: Invalid scaling configuration."
    assert row["t_fused_fp8_ms"] == 1.0 and row["fused_fp8_over_bf16"] == 2.0
    assert not {"t_gemm_fp8_ms", "t_seq_fp8_ms", "E_fp8", "E_hideable_fp8", "speedup_fp8"} & set(row)
    summary = bench.summarize([dict(row, status="ok")], fp8=True)
    assert summary["fused_fp8_ran"] == 0 and math.isclose(summary["fused_fp8_over_bf16_geomean"], 2.0)
    assert "host_fused_fp8_over_mm_us_max" not in summary


def test_blockwise_fp8_is_checked_against_the_blockwise_reference_and_unfused_path(group, monkeypatch):
    p, seen = group.size(), []

    def reference(a, w, a_scale, w_scale, group, blockwise=False):
        assert blockwise
        return torch.ones(64 // p, 384, dtype=torch.float64)

    def unfused(a, w, a_scale, w_scale, group):
        seen.append(a_scale.shape)
        return torch.full((64 // p, 384), 1.0078125, dtype=torch.bfloat16)  # 2^-7 off

    def tensorwise_unfused(*args, **kwargs):
        raise AssertionError("the unfused path of one scale product per tensor or row")

    monkeypatch.setattr(bench, "fp8_reference_rows", reference)
    monkeypatch.setattr(bench, "fp8_blockwise_unfused_rows", unfused)
    monkeypatch.setattr(bench, "fp8_unfused_rows", tensorwise_unfused)
    row, _ = measure_blockwise(group, monkeypatch, lambda *args, **kwargs: None, check=True)
    assert seen == [(64, 2)]
    assert row["unfused_fp8_max_rel"] == row["unfused_fp8_norm_rel"] == 2 ** -7
    assert row["fused_fp8_max_rel"] == 0.0 and row["rule_fp8"] == "pass" and row["wrong"] == 0


def test_torchs_fp8_op_takes_the_arguments_in_the_installed_schema(group):
    # Through torch's Meta implementation: _scaled_mm(a, w.t()) reduce-scattered along its rows.
    m, n, k, p = 64, 32, 48, group.size()
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    w = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    for a_scale, w_scale in ((torch.empty((), device="meta"), torch.empty((), device="meta")),
                             (torch.empty(m, 1, device="meta"), torch.empty(1, n, device="meta"))):
        args = bench.torch_fp8_reduce_scatter_args(a, w, a_scale, w_scale, group.group_name)
        out = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*args, out_dtype=torch.bfloat16,
                                                                    use_fast_accum=True)
        assert out.shape == (m // p, n) and out.dtype == torch.bfloat16


def test_torchs_ops_are_timed_only_while_tpfuse_does_not_override_them():
    assert bench.torch_kernel_reason() == ""
    with tpfuse.use_for_symm_mem():
        assert "override" in bench.torch_kernel_reason()
    assert bench.torch_kernel_reason() == ""


def test_interleaved_timing_runs_each_call_in_turn_on_the_next_input_set(group, monkeypatch):
    clock = [0.0]  # ms; the calls advance it, the events read it

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            self.at = clock[0]

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    run = bench.Run.__new__(bench.Run)
    run.args, run.group, run.device, run.gate_cycles = argparse.Namespace(warmup=1, iters=3), group, "cpu", 0
    run.align = lambda: None
    seen = []

    def call(name, cost):
        def timed(i):
            seen.append((name, i))
            clock[0] += cost * (1 + i)
        return timed

    times = run.time_interleaved({"mm": call("mm", 1.0), "fused": call("fused", 10.0)})
    assert seen == [("mm", 0), ("fused", 1), ("mm", 2), ("fused", 3), ("mm", 4), ("fused", 5), ("mm", 6), ("fused", 7)]
    assert list(times) == ["mm", "fused"]
    assert times["mm"][0] == 5.0 and times["fused"][0] == 60.0  # medians of 3, 5, 7 and 40, 60, 80: no warm-up
    assert all(host_us >= 0 for _, host_us in times.values())
    seen.clear()
    assert run.time(call("mm", 1.0))[0] == 3.0 and [i for _, i in seen] == [0, 1, 2, 3]


def fp8_columns(row, t_gemm, t_fused, t_async_tp, t_fused_bf16, rule="pass"):
    """row's FP8 columns: T_seq_fp8 = T_gemm_fp8 + T_comm."""
    row.update(t_gemm_fp8_ms=t_gemm, t_seq_fp8_ms=t_gemm + row["t_comm_ms"], t_fused_fp8_ms=t_fused,
               t_async_tp_fp8_ms=t_async_tp, t_fused_bf16_ms=t_fused_bf16, rule_fp8=rule, rule_async_tp_fp8="pass",
               host_gemm_fp8_us=10.0, host_fused_fp8_us=14.0)
    bench.efficiency(row, t_fused, "_fp8", "_fp8")
    bench.efficiency(row, t_async_tp, "_async_tp_fp8", "_fp8")
    return row


def test_fp8_efficiency_and_summary():
    # BF16 compute bound, FP8 link bound (its GEMM faster than the reduce-scatter): E_hideable_fp8 = 0.5 / 0.8.
    first = fp8_columns(row(2.0, 1.0, 2.05, 2.5), t_gemm=0.8, t_fused=1.3, t_async_tp=1.6, t_fused_bf16=2.6)
    second = fp8_columns(row(3.0, 1.0, 3.1, 3.5), t_gemm=1.5, t_fused=1.55, t_async_tp=2.0, t_fused_bf16=3.1,
                         rule="FAIL")
    assert math.isclose(first["E_hideable_fp8"], 0.5 / 0.8) and math.isclose(first["speedup_fp8"], 1.8 / 1.3)
    assert math.isclose(second["E_fp8"], 0.95) and math.isclose(second["E_async_tp_fp8"], 0.5)
    rows = [first, second, {"status": "skipped: M not divisible by 3 GPUs"}]
    assert not any("fp8" in key for key in bench.summarize(rows))
    summary = bench.summarize(rows, fp8=True)
    assert summary["compute_bound"] == 2 and summary["fp8_compute_bound"] == 1
    assert summary["fused_fp8_ran"] == 2 and summary["async_tp_fp8_ran"] == 2
    assert summary["fp8_E_met"] == 1 and summary["async_tp_fp8_E_met"] == 0 and math.isclose(summary["fp8_E_min"], 0.95)
    assert summary["fp8_rule_failures"] == 1 and summary["async_tp_fp8_rule_failures"] == 0
    assert summary["rule_failures"] == 0
    assert math.isclose(summary["fused_fp8_over_bf16_geomean"], math.sqrt(2.6 / 1.3 * 3.1 / 1.55))
    assert math.isclose(summary["fused_fp8_over_async_tp_fp8_geomean"], math.sqrt(1.6 / 1.3 * 2.0 / 1.55))
    assert summary["host_fused_fp8_over_mm_us_max"] == 4.0


def test_the_fp8_table_and_the_comparison():
    columns = bench.table_columns(True)
    assert [key for key, *_ in columns[-2:]] == ["wrong", "status"] and columns[:-2] == bench.COLUMNS[:-2] + \
        bench.FP8_COLUMNS
    assert len(bench.header_line(columns).split()) == len(columns) + 1
    line = bench.table_line({"proj": "custom", "m": 96, "t_fused_fp8_ms": 0.5, "rule_fp8": "pass", "wrong": 0,
                             "status": "ok"}, columns)
    assert "0.5000" in line and "pass" in line and line.split()[-2:] == ["0", "ok"]
    assert bench.table_columns(False) == bench.COLUMNS
    bf16 = bench.comparison(bench.parse_args([]))
    fp8 = bench.comparison(bench.parse_args(["--fp8", "rowwise", "--fast-accum"]))
    assert "torch.mm" in bf16 and "_scaled_mm" not in bf16
    assert fp8.startswith(bf16) and "rowwise scales, fast accumulation" in fp8
    assert "torch._scaled_mm" in fp8 and "fused_scaled_matmul_reduce_scatter" in fp8 and "BF16 call" in fp8
    blockwise = bench.comparison(bench.parse_args(["--fp8", "blockwise"]))
    assert "blockwise scales)" in blockwise and "fused_scaled_matmul_reduce_scatter" not in blockwise
    assert blockwise.endswith("torch._scaled_mm + reduce_scatter_tensor and tpfuse's BF16 call")
