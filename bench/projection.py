#!/usr/bin/env python3
"""Projects the fused op's E at P GPUs from one GPU's push timeline (tpfuse_bench --mode proxy --timeline).

  python3 bench/projection.py PROXY.json [--gemm GEMM.json] [--comm COMM.json] [--link-gbps 369]

The model, per shape (times in ms; bytes = M x N x 2, a rank's BF16 output before the reduce-scatter):
  T_solo     the proxy's timed fused call (t_fused_solo_ms); the recorded call's timeline is scaled to it
  pushes     (P-1)/P x bytes leave rank 0, binned by issue time (tl_bins over [0, tl_last_push x T_solo]);
             they queue on the GPU's link at --link-gbps: each bin's bytes start no earlier than issued
             and no earlier than the bytes before them have left (a fluid queue over the bins)
  T_land     when the last pushed byte has landed
  tail       the owner's work after its last partial arrives: on one GPU, the time from the last push's
             issue to the call's end, (1 - tl_last_push) x T_solo (every own tile computed after the
             last push is assumed to wait for it: an upper bound where own tiles overlap the drain)
  T_fused_P  max(T_solo, T_land + tail)
  T_gemm     cuBLAS's time of the same shape (mode gemm's t_cublas_ms, else the proxy's own column)
  T_comm_P   NCCL's reduce-scatter at P: (P-1)/P x bytes / B + latency, B and latency fitted to the
             two-GPU runs' T_comm (--comm: a mode fused or baseline JSON at P = 2, per-rank bytes the
             same), held at P (a ring's bus bandwidth is the per-GPU link's; --bus-gbps overrides B)
  E = (T_gemm + T_comm_P - T_fused_P) / T_comm_P, E_hideable = the same over min(T_gemm, T_comm_P).
"""

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# The committed two-GPU run of mode fused on the sweep's per-rank shapes (K/P of P = 8), its T_comm per shape.
DEFAULT_COMM = REPO / "bench" / "results" / "2026-11-29-h200x2-f4e35d3" / "fused_tp8.json"
# TMA stores from one H200 into another, 256 MB: bench/results/2026-11-29-h200x2-9c11eec/p2p.json.
DEFAULT_LINK_GBPS = 369.0


def load(path):
    with open(path) as f:
        return json.load(f)


def shape_key(row):
    return (int(row["m"]), int(row["n"]), int(row["k_per_rank"]))


def output_bytes(row):
    return 2.0 * row["m"] * row["n"]


def fit_comm(rows, world_size, key="t_comm_ms"):
    """Fits T = (P-1)/P * bytes / B + latency to the rows' `key` (ms), weighting each by 1/T^2 (relative
    error). Returns (B in GB/s, latency in ms, the largest relative residual)."""
    points = [((world_size - 1) / world_size * output_bytes(r), r[key]) for r in rows if r.get(key)]
    if len(points) < 2:
        raise ValueError("fitting T_comm needs two or more shapes with " + key)
    # Weighted least squares of t = a x + c with weights 1 / t^2.
    sw = sx = st = sxx = sxt = 0.0
    for x, t in points:
        w = 1.0 / (t * t)
        sw += w
        sx += w * x
        st += w * t
        sxx += w * x * x
        sxt += w * x * t
    slope = (sw * sxt - sx * st) / (sw * sxx - sx * sx)  # ms per byte
    latency = (st - slope * sx) / sw
    gbps = 1e-6 / slope  # bytes per ms -> GB/s
    worst = max(abs(slope * x + latency - t) / t for x, t in points)
    return gbps, latency, worst


def comm_ms(row, world_size, gbps, latency_ms):
    return (world_size - 1) / world_size * output_bytes(row) / (gbps * 1e6) + latency_ms


def land_ms(bins, last_push_ms, total_bytes, link_gbps):
    """When the last of `total_bytes` lands, pushed as `bins` (shares over equal parts of [0, last_push_ms])
    through a link of `link_gbps`: a fluid queue, each bin's bytes arriving evenly over it."""
    rate = link_gbps * 1e6  # bytes per ms
    width = last_push_ms / len(bins)
    backlog = 0.0
    for share in bins:
        backlog = max(0.0, backlog + share * total_bytes - rate * width)
    return last_push_ms + backlog / rate


def project(row, world_size, t_gemm, gbps, latency_ms, link_gbps):
    """The projection of one proxy row (with its timeline), or None where it has none."""
    if "tl_bins" not in row or not row.get("t_fused_solo_ms") or not t_gemm:
        return None
    bins = [float(x) for x in row["tl_bins"].split()]
    t_solo = row["t_fused_solo_ms"]
    last_push = row["tl_last_push"] * t_solo
    pushed = (world_size - 1) / world_size * output_bytes(row)
    t_land = land_ms(bins, last_push, pushed, link_gbps)
    tail = t_solo - last_push
    t_fused = max(t_solo, t_land + tail)
    t_comm = comm_ms(row, world_size, gbps, latency_ms)
    hidden = t_gemm + t_comm - t_fused
    return {
        "t_gemm_ms": t_gemm,
        "t_solo_ms": t_solo,
        "t_link_ms": pushed / (link_gbps * 1e6),
        "t_land_ms": t_land,
        "tail_ms": tail,
        "t_fused_ms": t_fused,
        "t_comm_ms": t_comm,
        "E": hidden / t_comm,
        "E_hideable": hidden / min(t_gemm, t_comm),
    }


def summary_line(what, projected):
    return "%s; E %.3f-%.3f; E_hideable >= 0.90 on %d" % (
        what, min(p["E"] for p in projected), max(p["E"] for p in projected),
        sum(p["E_hideable"] >= 0.90 for p in projected))


def cublas_times(gemm_doc, layout):
    """t_cublas_ms by shape from a mode gemm JSON of the same layout."""
    options = gemm_doc.get("meta", {}).get("options", {})
    if options.get("layout", layout) != layout:
        raise ValueError("the gemm JSON's layout %s is not the proxy's %s" % (options.get("layout"), layout))
    return {shape_key(r): r["t_cublas_ms"] for r in gemm_doc["results"] if r.get("t_cublas_ms")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("proxy", help="tpfuse_bench --mode proxy --timeline --json output")
    parser.add_argument("--gemm", help="tpfuse_bench --mode gemm --json output (T_cublas); else the proxy's")
    parser.add_argument("--comm", default=str(DEFAULT_COMM), help="a two-GPU mode fused/baseline JSON (T_comm)")
    parser.add_argument("--comm-key", default="t_comm_ms", help="its column of NCCL's time (default t_comm_ms)")
    parser.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS, help="a GPU's push rate")
    parser.add_argument("--bus-gbps", type=float, help="NCCL's bus bandwidth at P (default: the fitted one)")
    parser.add_argument("--highlight", default="512,2048", help="M values marked '*' and summed up apart")
    parser.add_argument("--json", help="also write the projection here")
    args = parser.parse_args(argv)

    proxy = load(args.proxy)
    options = proxy.get("meta", {}).get("options", {})
    world_size = int(options.get("tp", 8))
    layout = options.get("layout", "kn")
    comm_doc = load(args.comm)
    comm_p = int(comm_doc.get("meta", {}).get("options", {}).get("gpus", 2))
    gbps, latency, worst = fit_comm(comm_doc["results"], comm_p, args.comm_key)
    print("NCCL model: T_comm = (P-1)/P x bytes / %.1f GB/s + %.4f ms, fitted to %d shapes at P = %d (%s), "
          "largest relative residual %.1f%%" % (gbps, latency, len(comm_doc["results"]), comm_p,
                                                 pathlib.Path(args.comm).name, 100 * worst))
    bus = args.bus_gbps or gbps
    print("at P = %d: B = %.1f GB/s%s, latency %.4f ms; pushes at %.0f GB/s" %
          (world_size, bus, " (given)" if args.bus_gbps else " (fitted)", latency, args.link_gbps))
    cublas = cublas_times(load(args.gemm), layout) if args.gemm else {}

    highlight = {int(m) for m in args.highlight.split(",") if m}
    header = ("proj", "M", "N", "K/P", "@25%", "@50%", "@75%", "T_gemm", "T_solo", "T_link", "T_land", "tail",
              "T_fused_P", "T_comm_P", "E", "E_hide")
    print("  %-24s %6s %6s %6s %5s %5s %5s %8s %8s %8s %8s %7s %9s %8s %6s %6s" % header)
    projected = []
    for row in proxy["results"]:
        t_gemm = cublas.get(shape_key(row), row.get("t_cublas_ms"))
        p = project(row, world_size, t_gemm, bus, latency, args.link_gbps)
        if p is None:
            continue
        projected.append(dict(proj=row.get("proj", "?"), m=row["m"], n=row["n"], k_per_rank=row["k_per_rank"], **p))
        print("%s %-24s %6d %6d %6d %5.2f %5.2f %5.2f %8.4f %8.4f %8.4f %8.4f %7.4f %9.4f %8.4f %6.3f %6.3f" %
              ("*" if row["m"] in highlight else " ", row.get("proj", "?"), row["m"], row["n"], row["k_per_rank"], row["tl_share_25"], row["tl_share_50"],
               row["tl_share_75"], t_gemm, p["t_solo_ms"], p["t_link_ms"], p["t_land_ms"], p["tail_ms"],
               p["t_fused_ms"], p["t_comm_ms"], p["E"], p["E_hideable"]))
    if not projected:
        print("no rows with a timeline (run mode proxy with --timeline)")
        return 1
    print(summary_line("%d shapes" % len(projected), projected))
    marked = [p for p in projected if p["m"] in highlight]
    if marked:
        print(summary_line("* M in {%s}: %d shapes" % (args.highlight, len(marked)), marked))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": world_size, "layout": layout, "link_gbps": args.link_gbps,
                       "nccl": {"bus_gbps": bus, "fitted_gbps": gbps, "latency_ms": latency,
                                "fit_worst_rel": worst, "fitted_at": comm_p},
                       "results": projected}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
