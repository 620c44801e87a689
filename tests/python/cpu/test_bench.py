"""The benchmark's pure parts: docs/SPEC.md's sweep, shape parsing, the summary's counts, JSON without NaN."""

import json
import math

from tpfuse import bench


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
