#!/usr/bin/env python3
"""Compares runs of tpfuse_bench shape by shape: two builds (or two override sets) of the same mode.

    python3 bench/compare.py BEFORE.json AFTER.json [--field t_gemm_ms]
    python3 bench/compare.py 'before_*.json' 'after_*.json'     (several passes of each)

Prints, per shape, the field in each run and after/before, then the geomean of after/before and
its range, and the geomean by M. Without --field it takes the mode's main time of ours: t_ours_ms
(gemm), t_fused_solo_ms and t_gemm_ms (proxy), t_fused_ms (fused). BEFORE and AFTER may be glob
patterns: a shape's field is then the geomean over the files (the passes of one call). Rows that
either side lacks are listed as missing.
"""
import argparse
import collections
import glob
import json
import math
import sys

DEFAULT_FIELDS = {
    "gemm": ["t_ours_ms", "t_cublas_ms"],
    "proxy": ["t_fused_solo_ms", "t_gemm_ms"],
    "ag-proxy": ["t_fused_solo_ms", "t_gemm_ms"],  # proxy --op ag
    "fused": ["t_fused_ms"],
    "baseline": ["t_gemm_ms", "t_comm_ms"],
}


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def load(pattern):
    """The first file's meta, and per shape each numeric field's geomean over the matching files."""
    paths = sorted(glob.glob(pattern)) or [pattern]
    meta, runs = None, collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        meta = meta or data["meta"]
        for row in data["results"]:
            runs[(row.get("proj"), row.get("m"), row.get("n"), row.get("k_per_rank"))].append(row)
    rows = {}
    for key, passes in runs.items():
        row = dict(passes[0])
        for field in passes[0]:
            values = [p.get(field) for p in passes]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
                row[field] = geomean(values)
        rows[key] = row
    return meta, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--field", action="append", help="a row field to compare (repeatable)")
    args = parser.parse_args()
    meta_before, before = load(args.before)
    meta_after, after = load(args.after)
    mode = meta_after["options"]["mode"]
    if meta_before["options"]["mode"] != mode:
        sys.exit(f"compare.py: modes differ ({meta_before['options']['mode']} against {mode})")
    fields = args.field or DEFAULT_FIELDS.get(mode, [])
    print(f"{mode} {meta_after['options']['layout']}: {meta_before.get('git_commit')} -> {meta_after.get('git_commit')}")
    failed = False
    for field in fields:
        ratios = []
        by_m = collections.defaultdict(list)
        print(f"  {field}: before, after, after/before")
        for key, row in before.items():
            other = after.get(key)
            if other is None or field not in row or field not in other:
                print(f"    {key[0]} M={key[1]}: missing")
                failed = True
                continue
            ratio = other[field] / row[field]
            ratios.append(ratio)
            by_m[key[1]].append(ratio)
            print(f"    {key[0]:<24} M={key[1]:<6} {row[field]:.4f} {other[field]:.4f} {ratio:.3f}")
        if ratios:
            print(f"  {field}: after/before geomean {geomean(ratios):.4f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
                  f"{len(ratios)} shapes)")
            print(f"  {field}: by M " + ", ".join(f"{m}: {geomean(r):.3f}" for m, r in sorted(by_m.items())))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
