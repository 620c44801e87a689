#!/usr/bin/env python3
"""Splits a ratio of two calls' times into cycles and clock, shape by shape, from a tpfuse_bench JSON.

    python3 bench/clock_split.py RUN.json [RUN2.json ...] [--pair A B]

T = cycles / f, so T_A / T_B = (C_A / C_B) * (f_B / f_A): the time ratio is the cycle ratio times the
clock ratio. A and B name the calls as the JSON's fields do (t_A_ms, mhz_A); by default the ratio
each mode's table reports: cublas/ours (gemm) and fused_solo/gemm (proxy, ag-proxy). Prints per shape
the time ratio, the two clocks, the cycle ratio and f_B / f_A (and each call's power where the run
has it: --separate-loops), then the geomeans over the shapes where both clocks were read.
"""
import argparse
import json
import math
import sys

DEFAULT_PAIRS = {
    "gemm": ("cublas", "ours"),
    "proxy": ("fused_solo", "gemm"),
    "ag-proxy": ("fused_solo", "gemm"),
}


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def split(rows, a, b):
    """Per row: (row, time ratio, cycle ratio or None, clock factor f_B / f_A or None)."""
    out = []
    for row in rows:
        t_a, t_b = row.get(f"t_{a}_ms"), row.get(f"t_{b}_ms")
        if not t_a or not t_b:
            continue
        f_a, f_b = row.get(f"mhz_{a}"), row.get(f"mhz_{b}")
        if f_a and f_b:
            out.append((row, t_a / t_b, (t_a * f_a) / (t_b * f_b), f_b / f_a))
        else:
            out.append((row, t_a / t_b, None, None))
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="tpfuse_bench JSON files")
    parser.add_argument("--pair", nargs=2, metavar=("A", "B"), help="the calls compared (default: by mode)")
    args = parser.parse_args(argv)

    for path in args.runs:
        with open(path) as f:
            data = json.load(f)
        options = data["meta"]["options"]
        mode = options["mode"]
        if args.pair:
            a, b = args.pair
        elif mode in DEFAULT_PAIRS:
            a, b = DEFAULT_PAIRS[mode]
        else:
            sys.exit(f"{path}: mode {mode} has no default pair; name one with --pair A B")
        rows = split(data["results"], a, b)
        print(f"# {path}: mode {mode}, --tp {options.get('tp')}, layout {options.get('layout')}; "
              f"time {a}/{b} = cycles {a}/{b} x clock MHz_{b}/MHz_{a}")
        print(f"{'proj':<26}{'M':>7}{'N':>7}{'K/P':>7}{'time':>8}{'MHz_' + a:>16}{'MHz_' + b:>12}"
              f"{'cycles':>8}{'clock':>8}{'W_' + a:>14}{'W_' + b:>10}")
        for row, time_ratio, cycle_ratio, clock in rows:
            clocks = (f"{row[f'mhz_{a}']:>16.0f}{row[f'mhz_{b}']:>12.0f}{cycle_ratio:>8.3f}{clock:>8.3f}"
                      if cycle_ratio else f"{'-':>16}{'-':>12}{'-':>8}{'-':>8}")
            watts = "".join(f"{row[key]:>{width}.0f}" if row.get(key) else f"{'-':>{width}}"
                            for key, width in ((f"power_{a}_w", 14), (f"power_{b}_w", 10)))
            print(f"{row['proj']:<26}{row['m']:>7}{row['n']:>7}{row['k_per_rank']:>7}{time_ratio:>8.3f}{clocks}"
                  f"{watts}")
        both = [r for r in rows if r[2]]
        print(f"# {len(rows)} shapes: time geomean {geomean([r[1] for r in rows]):.3f}; on the {len(both)} with "
              f"both clocks: time {geomean([r[1] for r in both]):.3f} = cycles {geomean([r[2] for r in both]):.3f}"
              f" x clock {geomean([r[3] for r in both]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
