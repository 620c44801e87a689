"""bench/projection.py: E at P projected from one GPU's push timeline, on synthetic JSON."""

import importlib.util
import json
import math
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "bench" / "projection.py"
spec = importlib.util.spec_from_file_location("projection", SCRIPT)
projection = importlib.util.module_from_spec(spec)
spec.loader.exec_module(projection)

MIB = 1 << 20


def comm_rows(gbps, latency_ms, world_size=2):
    rows = []
    for m in (512, 2048, 8192):
        row = {"m": m, "n": 4096, "k_per_rank": 1024}
        row["t_comm_ms"] = projection.comm_ms(row, world_size, gbps, latency_ms)
        rows.append(row)
    return rows


def shape_of(total_bytes):
    """A row whose M x N BF16 buffer is `total_bytes`."""
    return {"m": int(total_bytes // (2 * 1024)), "n": 1024, "k_per_rank": 128}


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


def test_power_law_between_published_points():
    points = ((1.0, 10.0), (4.0, 40.0), (16.0, 80.0))
    assert projection.power_law(points, 4.0) == 40.0
    assert math.isclose(projection.power_law(points, 2.0), 20.0)  # 10 -> 40 over 1 -> 4: linear there
    assert math.isclose(projection.power_law(points, 8.0), math.sqrt(40.0 * 80.0))
    assert projection.power_law(points, 0.5) is None and projection.power_law(points, 17.0) is None


def test_published_curves_at_their_points_and_between():
    ring = dict(projection.NCCL_8GPU_RING_US)
    # Each published size gives its published time; at P = 8 only.
    for size, us in ring.items():
        assert math.isclose(projection.ring8_ms(shape_of(size), 8), us / 1000)
    assert projection.ring8_ms(shape_of(8 * MIB), 4) is None
    # 16 MiB: halfway between 8 and 32 MiB in log(bytes), the geometric mean of their times.
    assert math.isclose(projection.ring8_ms(shape_of(16 * MIB), 8), math.sqrt(47.0 * 112.6) / 1000)
    # Outside the published sizes: no figure.
    assert projection.ring8_ms(shape_of(1 * MIB), 8) is None
    assert projection.ring8_ms(shape_of(2048 * MIB), 8) is None
    # The symmetric kernels: the published "on" times where published, the ring's from 256 MiB on.
    for size, us in ((2 * MIB, 10.8), (8 * MIB, 28.8), (32 * MIB, 100.5)):
        assert math.isclose(projection.sym8_ms(shape_of(size), 8), us / 1000)
    for size in (256 * MIB, 512 * MIB):
        assert math.isclose(projection.sym8_ms(shape_of(size), 8), ring[size] / 1000)
    between = projection.sym8_ms(shape_of(128 * MIB), 8)
    assert ring[128 * MIB] / 1000 / (112.6 / 100.5) < between < ring[128 * MIB] / 1000


def test_projection_of_a_row_under_each_model():
    # M = 1000, N = 1000 at P = 8: 2 MB of output, 1.75 MB pushed; at 1 GB/s (1e6 bytes/ms) that is 1.75 ms.
    row = {"m": 1000, "n": 1000, "k_per_rank": 128, "t_fused_solo_ms": 1.0, "tl_last_push": 0.5,
           "tl_bins": " ".join(["0.5", "0.5"]), "tl_share_25": 0.5, "tl_share_50": 1.0, "tl_share_75": 1.0}
    models = {"fit": lambda r, p: projection.comm_ms(r, p, 2.0, 0.1), "slow": lambda r, p: 4.0,
              "none": lambda r, p: None}
    p = projection.project(row, 8, 0.9, 1.0, models)
    assert math.isclose(p["t_link_ms"], 1.75)
    assert math.isclose(p["t_land_ms"], 1.75)  # issued over 0.5 ms, the link's 1.75 ms sets it
    assert math.isclose(p["tail_ms"], 0.5)
    assert math.isclose(p["t_fused_ms"], 2.25)
    t_comm = 7 / 8 * 2e6 / 2e6 + 0.1
    assert math.isclose(p["fit"]["t_comm_ms"], t_comm)
    assert math.isclose(p["fit"]["E"], (0.9 + t_comm - 2.25) / t_comm)
    assert math.isclose(p["fit"]["E_hideable"], (0.9 + t_comm - 2.25) / 0.9)
    # The same T_fused against a slower NCCL: a higher E (E = 1 - (T_fused - T_gemm) / T_comm).
    assert math.isclose(p["slow"]["E"], 1 - (2.25 - 0.9) / 4.0) and p["slow"]["E"] > p["fit"]["E"]
    assert p["none"] is None
    assert projection.project({"m": 1, "n": 1, "k_per_rank": 1}, 8, 1.0, 1.0, models) is None


def proxy_doc(rows, date="2026-01-01T00:00:00Z", seed=1, **options):
    return {"meta": {"date": date, "hostname": "h", "options": dict({"mode": "proxy", "tp": 8, "layout": "nk",
                                                                       "seed": seed}, **options)},
            "results": rows}


def test_t_gemm_comes_from_the_same_loop():
    row = {"m": 2048, "n": 4096, "k_per_rank": 1024, "t_cublas_ms": 0.09, "t_fused_solo_ms": 0.1}
    proxy = proxy_doc([row])
    other = proxy_doc([dict(row, t_cublas_ms=0.08)], date="2026-01-02T00:00:00Z", seed=2, mode="gemm")
    assert projection.gemm_times(proxy) == {(2048, 4096, 1024): 0.09}
    # The same run given as --gemm is the same loop.
    assert projection.gemm_times(proxy, proxy) == {(2048, 4096, 1024): 0.09}
    with pytest.raises(projection.OtherLoopError, match="another run"):
        projection.gemm_times(proxy, other)
    assert projection.gemm_times(proxy, other, other_run=True) == {(2048, 4096, 1024): 0.08}
    with pytest.raises(ValueError, match="layout"):
        projection.gemm_times(proxy, proxy_doc([row], seed=3, layout="kn"), other_run=True)
    # Each call in a loop of its own: refused, whether the run says so or only its per-call power shows it.
    for separate in (proxy_doc([row], separate_loops=True), proxy_doc([dict(row, power_fused_solo_w=600.0)])):
        with pytest.raises(projection.OtherLoopError, match="separate-loops"):
            projection.gemm_times(separate)


def write_inputs(tmp_path):
    comm = tmp_path / "fused.json"
    comm.write_text(json.dumps({"meta": {"options": {"mode": "fused", "gpus": 2}}, "results": comm_rows(200.0, 0.03)}))
    row = {"proj": "p", "m": 2048, "n": 4096, "k_per_rank": 1024, "t_fused_solo_ms": 0.1, "t_cublas_ms": 0.09,
           "tl_last_push": 0.9, "tl_bins": " ".join(["0.01"] * 100), "tl_share_25": 0.28, "tl_share_50": 0.55,
           "tl_share_75": 0.83}
    proxy = tmp_path / "proxy.json"
    proxy.write_text(json.dumps(proxy_doc([row, {"proj": "q", "m": 512, "n": 4096, "k_per_rank": 1024}])))
    gemm = tmp_path / "gemm.json"
    gemm.write_text(json.dumps(proxy_doc([{"m": 2048, "n": 4096, "k_per_rank": 1024, "t_cublas_ms": 0.08}],
                                         date="2026-01-02T00:00:00Z", seed=2, mode="gemm")))
    return comm, proxy, gemm


def test_main_prints_every_model(tmp_path, capsys):
    comm, proxy, gemm = write_inputs(tmp_path)
    out_json = tmp_path / "projection.json"
    assert projection.main([str(proxy), "--comm", str(comm), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "200.0 GB/s + 0.0300 ms" in out and "T_gemm: cuBLAS from the same loop as T_solo" in out
    assert "WARNING" not in out
    for model in projection.COMM_MODELS:
        assert f"1 shapes, {model}: E " in out and f"* M in {{512,2048}}: 1 shapes, {model}: E " in out
    written = json.loads(out_json.read_text())
    result = written["results"][0]
    assert written["t_gemm_source"] == "the same loop as T_solo"
    assert result["t_gemm_ms"] == 0.09 and result["t_fused_ms"] >= 0.1
    # 2048 x 4096 x 2 bytes = 16 MiB: inside the published 8-GPU curves.
    assert math.isclose(result["ring8"]["t_comm_ms"], math.sqrt(47.0 * 112.6) / 1000)
    assert result["sym8"]["t_comm_ms"] < result["ring8"]["t_comm_ms"]


def test_main_refuses_or_warns_on_a_t_gemm_of_another_run(tmp_path, capsys):
    comm, proxy, gemm = write_inputs(tmp_path)
    assert projection.main([str(proxy), "--comm", str(comm), "--gemm", str(gemm)]) == 2
    assert "refused: --gemm is from another run" in capsys.readouterr().err
    out_json = tmp_path / "projection.json"
    assert projection.main([str(proxy), "--comm", str(comm), "--gemm", str(gemm), "--other-run",
                            "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert out.count("WARNING: T_gemm from another run (gemm.json)") == 2  # first and last line
    written = json.loads(out_json.read_text())
    assert written["t_gemm_source"] == "another run (gemm.json)" and written["results"][0]["t_gemm_ms"] == 0.08
