#!/usr/bin/env python3
"""Projects the fused op's E at P GPUs from one GPU's push timeline (tpfuse_bench --mode proxy --timeline).

  python3 bench/projection.py PROXY.json [--comm COMM.json] [--link-gbps 369] [--json OUT.json]

The model, per shape (times in ms; bytes = M x N x 2, a rank's BF16 output before the reduce-scatter):
  T_solo     the proxy's timed fused call (t_fused_solo_ms); the recorded call's timeline is scaled to it
  T_gemm     cuBLAS's time of the same shape from the same loop as T_solo (the proxy row's t_cublas_ms: the
             proxy times cuBLAS, our GEMM and the fused call interleaved, one of each per iteration). The SM
             clock moves between runs by more than the fused op's own cost, so a T_gemm from another run
             (--gemm) is refused unless --other-run is given, and then the first and last lines warn of it; a
             proxy run with --separate-loops (each call in a loop of its own, at its own clock) is refused too
  pushes     (P-1)/P x bytes leave rank 0, binned by issue time (tl_bins over [0, tl_last_push x T_solo]);
             they queue on the GPU's link at --link-gbps: each bin's bytes start no earlier than issued
             and no earlier than the bytes before them have left (a fluid queue over the bins)
  T_land     when the last pushed byte has landed
  tail       the owner's work after its last partial arrives: on one GPU, the time from the last push's
             issue to the call's end, (1 - tl_last_push) x T_solo (every own tile computed after the
             last push is assumed to wait for it: an upper bound where own tiles overlap the drain)
  T_fused_P  max(T_solo, T_land + tail)
  T_comm_P   NCCL's reduce-scatter at P, under three models (COMM_MODELS), E under each:
             fit2   (P-1)/P x bytes / B + latency, B and latency fitted to the two-GPU runs' T_comm (--comm:
                    a mode fused or baseline JSON at P = 2, per-rank bytes the same), held at P
                    (--bus-gbps overrides B)
             ring8  a published reduce-scatter curve of 8 H100 (NCCL_8GPU_RING_US), interpolated by bytes
                    (a power law between neighbouring points); at P = 8 and within its sizes only
             sym8   ring8 over the published speedup of NCCL's symmetric kernels (NCCL_8GPU_SYM_SPEEDUP)
  E = (T_gemm + T_comm_P - T_fused_P) / T_comm_P, E_hideable = the same over min(T_gemm, T_comm_P).
A slower T_comm model gives a higher E on the same T_fused: E = 1 - (T_fused - T_gemm) / T_comm.
"""

import argparse
import json
import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# The committed two-GPU run of mode fused on the sweep's per-rank shapes (K/P of P = 8), its T_comm per shape.
DEFAULT_COMM = REPO / "bench" / "results" / "2026-11-29-h200x2-f4e35d3" / "fused_tp8.json"
# TMA stores from one H200 into another, 256 MB: bench/results/2026-11-29-h200x2-9c11eec/p2p.json.
DEFAULT_LINK_GBPS = 369.0

MIB = 1 << 20
# NCCL's reduce-scatter on one node of 8 H100 SXM (18 NVLinks a GPU, as on the H200), in us, by the bytes of
# one rank's input (nccl-tests' "size": the whole M x N buffer, of which each rank keeps 1/8):
#   2, 8, 32 MiB: Megatron-LM pull request 5596 (https://github.com/NVIDIA/Megatron-LM/pull/5596), its table
#     "Benchmark (communication time)", column "reduce-scatter off -> on", the "off" side (NCCL on ordinary
#     buffers): BF16, the NCCL kernel's device time, the minimum over the ranks;
#   128 MiB to 1 GiB: NCCL issue 1047 (https://github.com/NVIDIA/nccl/issues/1047), its table "Reducescatter
#     (H100: ring)": nccl-tests' reduce_scatter_perf, FP32, the out-of-place time.
NCCL_8GPU_RING_US = (
    (2 * MIB, 18.6), (8 * MIB, 47.0), (32 * MIB, 112.6),
    (128 * MIB, 377.2), (256 * MIB, 709.7), (512 * MIB, 1377.8), (1024 * MIB, 2689.3),
)
# The ring's time over NCCL's symmetric kernels' (buffers in symmetric windows), by the same bytes:
#   2, 8, 32 MiB: the same table of Megatron-LM pull request 5596, "off -> on": 18.6 -> 10.8, 47.0 -> 28.8,
#     112.6 -> 100.5 us;
#   256 MiB: 1, from Megatron-LM issue 5655 (https://github.com/NVIDIA/Megatron-LM/issues/5655): on 8 H100 the
#     symmetric paths' reduce-scatter "converges with plain NCCL by around 256 MiB"; held at 1 beyond.
# NOTE: neither source says whether the symmetric kernel used NVLink multicast (NCCL's ReduceScatter_LDMC),
# which this project keeps off; with multicast this curve is faster than NCCL can be here.
NCCL_8GPU_SYM_SPEEDUP = ((2 * MIB, 18.6 / 10.8), (8 * MIB, 47.0 / 28.8), (32 * MIB, 112.6 / 100.5), (256 * MIB, 1.0))
PUBLISHED_P = 8

# The T_comm models, in the order they are printed: name -> what it is, for the notes.
COMM_MODELS = {
    "fit2": "two-GPU fit held at P",
    "ring8": "published 8 x H100 ring",
    "sym8": "published 8 x H100 symmetric kernels",
}


class OtherLoopError(ValueError):
    """T_gemm and T_solo would come from different loops (another run, or --separate-loops)."""


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


def power_law(points, x):
    """y at x on the power law between the two points (x increasing) around it; None outside them."""
    if not points[0][0] <= x <= points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 * (y1 / y0) ** (math.log(x / x0) / math.log(x1 / x0))
    return points[-1][1]


def ring8_ms(row, world_size):
    """The published 8-GPU ring at this shape's bytes, or None (another P, or outside the published sizes)."""
    us = power_law(NCCL_8GPU_RING_US, output_bytes(row)) if world_size == PUBLISHED_P else None
    return None if us is None else us / 1000.0


def sym8_ms(row, world_size):
    """The published 8-GPU symmetric kernels at this shape's bytes, or None where ring8 has none."""
    ring = ring8_ms(row, world_size)
    if ring is None:
        return None
    return ring / power_law(NCCL_8GPU_SYM_SPEEDUP, min(output_bytes(row), NCCL_8GPU_SYM_SPEEDUP[-1][0]))


def comm_models(gbps, latency_ms):
    """COMM_MODELS' T_comm functions (row, P) -> ms or None, the two-GPU fit's with this B and latency."""
    return {
        "fit2": lambda row, world_size: comm_ms(row, world_size, gbps, latency_ms),
        "ring8": ring8_ms,
        "sym8": sym8_ms,
    }


def land_ms(bins, last_push_ms, total_bytes, link_gbps):
    """When the last of `total_bytes` lands, pushed as `bins` (shares over equal parts of [0, last_push_ms])
    through a link of `link_gbps`: a fluid queue, each bin's bytes arriving evenly over it."""
    rate = link_gbps * 1e6  # bytes per ms
    width = last_push_ms / len(bins)
    backlog = 0.0
    for share in bins:
        backlog = max(0.0, backlog + share * total_bytes - rate * width)
    return last_push_ms + backlog / rate


def overlap(t_gemm, t_comm, t_fused):
    """docs/SPEC.md's E and E_hideable of one T_comm."""
    hidden = t_gemm + t_comm - t_fused
    return {"t_comm_ms": t_comm, "E": hidden / t_comm, "E_hideable": hidden / min(t_gemm, t_comm)}


def project(row, world_size, t_gemm, link_gbps, models):
    """The projection of one proxy row (with its timeline), or None where it has none: T_fused at P and, per
    T_comm model (name -> function, comm_models), its overlap(), or None where the model has no figure."""
    if "tl_bins" not in row or not row.get("t_fused_solo_ms") or not t_gemm:
        return None
    bins = [float(x) for x in row["tl_bins"].split()]
    t_solo = row["t_fused_solo_ms"]
    last_push = row["tl_last_push"] * t_solo
    pushed = (world_size - 1) / world_size * output_bytes(row)
    t_land = land_ms(bins, last_push, pushed, link_gbps)
    tail = t_solo - last_push
    t_fused = max(t_solo, t_land + tail)
    projected = {
        "t_gemm_ms": t_gemm,
        "t_solo_ms": t_solo,
        "t_link_ms": pushed / (link_gbps * 1e6),
        "t_land_ms": t_land,
        "tail_ms": tail,
        "t_fused_ms": t_fused,
    }
    for name, model in models.items():
        t_comm = model(row, world_size)
        projected[name] = None if t_comm is None else overlap(t_gemm, t_comm, t_fused)
    return projected


def separate_loops(doc):
    """Whether a proxy run timed each call in a loop of its own (its options, or, in runs that predate that
    option, a call's own power, which only separate loops measure)."""
    options = doc.get("meta", {}).get("options", {})
    if "separate_loops" in options:
        return bool(options["separate_loops"])
    return any(row.get("power_fused_solo_w") is not None for row in doc.get("results", []))


def same_run(a, b):
    """Whether two JSON documents come from one run of tpfuse_bench (the same start and seed)."""
    ma, mb = a.get("meta", {}), b.get("meta", {})
    return (ma.get("date"), ma.get("hostname"), ma.get("options", {}).get("seed")) == \
           (mb.get("date"), mb.get("hostname"), mb.get("options", {}).get("seed"))


def gemm_times(proxy_doc, gemm_doc=None, other_run=False):
    """T_gemm by shape: the proxy's own cuBLAS column (the same loop as T_solo) or, with other_run, gemm_doc's.
    Raises OtherLoopError where the two would come from different loops and other_run was not given."""
    if separate_loops(proxy_doc):
        raise OtherLoopError("the proxy run timed each call in a loop of its own (--separate-loops): T_gemm and "
                             "T_solo ran at different clocks; project from an interleaved run")
    if gemm_doc is None or same_run(proxy_doc, gemm_doc):
        doc = proxy_doc
    elif not other_run:
        raise OtherLoopError("--gemm is from another run than the proxy's: the SM clock moves between runs, and E "
                             "with it (docs/PERFORMANCE.md); the proxy's own cuBLAS column is the same loop's. "
                             "Pass --other-run to use it anyway")
    else:
        doc = gemm_doc
        layout = proxy_doc.get("meta", {}).get("options", {}).get("layout", "kn")
        other_layout = gemm_doc.get("meta", {}).get("options", {}).get("layout", layout)
        if other_layout != layout:
            raise ValueError("the gemm JSON's layout %s is not the proxy's %s" % (other_layout, layout))
    return {shape_key(r): r["t_cublas_ms"] for r in doc["results"] if r.get("t_cublas_ms")}


def summary_line(what, projected, model):
    """E's range and how many shapes meet E_hideable >= 0.90 under one T_comm model."""
    rows = [p[model] for p in projected if p[model]]
    if not rows:
        return "%s, %s: no T_comm (outside the model's sizes or P)" % (what, model)
    return "%s, %s: E %.3f-%.3f; E_hideable >= 0.90 on %d of %d (min %.3f)" % (
        what, model, min(r["E"] for r in rows), max(r["E"] for r in rows),
        sum(r["E_hideable"] >= 0.90 for r in rows), len(rows), min(r["E_hideable"] for r in rows))


def model_cells(p):
    """T_comm, E and E_hideable under each model, '-' where it has none."""
    cells = []
    for name in COMM_MODELS:
        m = p[name]
        cells += ["%8.4f %6.3f %6.3f" % (m["t_comm_ms"], m["E"], m["E_hideable"]) if m else "%8s %6s %6s" % ("-",) * 3]
    return " ".join(cells)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("proxy", help="tpfuse_bench --mode proxy --timeline --json output (interleaved, not "
                                      "--separate-loops)")
    parser.add_argument("--gemm", help="a JSON whose t_cublas_ms to take as T_gemm instead of the proxy's own; "
                                       "from another run only with --other-run")
    parser.add_argument("--other-run", action="store_true",
                        help="take --gemm even from another run (E then moves with the clock between the runs)")
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
    gemm_doc = load(args.gemm) if args.gemm else None
    try:
        cublas = gemm_times(proxy, gemm_doc, args.other_run)
    except OtherLoopError as e:
        print("projection.py: refused: %s" % e, file=sys.stderr)
        return 2
    other = gemm_doc is not None and not same_run(proxy, gemm_doc)
    source = "another run (%s)" % pathlib.Path(args.gemm).name if other else "the same loop as T_solo"
    warning = ("WARNING: T_gemm from %s, not from T_solo's loop: E moves with the clock between the runs "
               "(docs/PERFORMANCE.md)" % source) if other else None
    if warning:
        print(warning)

    comm_doc = load(args.comm)
    comm_p = int(comm_doc.get("meta", {}).get("options", {}).get("gpus", 2))
    gbps, latency, worst = fit_comm(comm_doc["results"], comm_p, args.comm_key)
    bus = args.bus_gbps or gbps
    print("fit2: T_comm = (P-1)/P x bytes / %.1f GB/s + %.4f ms, fitted to %d shapes at P = %d (%s), largest "
          "relative residual %.1f%%; at P = %d: B = %.1f GB/s%s" %
          (gbps, latency, len(comm_doc["results"]), comm_p, pathlib.Path(args.comm).name, 100 * worst, world_size,
           bus, " (given)" if args.bus_gbps else " (fitted)"))
    print("ring8: NCCL's reduce-scatter on 8 x H100, published (%d sizes, %d-%d MiB; NCCL_8GPU_RING_US)%s" %
          (len(NCCL_8GPU_RING_US), NCCL_8GPU_RING_US[0][0] // MIB, NCCL_8GPU_RING_US[-1][0] // MIB,
           "" if world_size == PUBLISHED_P else ": none at P = %d" % world_size))
    print("sym8: ring8 over the published speedup of NCCL's symmetric kernels (NCCL_8GPU_SYM_SPEEDUP; may be "
          "NVLink multicast, which this project keeps off)")
    print("T_gemm: cuBLAS from %s; pushes at %.0f GB/s" % (source, args.link_gbps))
    models = comm_models(bus, latency)

    highlight = {int(m) for m in args.highlight.split(",") if m}
    header = ("proj", "M", "N", "K/P", "@25%", "@50%", "@75%", "T_gemm", "T_solo", "T_land", "tail", "T_fused_P")
    model_header = " ".join("%8s %6s %6s" % ("T_" + name, "E", "E_hide") for name in COMM_MODELS)
    print("  %-24s %6s %6s %6s %5s %5s %5s %8s %8s %8s %7s %9s " % header + model_header)
    projected = []
    for row in proxy["results"]:
        t_gemm = cublas.get(shape_key(row))
        p = project(row, world_size, t_gemm, args.link_gbps, models)
        if p is None:
            continue
        projected.append(dict(proj=row.get("proj", "?"), m=row["m"], n=row["n"], k_per_rank=row["k_per_rank"], **p))
        print("%s %-24s %6d %6d %6d %5.2f %5.2f %5.2f %8.4f %8.4f %8.4f %7.4f %9.4f %s" %
              ("*" if row["m"] in highlight else " ", row.get("proj", "?"), row["m"], row["n"], row["k_per_rank"],
               row["tl_share_25"], row["tl_share_50"], row["tl_share_75"], t_gemm, p["t_solo_ms"], p["t_land_ms"],
               p["tail_ms"], p["t_fused_ms"], model_cells(p)))
    if not projected:
        print("no rows with a timeline and an in-loop T_gemm (run mode proxy with --timeline)")
        return 1
    marked = [p for p in projected if p["m"] in highlight]
    for name in COMM_MODELS:
        print(summary_line("%d shapes" % len(projected), projected, name))
        if marked:
            print(summary_line("* M in {%s}: %d shapes" % (args.highlight, len(marked)), marked, name))
    if warning:
        print(warning)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world_size": world_size, "layout": layout, "link_gbps": args.link_gbps,
                       "t_gemm_source": source,
                       "nccl": {"fit2": {"bus_gbps": bus, "fitted_gbps": gbps, "latency_ms": latency,
                                         "fit_worst_rel": worst, "fitted_at": comm_p},
                                "ring8": {"points_us": NCCL_8GPU_RING_US},
                                "sym8": {"speedup_points": NCCL_8GPU_SYM_SPEEDUP}},
                       "results": projected}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
