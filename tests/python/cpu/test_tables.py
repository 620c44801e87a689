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
    write(tmp_path / tables.TARGETS, "proxy_sweep_nk", [row])
    write(tmp_path / tables.TARGETS, "proxy_sweep_kn", [dict(row, t_fused_solo_ms=1.1)])
    write(tmp_path / tables.SEPARATE, "proxy_sweep_nk", [dict(row, mhz_gemm=1500, mhz_fused_solo=1200)])
    out = "\n".join(tables.proxy(tmp_path))
    # 1.2x the time at 1200 MHz against 1500: 0.96x the cycles, clock factor 1.25.
    assert "| mixtral down_proj | 512 | 1.0000 | 1.2000 | 1.200 | 1.100 | 0.960 x 1.250 | 1500, 1200 |" in out
    assert "N x K: fused/GEMM geomean 1.200 (1.200-1.200), 0 of 1 within 1.05." in out
    assert "| mixtral down_proj | 512 | 2048 | 1.0000 | 1.2000 | 1.200 | 1.100 |" in "\n".join(tables.down_proj(tmp_path))


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
             "t_ours_ms": t} for m, t in ((512, 1.0), (2048, 0.8))]
    write(tmp_path / tables.TARGETS, "gemm_sweep_nk", rows)
    write(tmp_path / tables.TARGETS, "gemm_sweep_kn", rows[:1])
    write(tmp_path / tables.SEPARATE, "gemm_sweep_nk", [dict(rows[1], mhz_cublas=1500, mhz_ours=1200)])
    out = "\n".join(tables.gemm(tmp_path))
    assert "| llama o_proj | 1.000 / 1.000 | 1.250 / - |" in out
    assert "N x K: cuBLAS/ours geomean 1.118 (1.000-1.250), 2 of 2 at or above 1.00." in out
    # 1.25x at 1500 against 1200 MHz: 1.5625x the cycles, clock factor 0.8.
    assert "(N x K, the 1 shapes with both clocks): 1.250 = cycles 1.562 x clock 0.800." in out
