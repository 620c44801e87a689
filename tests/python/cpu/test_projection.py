"""bench/projection.py: E at P projected from one GPU's push timeline, on synthetic JSON."""

import importlib.util
import json
import math
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "bench" / "projection.py"
spec = importlib.util.spec_from_file_location("projection", SCRIPT)
projection = importlib.util.module_from_spec(spec)
spec.loader.exec_module(projection)


def comm_rows(gbps, latency_ms, world_size=2):
    rows = []
    for m in (512, 2048, 8192):
        row = {"m": m, "n": 4096, "k_per_rank": 1024}
        row["t_comm_ms"] = projection.comm_ms(row, world_size, gbps, latency_ms)
        rows.append(row)
    return rows


def test_fit_recovers_bandwidth_and_latency():
    gbps, latency, worst = projection.fit_comm(comm_rows(250.0, 0.02), 2)
    assert math.isclose(gbps, 250.0, rel_tol=1e-9) and math.isclose(latency, 0.02, rel_tol=1e-9)
    assert worst < 1e-9


def test_queue_waits_for_the_link_but_not_before_issue():
    # 1000 bytes per ms of link; 1000 bytes issued evenly over 2 ms: never queued, lands at 2 ms.
    assert math.isclose(projection.land_ms([0.5, 0.5], 2.0, 1000.0, 1e-3), 2.0)
    # All of 4000 bytes issued in the first of two 1 ms bins: 3 ms of backlog after it, 1 ms of it
    # drained in the second bin.
    assert math.isclose(projection.land_ms([1.0, 0.0], 2.0, 4000.0, 1e-3), 4.0)


def test_projection_of_a_row():
    # M = 1000, N = 1000 at P = 8: 2 MB of output, 1.75 MB pushed; at 1 GB/s (1e6 bytes/ms) that is 1.75 ms.
    row = {"m": 1000, "n": 1000, "k_per_rank": 128, "t_fused_solo_ms": 1.0, "tl_last_push": 0.5,
           "tl_bins": " ".join(["0.5", "0.5"]), "tl_share_25": 0.5, "tl_share_50": 1.0, "tl_share_75": 1.0}
    p = projection.project(row, 8, 0.9, gbps=2.0, latency_ms=0.1, link_gbps=1.0)
    assert math.isclose(p["t_link_ms"], 1.75)
    assert math.isclose(p["t_land_ms"], 1.75)  # issued over 0.5 ms, the link's 1.75 ms sets it
    assert math.isclose(p["tail_ms"], 0.5)
    assert math.isclose(p["t_fused_ms"], 2.25)
    t_comm = 7 / 8 * 2e6 / 2e6 + 0.1
    assert math.isclose(p["t_comm_ms"], t_comm)
    assert math.isclose(p["E"], (0.9 + t_comm - 2.25) / t_comm)
    assert math.isclose(p["E_hideable"], (0.9 + t_comm - 2.25) / 0.9)
    assert projection.project({"m": 1, "n": 1, "k_per_rank": 1}, 8, 1.0, 1.0, 0.0, 1.0) is None


def test_main_prints_the_table(tmp_path, capsys):
    comm = tmp_path / "fused.json"
    comm.write_text(json.dumps({"meta": {"options": {"mode": "fused", "gpus": 2}}, "results": comm_rows(200.0, 0.03)}))
    row = {"proj": "p", "m": 2048, "n": 4096, "k_per_rank": 1024, "t_fused_solo_ms": 0.1, "t_cublas_ms": 0.09,
           "tl_last_push": 0.9, "tl_bins": " ".join(["0.01"] * 100), "tl_share_25": 0.28, "tl_share_50": 0.55,
           "tl_share_75": 0.83}
    proxy = tmp_path / "proxy.json"
    proxy.write_text(json.dumps({"meta": {"options": {"mode": "proxy", "tp": 8, "layout": "nk"}},
                                 "results": [row, {"proj": "q", "m": 512, "n": 4096, "k_per_rank": 1024}]}))
    gemm = tmp_path / "gemm.json"
    gemm.write_text(json.dumps({"meta": {"options": {"mode": "gemm", "layout": "nk"}},
                                "results": [{"m": 2048, "n": 4096, "k_per_rank": 1024, "t_cublas_ms": 0.08}]}))
    out_json = tmp_path / "projection.json"
    assert projection.main([str(proxy), "--gemm", str(gemm), "--comm", str(comm), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "200.0 GB/s + 0.0300 ms" in out and "1 shapes" in out and "* M in {512,2048}: 1 shapes" in out
    result = json.loads(out_json.read_text())["results"][0]
    assert result["t_gemm_ms"] == 0.08 and result["t_fused_ms"] >= 0.1
