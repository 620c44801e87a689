"""bench/clock_split.py: a ratio of two calls' times split into cycles and clock."""

import importlib.util
import json
import math
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "bench" / "clock_split.py"
spec = importlib.util.spec_from_file_location("clock_split", SCRIPT)
clock_split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clock_split)


def test_time_ratio_is_cycles_times_clock(tmp_path, capsys):
    # The fused call 1.2x the GEMM's time at 1200 MHz against 1500: 0.96x its cycles.
    rows = [{"proj": "p", "m": 512, "n": 8192, "k_per_rank": 1024, "t_fused_solo_ms": 1.2, "t_gemm_ms": 1.0,
             "mhz_fused_solo": 1200, "mhz_gemm": 1500, "power_fused_solo_w": 690.0, "power_gemm_w": 700.0},
            {"proj": "p", "m": 8, "n": 8192, "k_per_rank": 1024, "t_fused_solo_ms": 0.02, "t_gemm_ms": 0.016,
             "mhz_gemm": 1980}]
    (row, time, cycles, clock), (_, short_time, no_cycles, no_clock) = clock_split.split(rows, "fused_solo", "gemm")
    assert math.isclose(time, 1.2) and math.isclose(cycles, 0.96) and math.isclose(clock, 1.25)
    assert math.isclose(time, cycles * clock)
    assert math.isclose(short_time, 1.25) and no_cycles is None and no_clock is None

    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"meta": {"options": {"mode": "proxy", "tp": 8, "layout": "nk"}}, "results": rows}))
    assert clock_split.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 shapes: time geomean 1.225" in out and "time 1.200 = cycles 0.960 x clock 1.250" in out
    assert " 690       700" in out
