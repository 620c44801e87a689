"""bench/tables.py: docs/PERFORMANCE.md's tables printed from a run's JSON (standard library only)."""

import importlib.util
import json
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "bench" / "tables.py"
spec = importlib.util.spec_from_file_location("tables", SCRIPT)
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)

META = {"gpu": "NVIDIA H200", "gpu_count": 2, "git_commit": "abc1234", "date": "2026-01-01T00:00:00Z",
        "cuda_runtime": "13.0", "cublas": "13.1.0", "nccl": "2.28.9", "options": {"mode": "fused", "tp": 8}}


def write(folder, name, rows):
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": META, "results": rows}))


def fused_row(m, t_gemm, t_comm, t_fused):
    t_seq = t_gemm + t_comm
    hidden = t_gemm + t_comm - t_fused
    return {"proj": "llama3-70b.o_proj", "m": m, "n": 8192, "k_per_rank": 1024, "t_gemm_ms": t_gemm,
            "t_comm_ms": t_comm, "t_seq_ms": t_seq, "t_fused_ms": t_fused, "E": hidden / t_comm,
            "E_hideable": hidden / min(t_gemm, t_comm), "speedup": t_seq / t_fused, "rule": "pass"}


def test_headline_counts_the_targets(tmp_path):
    # M = 512: comm-bound, E 0.5; M = 2048: GEMM-bound, E 0.95 (meets); E_hideable 1.0 / 0.95.
    rows = [fused_row(512, 1.0, 2.0, 2.0), fused_row(2048, 2.0, 1.0, 2.05)]
    write(tmp_path / tables.TWO_GPU, "fused_tp8", rows)
    write(tmp_path / tables.TWO_GPU, "fused_tp8_nk", rows)
    out = "\n".join(tables.headline(tmp_path))
    assert "2 x NVIDIA H200, commit abc1234, 2026-01-01" in out
    assert "| llama o_proj | 512 | 1.0000 | 2.0000 | 3.0000 | 2.0000 | 0.500 | 1.000 | 1.500 |" in out
    assert "E >= 0.90 on 1 of the 1 shapes with T_comm <= T_gemm" in out
    assert "E_hideable >= 0.90 on 2 of 2; 2 of 2 pass the 1.1x rule" in out


def test_proxy_ratios_and_split(tmp_path):
    row = {"proj": "mixtral-8x22b.down_proj", "m": 512, "n": 6144, "k_per_rank": 2048, "t_cublas_ms": 1.0,
           "t_gemm_ms": 1.0, "t_fused_solo_ms": 1.2}
    write(tmp_path / tables.CURRENT, "p1_nk_after", [row])
    write(tmp_path / tables.CURRENT, "p1_kn_after", [dict(row, t_fused_solo_ms=1.1)])
    folder, name = tables.SEPARATE_PROXY.rsplit("/", 1)
    write(tmp_path / folder, name, [dict(row, mhz_cublas=1500, mhz_gemm=1500, mhz_fused_solo=1200)])
    out = "\n".join(tables.proxy(tmp_path))
    # 1.2x the time at 1200 MHz against 1500: 0.96x the cycles, clock factor 1.25.
    assert "| mixtral down_proj | 512 | 1.0000 | 1.2000 | 1.200 | 1.100 | 0.960 x 1.250 | 1500, 1200 |" in out
    assert "N x K: fused/GEMM geomean 1.200 (1.200-1.200), 0 of 1 within 1.05." in out
    down = "\n".join(tables.down_proj(tmp_path))
    assert "| mixtral down_proj | 512 | 2048 | 1.0000 | 1.2000 | 1.200 | 1.100 | 0.960 x 1.250 |" in down
    assert "K x N: fused/cuBLAS geomean 1.100 (1.100-1.100), 0 of 1 within 1.04." in down


def test_small_m_splits_each_row_into_cycles_and_clock(tmp_path):
    rows = [{"proj": "llama3-70b.o_proj", "m": m, "n": 8192, "k_per_rank": 1024, "t_gemm_ms": 1.0,
             "t_fused_solo_ms": 1.3} for m in (8, 512)]
    write(tmp_path / tables.SMALL, "proxy_small_p8_nk", rows)
    # Separate loops: 1.2x the time at the same clock on one shape, no clock on the other (left out).
    write(tmp_path / tables.SMALL, "separate_proxy_small_p8_nk",
          [dict(rows[0], t_fused_solo_ms=1.2, mhz_gemm=1980, mhz_fused_solo=1980), dict(rows[1], t_fused_solo_ms=2.0)])
    out = "\n".join(tables.small_m(tmp_path))
    assert "| 8 | N x K | 1.300 | 1.300 | 1.300 | 0 of 2 | 1.200 x 1.000 |" in out
    target = [line for line in tables.targets(tmp_path) if line.startswith("| M = 8..512")][0]
    assert "0 of 2, max 1.300" in target and "| 1.200 x 1.000 |" in target


def test_sweep_is_the_geomean_of_the_passes(tmp_path):
    row = {"proj": "llama3-70b.o_proj", "m": 512, "n": 8192, "k_per_rank": 1024, "t_cublas_ms": 1.0,
           "t_gemm_ms": 1.0, "t_fused_solo_ms": 1.0}
    write(tmp_path / tables.CURRENT, "p1_nk_after", [row])
    write(tmp_path / tables.CURRENT, "p2_nk_after", [dict(row, t_fused_solo_ms=1.21)])
    write(tmp_path / tables.CURRENT, "p1_nk_before", [dict(row, t_fused_solo_ms=9.0)])  # another binary: not read
    _, rows = tables.sweep(tmp_path, "nk")
    assert abs(rows[("llama3-70b.o_proj", 512, 8192, 1024)]["t_fused_solo_ms"] - 1.1) < 1e-9


def test_missing_runs_print_no_rows(tmp_path):
    for name in tables.TABLES:
        assert tables.TABLES[name](tmp_path)  # a caption at least, never an exception


def test_update_rewrites_only_the_marked_block(tmp_path, capsys):
    write(tmp_path / tables.TWO_GPU, "fused_tp8", [fused_row(512, 1.0, 2.0, 2.0)])
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\nkept text\n<!-- tables.py headline -->\nold table\n<!-- /tables.py -->\nafter\n")
    assert tables.main(["--results", str(tmp_path), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\nkept text\n<!-- tables.py headline -->\nMeasured on 2 x NVIDIA H200")
    assert "old table" not in text and text.endswith("<!-- /tables.py -->\nafter\n")
    assert "1 tables rewritten (headline)" in capsys.readouterr().out


def test_gemm_grid_and_split(tmp_path):
    rows = [{"proj": "llama3-70b.o_proj", "m": m, "n": 8192, "k_per_rank": 1024, "t_cublas_ms": 1.0,
             "t_gemm_ms": t, "t_fused_solo_ms": 1.0} for m, t in ((512, 1.0), (2048, 0.8))]
    write(tmp_path / tables.CURRENT, "p1_nk_after", rows)
    write(tmp_path / tables.CURRENT, "p1_kn_after", rows[:1])
    sep = {"proj": "llama3-70b.o_proj", "m": 2048, "n": 8192, "k_per_rank": 1024, "t_cublas_ms": 1.0,
           "t_ours_ms": 0.8, "mhz_cublas": 1500, "mhz_ours": 1200}
    write(tmp_path / tables.SEPARATE, "gemm_sweep_nk", [sep])
    out = "\n".join(tables.gemm(tmp_path))
    assert "| llama o_proj | 1.000 / 1.000 | 1.250 / - |" in out
    assert "N x K: cuBLAS/ours geomean 1.118 (1.000-1.250), 2 of 2 at or above 1.00." in out
    # 1.25x at 1500 against 1200 MHz: 1.5625x the cycles, clock factor 0.8.
    assert "(N x K, the 1 shapes with both clocks): 1.250 = cycles 1.562 x clock 0.800." in out
    assert "commit abc1234, mode gemm" in out


def timeline_row(m, k, t_cublas, t_solo, share_50, last_push=1.0):
    # All of the pushed bytes issued evenly over [0, last_push x T_solo].
    return {"proj": "llama3-70b.down_proj", "m": m, "n": 8192, "k_per_rank": k, "t_cublas_ms": t_cublas,
            "t_gemm_ms": t_cublas, "t_fused_solo_ms": t_solo, "tl_share_25": share_50 / 2, "tl_share_50": share_50,
            "tl_share_75": 0.75, "tl_last_push": last_push, "tl_bins": " ".join(["0.25"] * 4)}


def test_projection_uses_the_model(tmp_path):
    # T_comm fit: two shapes on the line T = (1/2) x bytes / 100 GB/s + 0.01 ms at P = 2.
    comm = [fused_row(m, 1.0, 0.5 * 2.0 * m * 8192 / 1e8 + 0.01, 1.0) for m in (512, 2048)]
    write(tmp_path / tables.TWO_GPU, "fused_tp8", comm)
    # M = 8192: 7/8 x 128 MiB pushed at 369 GB/s take 0.318 ms, less than T_solo: T_fused = T_solo = 10 ms.
    rows = [timeline_row(8192, 3584, 10.0, 10.0, 0.5), timeline_row(512, 3584, 0.01, 0.02, 0.0)]
    for timeline in (tables.TIMELINE_KN, tables.TIMELINE_NK):
        folder, name = timeline.rsplit("/", 1)
        write(tmp_path / folder, name, rows)
    out = "\n".join(tables.projection_p8(tmp_path))
    assert "fit: (P-1)/P x bytes / 100.0 GB/s + 10.0 us (fitted to 2 shapes at P = 2, worst residual 0.0%)" in out
    t_comm = 7 / 8 * 2.0 * 8192 * 8192 / 1e8 + 0.01
    e = (10.0 + t_comm - 10.0) / t_comm
    # 8192 x 8192 x 2 bytes = 128 MiB: the published 8-GPU ring's 377.2 us; T_fused = T_gemm, so E = 1 under both.
    assert (f"| llama down_proj | 8192 | 0.25 / 0.50 / 0.75 | 0.25 / 0.50 / 0.75 | 10.0000 | 10.0000 | 10.0000 | "
            f"{t_comm:.4f} / 0.3772 | {e:.3f} / 1.000 |") in out
    assert ("K x N, fit2 (two-GPU fit held at P): E >= 0.90 on 1 of the 1 shapes with T_comm <= T_gemm "
            "(llama down_proj at M = 8192)") in out
    assert "K x N, ring8 (published 8 x H100 ring): E >= 0.90 on 1 of the 1 shapes" in out
    assert "K x N: pushed by half the call: M = 512 0.000-0.000." in out
    targets = "\n".join(tables.targets(tmp_path))
    assert "| >= 0.50 of the pushed bytes by half the call, M = 512 and 2048 | 0 of 1, min 0.000 / 0 of 1, min 0.000 | missed by 0.500 |" in targets
    for model in ("two-GPU fit", "published 8-GPU ring"):
        assert (f"| projected E >= 0.90 where T_comm <= T_gemm, P = 8, T_comm {model} | 1 of 1, min 1.000 / 1 of 1, "
                "min 1.000 | met |") in targets


def test_projection_refuses_a_timeline_of_separate_loops(tmp_path):
    comm = [fused_row(m, 1.0, 0.5 * 2.0 * m * 8192 / 1e8 + 0.01, 1.0) for m in (512, 2048)]
    write(tmp_path / tables.TWO_GPU, "fused_tp8", comm)
    row = dict(timeline_row(8192, 3584, 10.0, 10.0, 0.5), power_fused_solo_w=650.0)
    for timeline in (tables.TIMELINE_KN, tables.TIMELINE_NK):
        folder, name = timeline.rsplit("/", 1)
        write(tmp_path / folder, name, [row])
    try:
        tables.projection_p8(tmp_path)
    except tables.projection.OtherLoopError as e:
        assert "separate-loops" in str(e)
    else:
        raise AssertionError("a timeline timed in separate loops was projected")


def test_python_host_times(tmp_path):
    rows = [{"proj": "llama3-70b.o_proj", "m": m, "n": 8192, "k_per_rank": 1024, "host_gemm_us": g,
             "host_seq_us": 60.0, "host_fused_us": f, "rule": "pass"} for m, g, f in ((512, 20.0, 25.0), (2048, 20.0, 32.0))]
    folder, name = tables.PYTHON.rsplit("/", 1)
    write(tmp_path / folder, name, rows)
    out = "\n".join(tables.python_host(tmp_path))
    assert "| tpfuse.gemm_reduce_scatter | 28.5 | 25.0 to 32.0 |" in out
    assert "tpfuse minus torch.mm: max 12.0 us (target: at most 10), 1 of 2 shapes within 10 us; 2 of 2 pass" in out
