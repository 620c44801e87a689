#!/usr/bin/env python3
"""Plots a tpfuse_bench result JSON as a PNG.

    python3 bench/plot.py results.json -o plot.png

gemm mode:     TFLOP/s of ours and cuBLAS per shape (grouped bars).
proxy mode:    T_gemm (tpfuse::gemm) and T_fused_solo per shape (grouped bars, log scale), then
               their ratio per shape against the 1.05 target.
baseline and fused modes:
               T_gemm, T_comm, T_seq per shape (grouped bars, log scale), and T_fused when the
               results have it; then a second panel of the overlap efficiency E (and E_hideable)
               per shape, against docs/SPEC.md's 0.9 target, when the results have it.
A missing or null number leaves its bar out.
"""
import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TIME_SERIES = [("t_gemm_ms", "T_gemm (cuBLAS)"), ("t_comm_ms", "T_comm (NCCL reduce-scatter)"),
               ("t_seq_ms", "T_seq (GEMM, then reduce-scatter)"), ("t_fused_ms", "T_fused (tpfuse)")]
TFLOPS_SERIES = [("tflops_cublas", "cuBLAS"), ("tflops_ours", "tpfuse")]
EFFICIENCY_SERIES = [("E", "E"), ("E_hideable", "E_hideable")]
E_TARGET = 0.9
PROXY_TIME_SERIES = [("t_gemm_ms", "T_gemm (tpfuse::gemm)"), ("t_fused_solo_ms", "T_fused_solo (rank 0 alone)")]
PROXY_RATIO_SERIES = [("fused_over_gemm", "T_fused_solo / T_gemm")]
PROXY_TARGET = 1.05


def number(row, key):
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def present(rows, series):
    """The series of which at least one row has a number."""
    return [(key, name) for key, name in series if any(not math.isnan(number(row, key)) for row in rows)]


def shape_label(row):
    return f"{row.get('proj', '?')} M={int(number(row, 'm')) if not math.isnan(number(row, 'm')) else '?'}"


def grouped_bars(ax, rows, series, ylabel, log=False):
    width = 0.8 / len(series)
    for i, (key, name) in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(rows))]
        ax.bar(xs, [number(row, key) for row in rows], width, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([shape_label(row) for row in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def title(data):
    meta = data.get("meta", {})
    options = meta.get("options", {})
    tp = options.get("tp", "?")
    # Fused mode reduce-scatters over the GPUs in use, whatever --tp sets for the GEMMs' K/P.
    world = f"P={meta.get('gpu_count', '?')} (K/P of P={tp})" if options.get("mode") == "fused" else f"P={tp}"
    parts = [f"tpfuse_bench {options.get('mode', '?')}", f"{meta.get('gpu_count', '?')} x {meta.get('gpu', '?')}",
             f"{world}, layout {options.get('layout', '?')}",
             f"commit {meta.get('git_commit', '?')}", str(meta.get("date", ""))]
    return ", ".join(parts)


def target_line(ax, value):
    ax.axhline(value, color="black", linestyle="--", linewidth=1, label=f"target {value}")
    ax.legend(fontsize=8)


def choose_panels(data, rows):
    """(kind, series) per panel, from the mode that wrote the results, else from what they hold."""
    mode = data.get("meta", {}).get("options", {}).get("mode")
    if mode == "proxy" or present(rows, PROXY_TIME_SERIES[1:]):
        times = present(rows, PROXY_TIME_SERIES)
        ratio = present(rows, PROXY_RATIO_SERIES)
        return ([("times", times)] if times else []) + ([("ratio", ratio)] if ratio else [])
    tflops = present(rows, TFLOPS_SERIES)
    if tflops:
        return [("tflops", tflops)]
    times = present(rows, TIME_SERIES)
    efficiency = present(rows, EFFICIENCY_SERIES)
    return ([("times", times)] if times else []) + ([("efficiency", efficiency)] if times and efficiency else [])


def plot(data, out_path):
    rows = data.get("results") or []
    if not rows:
        raise ValueError("the JSON has no results")
    panels = choose_panels(data, rows)
    if not panels:
        raise ValueError("the results have neither times nor TFLOP/s to plot")

    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.7 * len(rows) + 3), 5 * len(panels)), squeeze=False)
    for ax, (kind, series) in zip(axes[:, 0], panels):
        if kind == "tflops":
            grouped_bars(ax, rows, series, "TFLOP/s (per rank)")
        elif kind == "times":
            grouped_bars(ax, rows, series, "time (ms, median)", log=True)
        elif kind == "ratio":
            grouped_bars(ax, rows, series, "T_fused_solo / T_gemm")
            # Around 1, where the few percent that matter are visible.
            ratios = [r for r in (number(row, key) for row in rows for key, _ in series) if not math.isnan(r)]
            ax.set_ylim(min(0.9, min(ratios) - 0.05), max(PROXY_TARGET, max(ratios)) + 0.05)
            target_line(ax, PROXY_TARGET)
        else:
            grouped_bars(ax, rows, series, "overlap efficiency")
            target_line(ax, E_TARGET)
    axes[0, 0].set_title(title(data), fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=150)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description="Plot a tpfuse_bench result JSON.")
    parser.add_argument("json", help="result file written by tpfuse_bench --json")
    parser.add_argument("-o", "--output", default="plot.png", help="PNG to write (default: plot.png)")
    args = parser.parse_args()
    try:
        with open(args.json) as f:
            data = json.load(f)
        plot(data, args.output)
    except (OSError, ValueError) as e:
        print(f"plot.py: {args.json}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
