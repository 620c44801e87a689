#!/usr/bin/env python3
"""Prints the tables of docs/PERFORMANCE.md from the JSON of the runs it cites (bench/results/).

    python3 bench/tables.py                 print every table as markdown
    python3 bench/tables.py headline gemm   print only these tables
    python3 bench/tables.py --update docs/PERFORMANCE.md
                                            rewrite the doc's marked blocks in place

A block in the doc starts with the line `<!-- tables.py NAME -->` and ends with `<!-- /tables.py -->`;
--update replaces what lies between them with the table NAME and leaves the rest of the file as it is.
Every figure comes from the JSON (the tables the benchmark printed are the *.txt beside it). Python 3,
standard library only; the JSON readers are bench/compare.py's (a glob of passes is their geomean)
and bench/clock_split.py's (a time ratio split into cycles and clock); the P = 8 projection is
bench/projection.py's.
"""
import argparse
import pathlib
import re
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import clock_split  # noqa: E402
import compare  # noqa: E402
import projection  # noqa: E402

RESULTS = HERE / "results"

# The runs the doc cites, relative to bench/results/.
TWO_GPU = "2026-11-29-h200x2-f4e35d3"
SMALL = "2026-12-03-h200-fcb48e1/run147"        # small M: interleaved (the metric), and separate_* loops
SEPARATE = "2026-12-03-h200-6d5939c/run132"     # --separate-loops: each call's own clock (GEMM sweep, all-gather)
M256 = "2026-12-03-h200-8995433/run135"         # M = 256 on one wave of 128 x 128 tiles
CURRENT = "2026-12-03-h200-52a3c32/run142"      # the current code (`after`) against c9ba200 (`before`), 2 passes
SWEEP = "p[12]_{layout}_after"                  # its proxy sweep of the current code, both passes
TIMELINE_KN = "2026-12-03-h200-c9ba200/run141/timeline_kn"   # the push timeline (proxy --timeline)
TIMELINE_NK = "2026-12-03-h200-c9ba200/run141/timeline_nk"
SEPARATE_PROXY = "2026-12-03-h200-c9ba200/run141/separate_nk"  # the current proxy sweep, --separate-loops
PYTHON = "2026-12-04-h200-6abcf47/run152/bench_python"       # python -m tpfuse.bench, world size 1
FP8 = "2026-12-04-h200-7f49829/run159"          # E4M3 inputs: the GEMM and the proxy N x K, BF16's proxy beside
FP8_BF16_PROXY = "timeline_bf16_nk"  # BF16's reduce-scatter proxy in the E4M3 session (its timeline run)
FP8_BF16_AG = "ag_proxy_nk"             # and its all-gather proxy
FP8_TIMELINES = "2026-12-05-h200-42e76c1/run162"  # E4M3's push timelines at P = 8, BF16's of the same session
# The all-gather's E4M3 proxies, where FP8's run has none: the first of these runs that has the mode.
FP8_AG_RUNS = ("2026-12-05-h200-6f9df61/run160", "2026-12-05-h200-42e76c1/run162")

geomean = clock_split.geomean


def load(results, name):
    """(meta, rows by (proj, m, n, k_per_rank)) of results/name.json (a glob: its passes' geomean)."""
    pattern = str(results / f"{name}.json")
    if not list(results.glob(f"{name}.json")):
        return None, {}
    return compare.load(pattern)


def ratio(row, a, b):
    """t_a / t_b of a row, or None."""
    found = clock_split.split([row], a, b) if row else []
    return found[0][1] if found else None


def cycles_clock(row, a, b):
    """(cycle ratio a/b, clock factor f_b / f_a), or (None, None) where a clock is missing."""
    if not row:
        return None, None
    found = clock_split.split([row], a, b)
    return (found[0][2], found[0][3]) if found else (None, None)


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def short(proj):
    return proj.replace("llama3-70b.", "llama ").replace("mixtral-8x22b.", "mixtral ")


def machine(meta):
    if not meta:
        return "(no run)"
    return (f"{meta.get('gpu_count', 1)} x {meta.get('gpu')}, commit {meta.get('git_commit')}, "
            f"{str(meta.get('date', ''))[:10]}, CUDA {meta.get('cuda_runtime')}, cuBLAS {meta.get('cublas')}, "
            f"NCCL {meta.get('nccl')}")


def counted(values, test):
    return sum(1 for v in values if v is not None and test(v))


def span(values):
    values = [v for v in values if v is not None]
    return f"{min(values):.3f}-{max(values):.3f}" if values else "-"


def grid(table_a, table_b, a, b):
    """Rows by projection, columns by M; each cell t_a/t_b of table_a / of table_b."""
    ms = sorted({k[1] for k in table_a})
    out = ["| projection | " + " | ".join(f"M = {m}" for m in ms) + " |", "|---|" + "---:|" * len(ms)]
    for proj in dict.fromkeys(k[0] for k in table_a):
        keys = sorted((k for k in table_a if k[0] == proj), key=lambda k: k[1])
        cells = " | ".join(f"{fmt(ratio(table_a[k], a, b))} / {fmt(ratio(table_b.get(k), a, b))}" for k in keys)
        out.append(f"| {short(proj)} | {cells} |")
    return out


def geomean_split(table, a, b):
    """(shapes, t_a/t_b, cycles, clock): the geomeans over a separate-loops table's rows with both clocks, or None."""
    both = [x for x in clock_split.split(list(table.values()), a, b) if x[2] is not None] if table else []
    if not both:
        return None
    return len(both), geomean([x[1] for x in both]), geomean([x[2] for x in both]), geomean([x[3] for x in both])


def split_summary(table, a, b, name):
    """The geomean split of t_a/t_b into cycles and clock, as a line under a table."""
    split = geomean_split(table, a, b)
    if split is None:
        return []
    shapes, time, cycles, clock = split
    return [f"Separate loops, {name} (N x K, the {shapes} shapes with both clocks): "
            f"{time:.3f} = cycles {cycles:.3f} x clock {clock:.3f}."]


def split_cell(table, a, b):
    """The same as a table cell, 'cycles x clock', or '-'."""
    split = geomean_split(table, a, b)
    return "-" if split is None else f"{split[2]:.3f} x {split[3]:.3f}"


# ---- the tables ----

def headline(results):
    """E, E_hideable and speedup of the fused op on two GPUs, per shape, both layouts."""
    meta, kn = load(results, f"{TWO_GPU}/fused_tp8")
    _, nk = load(results, f"{TWO_GPU}/fused_tp8_nk")
    out = [f"Measured on {machine(meta)} (`bench/results/{TWO_GPU}/fused_tp8.json`, `fused_tp8_nk.json`); the per-rank "
           "shapes of P = 8 (K/P = K/8), reduce-scattered over the 2 GPUs.", "",
           "| projection | M | T_gemm (ms) | T_comm (ms) | T_seq (ms) | T_fused (ms) | E | E_hideable | speedup "
           "| N x K: E | E_hideable | speedup | rule |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for key, r in kn.items():
        o = nk.get(key, {})
        rule = "pass" if r.get("rule") == "pass" and o.get("rule", "pass") == "pass" else "FAIL"
        out.append(f"| {short(key[0])} | {key[1]} | {r['t_gemm_ms']:.4f} | {r['t_comm_ms']:.4f} | "
                   f"{r['t_seq_ms']:.4f} | {r['t_fused_ms']:.4f} | {fmt(r.get('E'))} | {fmt(r.get('E_hideable'))} | "
                   f"{fmt(r.get('speedup'))} | {fmt(o.get('E'))} | {fmt(o.get('E_hideable'))} | "
                   f"{fmt(o.get('speedup'))} | {rule} |")
    out.append("")
    for name, table in (("K x N", kn), ("N x K", nk)):
        rows = list(table.values())
        bound = [r for r in rows if r["t_comm_ms"] <= r["t_gemm_ms"]]
        out.append(f"{name}: speedup geomean {geomean([r['speedup'] for r in rows]):.3f} "
                   f"({span(r['speedup'] for r in rows)}); E >= 0.90 on {counted([r['E'] for r in bound], lambda v: v >= 0.9)} "
                   f"of the {len(bound)} shapes with T_comm <= T_gemm (E there {span(r['E'] for r in bound)}); "
                   f"E_hideable >= 0.90 on {counted([r['E_hideable'] for r in rows], lambda v: v >= 0.9)} of {len(rows)}; "
                   f"{sum(r.get('rule') == 'pass' for r in rows)} of {len(rows)} pass the 1.1x rule.")
        out.append("")
    return out[:-1]


def headline_p2(results):
    """The sweep's shapes at P = 2 (K/P = K/2) on two GPUs: E / speedup by projection and M."""
    meta, table = load(results, f"{TWO_GPU}/fused_tp2")
    ms = sorted({k[1] for k in table})
    out = [f"Measured on {machine(meta)} (`bench/results/{TWO_GPU}/fused_tp2.json`), K x N; each cell E / speedup.", "",
           "| projection | K/P | " + " | ".join(f"M = {m}" for m in ms) + " |", "|---|---:|" + "---:|" * len(ms)]
    for proj in dict.fromkeys(k[0] for k in table):
        keys = sorted((k for k in table if k[0] == proj), key=lambda k: k[1])
        cells = " | ".join(f"{fmt(table[k].get('E'))} / {fmt(table[k].get('speedup'))}" for k in keys)
        out.append(f"| {short(proj)} | {keys[0][3]} | {cells} |")
    rows = list(table.values())
    if rows:
        out += ["", f"speedup geomean {geomean([r['speedup'] for r in rows]):.3f} ({span(r['speedup'] for r in rows)}); "
                f"E {span(r['E'] for r in rows)}; {sum(r.get('rule') == 'pass' for r in rows)} of {len(rows)} pass the 1.1x rule."]
    return out


def commit(results, name):
    """The commit a run measured (its meta's git_commit), or '?'."""
    meta, _ = load(results, name)
    return (meta or {}).get("git_commit", "?")


def sweep(results, layout):
    """(meta, rows) of the current run's proxy sweep in `layout`, the geomean of its two passes."""
    return load(results, f"{CURRENT}/" + SWEEP.format(layout=layout))


def gemm(results):
    """The per-rank GEMM against cuBLAS on the sweep (P = 8): cuBLAS/ours N x K / K x N by projection and M."""
    meta, nk = sweep(results, "nk")
    _, kn = sweep(results, "kn")
    _, sep = load(results, f"{SEPARATE}/gemm_sweep_nk")
    out = [f"Measured on {machine(meta)} (`bench/results/{CURRENT}/p1_*_after.json`, `p2_*_after.json`: the proxy's "
           "cuBLAS and GEMM calls, interleaved with the fused call, geomean of the two passes); each cell cuBLAS/ours "
           "N x K / K x N.", ""] + grid(nk, kn, "cublas", "gemm") + [""]
    for name, table in (("N x K", nk), ("K x N", kn)):
        values = [ratio(r, "cublas", "gemm") for r in table.values()]
        if values:
            out.append(f"{name}: cuBLAS/ours geomean {geomean(values):.3f} ({span(values)}), "
                       f"{counted(values, lambda v: v >= 1.0)} of {len(values)} at or above 1.00.")
    split = split_summary(sep, "cublas", "ours", "cuBLAS/ours")
    if split:
        split[0] = split[0].replace("Separate loops,", f"Separate loops (`bench/results/{SEPARATE}`, commit "
                                    f"{commit(results, f'{SEPARATE}/gemm_sweep_nk')}, mode gemm),")
    return out + split


def gemm_small(results):
    """The per-rank GEMM against cuBLAS at M = 1..512 (P = 8 shapes), geomean over the four projections by M."""
    meta, nk = load(results, f"{SMALL}/gemm_small_nk")
    _, kn = load(results, f"{SMALL}/gemm_small_kn")
    out = [f"Measured on {machine(meta)} (`bench/results/{SMALL}/gemm_small_*.json`).", "",
           "| projection | " + " | ".join(f"M = {m}" if i == 0 else str(m)
                                         for i, m in enumerate(sorted({k[1] for k in nk}))) + " | K x N, all M |",
           "|---|" + "---:|" * (len({k[1] for k in nk}) + 1)]
    for proj in dict.fromkeys(k[0] for k in nk):
        keys = sorted((k for k in nk if k[0] == proj), key=lambda k: k[1])
        cells = " | ".join(fmt(ratio(nk[k], "cublas", "ours")) for k in keys)
        kn_values = [ratio(kn.get(k), "cublas", "ours") for k in keys if kn.get(k)]
        out.append(f"| {short(proj)} | {cells} | {fmt(geomean(kn_values)) if kn_values else '-'} |")
    out.append("")
    for name, table in (("N x K", nk), ("K x N", kn)):
        values = [ratio(r, "cublas", "ours") for r in table.values()]
        roof = [r.get("ours_over_roofline") for r in table.values()]
        if values:
            out.append(f"{name}: cuBLAS/ours geomean {geomean(values):.3f} ({span(values)}), "
                       f"{counted(values, lambda v: v >= 1.0)} of {len(values)} at or above 1.00; ours/roofline "
                       f"{span(roof)}.")
    _, sep = load(results, f"{SMALL}/separate_gemm_small_nk")
    return out + split_summary(sep, "cublas", "ours", "cuBLAS/ours")


def proxy(results):
    """The fused op's own cost (solo-rank proxy, P = 8): fused/GEMM on the sweep, both layouts."""
    meta, nk = sweep(results, "nk")
    _, kn = sweep(results, "kn")
    _, sep = load(results, SEPARATE_PROXY)
    out = [f"Measured on {machine(meta)} (`bench/results/{CURRENT}/p1_*_after.json`, `p2_*_after.json`, geomean of "
           f"the two passes; split and MHz: `bench/results/{SEPARATE_PROXY}.json`, commit {commit(results, SEPARATE_PROXY)}).", "",
           "| projection | M | T_gemm (ms) | T_fused_solo (ms) | fused/GEMM N x K | K x N | "
           "separate loops N x K: cycles x clock | MHz GEMM, fused |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in nk.items():
        s = sep.get(key)
        c, f = cycles_clock(s, "fused_solo", "gemm")
        mhz = ", ".join(f"{s[k]:.0f}" if s and s.get(k) else "-" for k in ("mhz_gemm", "mhz_fused_solo"))
        out.append(f"| {short(key[0])} | {key[1]} | {r['t_gemm_ms']:.4f} | {r['t_fused_solo_ms']:.4f} | "
                   f"{fmt(ratio(r, 'fused_solo', 'gemm'))} | {fmt(ratio(kn.get(key), 'fused_solo', 'gemm'))} | "
                   f"{fmt(c)} x {fmt(f)} | {mhz} |")
    out.append("")
    for name, table in (("N x K", nk), ("K x N", kn)):
        values = [ratio(r, "fused_solo", "gemm") for r in table.values()]
        if values:
            out.append(f"{name}: fused/GEMM geomean {geomean(values):.3f} ({span(values)}), "
                       f"{counted(values, lambda v: v <= 1.05)} of {len(values)} within 1.05.")
    return out


def down_proj_ratios(table):
    """fused/cuBLAS of the down_proj rows of a proxy table, by key."""
    return {key: ratio(r, "fused_solo", "cublas") for key, r in table.items() if "down_proj" in key[0]}


def down_proj(results):
    """The fused op on the deep down_proj shapes against cuBLAS's GEMM alone (T_fused_solo / T_cublas)."""
    meta, nk = sweep(results, "nk")
    _, kn = sweep(results, "kn")
    out = [f"Measured on {machine(meta)} (`bench/results/{CURRENT}/p*_after.json`, the calls interleaved in one loop, "
           f"geomean of the two passes; split: `bench/results/{SEPARATE_PROXY}.json`, commit "
           f"{commit(results, SEPARATE_PROXY)}).", "",
           "| projection | M | K/P | T_cublas (ms) | T_fused_solo (ms) | fused/cuBLAS N x K | K x N | "
           "separate loops N x K: cycles x clock |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    _, sep = load(results, SEPARATE_PROXY)
    a_all, b_all = down_proj_ratios(nk), down_proj_ratios(kn)
    for key, a in a_all.items():
        r = nk[key]
        c, f = cycles_clock(sep.get(key), "fused_solo", "cublas")
        out.append(f"| {short(key[0])} | {key[1]} | {key[3]} | {r['t_cublas_ms']:.4f} | {r['t_fused_solo_ms']:.4f} | "
                   f"{fmt(a)} | {fmt(b_all.get(key))} | {fmt(c)} x {fmt(f)} |")
    out.append("")
    for name, vs in (("N x K", list(a_all.values())), ("K x N", list(b_all.values()))):
        vs = [v for v in vs if v is not None]
        if vs:
            out.append(f"{name}: fused/cuBLAS geomean {geomean(vs):.3f} ({span(vs)}), "
                       f"{counted(vs, lambda v: v <= 1.04)} of {len(vs)} within 1.04.")
    return out


def small_m(results):
    """The fused op at M = 8..512 (proxy, P = 8, 4, 2): fused/GEMM by M, geomean over the four projections."""
    meta, _ = load(results, f"{SMALL}/proxy_small_p8_nk")
    out = [f"Measured on {machine(meta)} (`bench/results/{SMALL}/proxy_small_p*.json`; the split: "
           f"`separate_proxy_small_p*_nk.json`, each call in a loop of its own).", ""]
    header = None
    for p, layout in ((8, "nk"), (8, "kn"), (4, "nk"), (2, "nk")):
        _, table = load(results, f"{SMALL}/proxy_small_p{p}_{layout}")
        if not table:
            continue
        by_m = {}
        for key, r in table.items():
            by_m.setdefault(key[1], []).append(ratio(r, "fused_solo", "gemm"))
        if header is None:
            ms = sorted(by_m)
            header = ms
            out += ["| P | layout | " + " | ".join(f"M = {m}" if i == 0 else str(m) for i, m in enumerate(ms)) +
                    " | geomean | within 1.10 | separate loops: cycles x clock |",
                    "|---:|---|" + "---:|" * (len(ms) + 3)]
        values = [v for vs in by_m.values() for v in vs]
        cells = " | ".join(fmt(geomean(by_m[m])) if m in by_m else "-" for m in header)
        _, sep = load(results, f"{SMALL}/separate_proxy_small_p{p}_{layout}")
        out.append(f"| {p} | {'N x K' if layout == 'nk' else 'K x N'} | {cells} | {geomean(values):.3f} | "
                   f"{counted(values, lambda v: v <= 1.10)} of {len(values)} | {split_cell(sep, 'fused_solo', 'gemm')} |")
    return out


def m256(results):
    """M = 256 on one wave of 128 x 128 tiles (8995433) against the tiles of before, in one process."""
    meta, _ = load(results, f"{M256}/p8_nk_1")
    out = [f"Measured on {machine(meta)} (`bench/results/{M256}/*.json`; `T_solo_b` is the old tiles' call, "
           "geomean of the passes).", "",
           "| P | layout | fused/GEMM old | new | new/old fused time |",
           "|---:|---|---:|---:|---:|"]
    for p, layout in ((8, "nk"), (8, "kn"), (4, "nk"), (2, "nk")):
        _, table = load(results, f"{M256}/p{p}_{layout}_*")
        if not table:
            continue
        old = [ratio(r, "fused_solo_b", "gemm") for r in table.values()]
        new = [ratio(r, "fused_solo", "gemm") for r in table.values()]
        gain = [ratio(r, "fused_solo", "fused_solo_b") for r in table.values()]
        out.append(f"| {p} | {'N x K' if layout == 'nk' else 'K x N'} | {geomean(old):.3f} | {geomean(new):.3f} | "
                   f"{geomean(gain):.3f} |")
    return out


def all_gather(results):
    """The all-gather + GEMM (solo-rank proxy, P = 8): fused/GEMM N x K / K x N by projection and M."""
    meta, nk = load(results, f"{CURRENT}/ag_nk_after")
    _, kn = load(results, f"{CURRENT}/ag_kn_after")
    _, sep = load(results, f"{SEPARATE}/ag_p8_nk")
    out = [f"Measured on {machine(meta)} (`bench/results/{CURRENT}/ag_nk_after.json`, `ag_kn_after.json`; separate "
           f"loops: `bench/results/{SEPARATE}`, commit {commit(results, f'{SEPARATE}/ag_p8_nk')}); each cell fused/GEMM "
           "N x K / K x N.", ""] + grid(nk, kn, "fused_solo", "gemm") + [""]
    for name, table in (("N x K", nk), ("K x N", kn)):
        values = [ratio(r, "fused_solo", "gemm") for r in table.values()]
        if values:
            over_cublas = [ratio(r, "fused_solo", "cublas") for r in table.values()]
            out.append(f"{name}: fused/GEMM geomean {geomean(values):.3f} ({span(values)}), "
                       f"{counted(values, lambda v: v <= 1.03)} of {len(values)} within 1.03; "
                       f"fused/cuBLAS's GEMM alone {span(over_cublas)}.")
    return out + split_summary(sep, "fused_solo", "gemm", "fused/GEMM")


def fp8(results):
    """E4M3 inputs (N x K, P = 8): the GEMM against cuBLASLt's scaled GEMM, and both ops' proxies, per scaling
    and accumulation, BF16's proxies of the same session beside them."""
    out = ["| scaling, accumulation | GEMM: cuBLASLt/ours | at or above 1.00 | reduce-scatter proxy: fused/GEMM "
           "| within 1.05 | fused/cuBLASLt's GEMM alone | all-gather proxy: fused/GEMM | within 1.03 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    meta = None
    for scaling in ("tensorwise", "rowwise"):
        for accumulation in ("promoted", "fast"):
            meta, gemm_rows = load(results, f"{FP8}/gemm_fp8_{scaling}_{accumulation}")
            _, proxy_rows = load(results, f"{FP8}/proxy_fp8_{scaling}_{accumulation}")
            ag_rows, ag_run = {}, None
            for run in (FP8,) + FP8_AG_RUNS:
                _, ag_rows = load(results, f"{run}/ag_proxy_fp8_{scaling}_{accumulation}")
                if ag_rows:
                    ag_run = run
                    break
            over_cublas = [ratio(r, "cublas", "ours") for r in gemm_rows.values()]
            fused = [ratio(r, "fused_solo", "gemm") for r in proxy_rows.values()]
            fused_cublas = [ratio(r, "fused_solo", "cublas") for r in proxy_rows.values()]
            gathered = [ratio(r, "fused_solo", "gemm") for r in ag_rows.values()]
            if not over_cublas or not fused:
                continue
            ag_cells = (f"{geomean(gathered):.3f} ({span(gathered)}) | {counted(gathered, lambda v: v <= 1.03)} of "
                        f"{len(gathered)}") if gathered else "- | -"
            if gathered and ag_run != FP8:
                ag_cells += f" (`{ag_run}`)"
            out.append(f"| {scaling}, {accumulation} | {geomean(over_cublas):.3f} ({span(over_cublas)}) "
                       f"| {counted(over_cublas, lambda v: v >= 1.0)} of {len(over_cublas)} "
                       f"| {geomean(fused):.3f} ({span(fused)}) | {counted(fused, lambda v: v <= 1.05)} of {len(fused)} "
                       f"| {geomean(fused_cublas):.3f} ({span(fused_cublas)}) | {ag_cells} |")
    tail = []
    for what, name in (("reduce-scatter", FP8_BF16_PROXY), ("all-gather", FP8_BF16_AG)):
        _, bf16 = load(results, f"{FP8}/{name}")
        values = [ratio(r, "fused_solo", "gemm") for r in bf16.values()]
        if values:
            tail.append(f"BF16's {what} proxy in the same session (`{name}.json`): fused/GEMM geomean "
                        f"{geomean(values):.3f} ({span(values)}).")
    head = [f"Measured on {machine(meta)} (`bench/results/{FP8}/gemm_fp8_*.json`, `proxy_fp8_*.json`, "
            "`ag_proxy_fp8_*.json`: the sweep's 16 shapes at P = 8, N x K, each a geomean over them with its "
            "range).", ""] if meta else []
    return head + out + ([""] + tail if tail else [])


def fp8_projection(results):
    """E at P = 8 projected from the E4M3 push timelines (bench/projection.py; T_gemm cuBLASLt's from each
    timeline's own loop), BF16's of the same session beside them, and what FP8 buys on down_proj."""
    caption = [f"Projected from the push timelines of `bench/results/{FP8_TIMELINES}/timeline_*.json` (N x K, the proxy at "
               "P = 8 with --timeline; T_gemm: the reference GEMM of the same loop, cuBLAS for BF16, cuBLASLt's scaled "
               "GEMM for E4M3), under each T_comm model of the P = 8 projection above. down_proj: the projected fused "
               "call at P = 8 (T_fused, which no T_comm model changes), BF16's time over E4M3's, geomean over the "
               "sweep's 8 down_proj shapes.", ""]
    comm_meta, comm = load(results, f"{TWO_GPU}/fused_tp8")
    if len(comm) < 2:
        return caption
    comm_p = int((comm_meta or {}).get("options", {}).get("gpus", 2))
    models = projection.comm_models(*projection.fit_comm(list(comm.values()), comm_p)[:2])
    modes = [("BF16", "timeline_bf16_nk")] + [
        (f"{scaling}, {accumulation}", f"timeline_fp8_{scaling}_{accumulation}")
        for scaling in ("tensorwise", "rowwise") for accumulation in ("promoted", "fast")]
    names = list(projection.COMM_MODELS)
    out = caption + [
           "| inputs | E_hideable >= 0.90, " + " / ".join(names) + " | min E_hideable, " + " / ".join(names)
           + " | down_proj: fused BF16 / fused E4M3 |", "|---|---:|---:|---:|"]
    fused = {}
    for label, name in modes:
        meta, table = load(results, f"{FP8_TIMELINES}/{name}")
        if not table:
            continue
        t_gemm = projection.gemm_times({"meta": meta or {}, "results": list(table.values())})
        rows = {}
        for key, r in table.items():
            proj = projection.project(r, 8, t_gemm.get(projection.shape_key(r)), projection.DEFAULT_LINK_GBPS, models)
            if proj:
                rows[key] = proj
        fused[label] = rows
        counts, mins = [], []
        for model in names:
            values = [p[model]["E_hideable"] for p in rows.values() if p[model]]
            counts.append(f"{counted(values, lambda v: v >= 0.9)} of {len(values)}" if values else "-")
            mins.append(f"{min(values):.3f}" if values else "-")
        gain = "-"
        if label != "BF16" and "BF16" in fused:
            ratios = [fused["BF16"][k]["t_fused_ms"] / p["t_fused_ms"] for k, p in rows.items()
                      if "down_proj" in k[0] and k in fused["BF16"]]
            gain = f"{geomean(ratios):.3f} ({span(ratios)}), {counted(ratios, lambda v: v >= 1.3)} of {len(ratios)} " \
                   "at or above 1.30" if ratios else "-"
        out.append(f"| {label} | {' / '.join(counts)} | {' / '.join(mins)} | {gain} |")
    return out


# The T_comm models of the projection's table (bench/projection.py's COMM_MODELS), and their names in it.
TABLE_MODELS = {"fit2": "fit", "ring8": "ring"}


def projected(results):
    """(the NCCL fit (B GB/s, latency ms, worst residual, shapes, P), {layout: {key: (row, projection)}}) of the
    push timelines, by bench/projection.py's model, T_gemm from each timeline run's own loop; empty where a run
    is missing."""
    comm_meta, comm = load(results, f"{TWO_GPU}/fused_tp8")
    if len(comm) < 2:
        return None, {}
    comm_p = int((comm_meta or {}).get("options", {}).get("gpus", 2))
    gbps, latency, worst = projection.fit_comm(list(comm.values()), comm_p)
    models = projection.comm_models(gbps, latency)
    out = {}
    for layout, name in (("kn", TIMELINE_KN), ("nk", TIMELINE_NK)):
        meta, table = load(results, name)
        p = int((meta or {}).get("options", {}).get("tp", 8))
        t_gemm = projection.gemm_times({"meta": meta or {}, "results": list(table.values())})
        rows = {}
        for key, r in table.items():
            proj = projection.project(r, p, t_gemm.get(projection.shape_key(r)), projection.DEFAULT_LINK_GBPS, models)
            if proj:
                rows[key] = (r, proj)
        out[layout] = rows
    return (gbps, latency, worst, len(comm), comm_p), out


def bound(p, model):
    return p[model]["t_comm_ms"] <= p["t_gemm_ms"]


def pair(p, model_field):
    """'fit / ring' of one field of a projection (E, E_hideable, t_comm_ms), '-' where a model has none."""
    digits = 4 if model_field == "t_comm_ms" else 3
    return " / ".join(fmt(p[m][model_field] if p and p[m] else None, digits) for m in TABLE_MODELS)


def model_summary(name, rows, model):
    """A layout's targets under one T_comm model: E where T_comm <= T_gemm, E_hideable on every shape."""
    rows = {k: (r, p) for k, (r, p) in rows.items() if p[model]}
    if not rows:
        return f"{name}, {model}: no T_comm at these sizes."
    cb = [(k, p) for k, (r, p) in rows.items() if bound(p, model)]
    by_proj = {}
    for k, p in cb:
        if p[model]["E"] >= 0.9:
            by_proj.setdefault(short(k[0]), []).append(str(k[1]))
    met = [f"{proj} at M = {', '.join(ms)}" for proj, ms in by_proj.items()]
    hideable = [p[model]["E_hideable"] for r, p in rows.values()]
    return (f"{name}, {model} ({projection.COMM_MODELS[model]}): E >= 0.90 on {sum(len(ms) for ms in by_proj.values())} "
            f"of the {len(cb)} shapes with T_comm <= T_gemm{' (' + ', '.join(met) + ')' if met else ''}, E there "
            f"{span(p[model]['E'] for k, p in cb)}; E_hideable >= 0.90 on {counted(hideable, lambda v: v >= 0.9)} of "
            f"{len(rows)} (min {min(hideable):.3f}).")


def projection_p8(results):
    """E at P = 8 projected from one GPU's push timeline (bench/projection.py), per shape, both layouts, under
    the two-GPU fit of T_comm and the published 8-GPU ring."""
    meta, _ = load(results, TIMELINE_KN)
    fit, by_layout = projected(results)
    out = [f"Projected from {machine(meta)} (`bench/results/{TIMELINE_KN}.json`, K x N; "
           f"`bench/results/{TIMELINE_NK}.json`, N x K; T_gemm: cuBLAS in the same loop as T_solo); T_comm fitted "
           f"to `bench/results/{TWO_GPU}/fused_tp8.json`, and published (`bench/projection.py`).", ""]
    if not fit:
        return out
    gbps, latency, worst, n, comm_p = fit
    ring, sym = projection.NCCL_8GPU_RING_US, projection.NCCL_8GPU_SYM_SPEEDUP
    mib = projection.MIB
    out += [f"Models: pushes at {projection.DEFAULT_LINK_GBPS:.0f} GB/s. T_comm, fit: (P-1)/P x bytes / {gbps:.1f} GB/s + "
            f"{1000 * latency:.1f} us (fitted to {n} shapes at P = {comm_p}, worst residual {100 * worst:.1f}%), held at "
            f"P = 8; ring: NCCL's reduce-scatter on 8 x H100 as published, {len(ring)} sizes of "
            f"{ring[0][0] // mib}-{ring[-1][0] // mib} MiB ({', '.join(f'{s // mib} MiB {us:g} us' for s, us in ring)}), "
            f"a power law between neighbouring sizes; sym (the lines below the table): the ring over the published "
            f"speedup of NCCL's symmetric kernels ({', '.join(f'{s // mib} MiB {x:.2f}x' for s, x in sym)}).", "",
            "| projection | M | pushed by 25/50/75% K x N | N x K | T_gemm (ms) | T_solo (ms) | T_fused P = 8 (ms) | "
            "T_comm P = 8 (ms) fit / ring | E fit / ring | E_hideable fit / ring | N x K: E fit / ring | E_hideable fit / ring |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    kn, nk = by_layout.get("kn", {}), by_layout.get("nk", {})

    def shares(item):
        return " / ".join(f"{item[0][f'tl_share_{q}']:.2f}" for q in (25, 50, 75)) if item else "-"

    for key, (r, p) in kn.items():
        o = nk.get(key)
        q = o[1] if o else None
        out.append(f"| {short(key[0])} | {key[1]} | {shares((r, p))} | {shares(o)} | {p['t_gemm_ms']:.4f} | "
                   f"{p['t_solo_ms']:.4f} | {p['t_fused_ms']:.4f} | {pair(p, 't_comm_ms')} | {pair(p, 'E')} | "
                   f"{pair(p, 'E_hideable')} | {pair(q, 'E')} | {pair(q, 'E_hideable')} |")
    out.append("")
    for name, rows in (("K x N", kn), ("N x K", nk)):
        if not rows:
            continue
        out += [model_summary(name, rows, model) for model in projection.COMM_MODELS]
        half = {m: [r["tl_share_50"] for k, (r, p) in rows.items() if k[1] == m] for m in (512, 2048)}
        out.append(f"{name}: pushed by half the call: " + ", ".join(f"M = {m} {span(v)}" for m, v in half.items() if v) + ".")
        out.append("")
    return out[:-1]


def python_host(results):
    """The PyTorch package at world size 1: the host's time to queue one call (us), over the 16 shapes."""
    meta, table = load(results, PYTHON)
    out = [f"Measured on {machine(meta)}, torch {(meta or {}).get('torch')} (`bench/results/{PYTHON}.json`), "
           "one process; the host's time to queue one eager call, over the 16 shapes.", "",
           "| call | median (us) | range (us) |", "|---|---:|---:|"]
    rows = list(table.values())
    if not rows:
        return out
    columns = (("torch.mm", [r["host_gemm_us"] for r in rows]),
               ("torch.mm + reduce_scatter_tensor", [r["host_seq_us"] for r in rows]),
               ("tpfuse.gemm_reduce_scatter", [r["host_fused_us"] for r in rows]))
    for name, values in columns:
        out.append(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} to {max(values):.1f} |")
    over = [r["host_fused_us"] - r["host_gemm_us"] for r in rows]
    out += ["", f"tpfuse minus torch.mm: max {max(over):.1f} us (target: at most 10), {counted(over, lambda v: v <= 10)} of "
            f"{len(rows)} shapes within 10 us; {sum(r.get('rule') == 'pass' for r in rows)} of {len(rows)} pass the 1.1x rule."]
    return out


def status(value, target, below=True):
    """'met' or 'missed by X' for value against target (below: value <= target is met)."""
    if value is None:
        return "-"
    if (value <= target) if below else (value >= target):
        return "met"
    return f"missed by {abs(value - target):.3f}"


def target_row(what, pair, target, below, source, total=True, split="-"):
    """One row of the targets table: pair = (N x K values, K x N values); status from the worst of both."""
    cells, worst = [], []
    for values in pair:
        values = [v for v in values if v is not None]
        if not values:
            cells.append("-")
            continue
        if total:
            edge = max(values) if below else min(values)
            ok = counted(values, lambda v: v <= target if below else v >= target)
            cells.append(f"{ok} of {len(values)}, {'max' if below else 'min'} {edge:.3f}")
        else:
            edge = geomean(values)
            cells.append(f"{edge:.3f}")
        worst.append(edge)
    edge = (max(worst) if below else min(worst)) if worst else None
    return f"| {what} | {' / '.join(cells)} | {status(edge, target, below)} | {split} | {source} |"


def targets(results):
    """Where the targets stand: per target the figures N x K / K x N, met or missed (by the worst), the run."""
    out = ["| target | N x K / K x N | status | separate loops, N x K geomean: cycles x clock | run (commit) |",
           "|---|---|---|---|---|"]
    _, nk = sweep(results, "nk")
    _, kn = sweep(results, "kn")
    _, sep = load(results, SEPARATE_PROXY)
    down_sep = {k: r for k, r in sep.items() if "down_proj" in k[0]}
    current = f"{CURRENT.rsplit('run', 1)[1]} ({commit(results, f'{CURRENT}/p1_nk_after')})"
    out.append(target_row("down_proj: T_fused_solo <= 1.04x cuBLAS", (down_proj_ratios(nk).values(),
                          down_proj_ratios(kn).values()), 1.04, True, current,
                          split=split_cell(down_sep, "fused_solo", "cublas")))
    pair = [[ratio(r, "fused_solo", "gemm") for r in t.values()] for t in (nk, kn)]
    sweep_split = split_cell(sep, "fused_solo", "gemm")
    out.append(target_row("sweep: fused/GEMM <= 1.05 on each", pair, 1.05, True, current, split=sweep_split))
    out.append(target_row("sweep: fused/GEMM geomean <= 1.06", pair, 1.06, True, current, total=False,
                          split=sweep_split))
    small = [load(results, f"{SMALL}/proxy_small_p8_{layout}") for layout in ("nk", "kn")]
    _, small_sep = load(results, f"{SMALL}/separate_proxy_small_p8_nk")
    out.append(target_row("M = 8..512, P = 8: fused/GEMM <= 1.10 on each",
                          [[ratio(r, "fused_solo", "gemm") for r in t.values()] for _, t in small], 1.10, True,
                          f"{SMALL.rsplit('run', 1)[1]} ({commit(results, f'{SMALL}/proxy_small_p8_nk')})",
                          split=split_cell(small_sep, "fused_solo", "gemm")))
    ag = [load(results, f"{CURRENT}/ag_{layout}_after")[1] for layout in ("nk", "kn")]
    _, ag_sep = load(results, f"{SEPARATE}/ag_p8_nk")
    out.append(target_row("all-gather: fused/GEMM <= 1.03 on each",
                          [[ratio(r, "fused_solo", "gemm") for r in t.values()] for t in ag], 1.03, True, current,
                          split=split_cell(ag_sep, "fused_solo", "gemm")))
    _, by_layout = projected(results)
    rows = [by_layout.get("nk", {}), by_layout.get("kn", {})]
    runs = "141 (timeline)"
    out.append(target_row(">= 0.50 of the pushed bytes by half the call, M = 512 and 2048",
                          [[r["tl_share_50"] for k, (r, p) in t.items() if k[1] in (512, 2048)] for t in rows],
                          0.5, False, runs))
    for model, words in (("fit2", "T_comm two-GPU fit"), ("ring8", "T_comm published 8-GPU ring")):
        out.append(target_row(f"projected E >= 0.90 where T_comm <= T_gemm, P = 8, {words}",
                              [[p[model]["E"] for r, p in t.values() if p[model] and bound(p, model)] for t in rows],
                              0.9, False, runs + ", model"))
        out.append(target_row(f"projected E_hideable >= 0.90, P = 8, {words}",
                              [[p[model]["E_hideable"] for r, p in t.values() if p[model]] for t in rows], 0.9, False,
                              runs + ", model"))
    return out


TABLES = {
    "headline": headline,
    "headline_p2": headline_p2,
    "gemm": gemm,
    "gemm_small": gemm_small,
    "proxy": proxy,
    "down_proj": down_proj,
    "small_m": small_m,
    "m256": m256,
    "all_gather": all_gather,
    "fp8": fp8,
    "fp8_projection": fp8_projection,
    "projection": projection_p8,
    "python": python_host,
    "targets": targets,
}

BLOCK = re.compile(r"(<!-- tables\.py (\w+) -->\n)(.*?)(<!-- /tables\.py -->)", re.S)


def update(doc, results):
    """Rewrites every marked block of the file doc; returns the names of the blocks rewritten."""
    text = pathlib.Path(doc).read_text()
    names = []

    def fill(match):
        name = match.group(2)
        if name not in TABLES:
            raise SystemExit(f"tables.py: {doc} names an unknown table {name!r}")
        names.append(name)
        return match.group(1) + "\n".join(TABLES[name](results)) + "\n" + match.group(4)

    pathlib.Path(doc).write_text(BLOCK.sub(fill, text))
    return names


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="*", help=f"tables to print (default: all): {', '.join(TABLES)}")
    parser.add_argument("--results", default=str(RESULTS), help="the results folder (default: bench/results)")
    parser.add_argument("--update", metavar="DOC", help="rewrite DOC's marked blocks instead of printing")
    args = parser.parse_args(argv)
    results = pathlib.Path(args.results)
    unknown = [name for name in args.tables if name not in TABLES]
    if unknown:
        parser.error(f"unknown tables {', '.join(unknown)}; known: {', '.join(TABLES)}")
    if args.update:
        names = update(args.update, results)
        print(f"{args.update}: {len(names)} tables rewritten ({', '.join(names)})")
        return 0
    for name in args.tables or TABLES:
        print(f"### {name}\n")
        print("\n".join(TABLES[name](results)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
