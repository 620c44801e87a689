"""The E4M3 per-rank GEMM against cuBLASLt's (torch._scaled_mm) on the sweep's row-parallel shapes at
P = 8 (K per rank = K / 8): tensorwise and rowwise scales, promoted and fast accumulation.

Both are timed in one loop, their calls alternated, with CUDA events, after a warm-up, over input
sets rotated through more than the L2 cache; the medians are reported. Each shape's outputs are
checked first against the dequantized product in float64 (docs/SPEC.md's measures): ours must be
within 1.1x of cuBLASLt's errors.

    python3 bench/fp8_gemm.py --library build/src/libtpfuse.so --json out.json

Needs a Hopper GPU and torch; the library is the C++ build's (C ABI v6).
"""
import argparse
import ctypes
import json
import pathlib
import statistics
import sys

import torch

_SHAPES = json.loads((pathlib.Path(__file__).parents[1] / "python" / "tpfuse" / "shapes.json").read_text())
_WEIGHT_NXK, _DTYPE_E4M3 = 1, 1
_SCALING = {"tensorwise": 1, "rowwise": 2}
_ACCUMULATION = {"promoted": 0, "fast": 1}
_L2_BYTES = 50 * 2**20


def load(path):
    lib = ctypes.CDLL(path)
    lib.tpfuse_c_api_version.restype = ctypes.c_int
    if lib.tpfuse_c_api_version() != 6:
        sys.exit(f"{path}: C ABI {lib.tpfuse_c_api_version()}, this script speaks 6")
    lib.tpfuse_last_error.restype = ctypes.c_char_p
    lib.tpfuse_gemm.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 6
    return lib


def scales_for(scaling, m, n, generator):
    """About 1/448 each, as amax scaling makes them for data in e4m3's range."""
    def draw(count):
        return ((0.5 + 1.5 * torch.rand(count, generator=generator)) / 448).cuda()
    if scaling == "tensorwise":
        return draw(1).reshape(()), draw(1).reshape(())
    return draw(m).reshape(m, 1), draw(n).reshape(1, n)


def random_e4m3(rows, cols, generator):
    values = (torch.rand(rows, cols, generator=generator) * 2 - 1) * 448
    return values.to(torch.float8_e4m3fn).cuda()


class Case:
    def __init__(self, lib, m, n, k, scaling, accumulation, sets, seed):
        self.lib, self.m, self.n, self.k = lib, m, n, k
        self.scaling, self.fast = scaling, accumulation == "fast"
        self.codes = (_SCALING[scaling], _ACCUMULATION[accumulation])
        generator = torch.Generator().manual_seed(seed)
        self.sets = []
        for _ in range(sets):
            a, w = random_e4m3(m, k, generator), random_e4m3(n, k, generator)
            sa, sw = scales_for(scaling, m, n, generator)
            self.sets.append((a, w, sa, sw))
        self.out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

    def ours(self, i):
        a, w, sa, sw = self.sets[i]
        rc = self.lib.tpfuse_gemm(self.m, self.n, self.k, _WEIGHT_NXK, _DTYPE_E4M3, *self.codes, a.data_ptr(),
                                  w.data_ptr(), sa.data_ptr(), sw.data_ptr(), self.out.data_ptr(),
                                  torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"tpfuse_gemm: {self.lib.tpfuse_last_error().decode()}")
        return self.out

    def cublas(self, i):
        a, w, sa, sw = self.sets[i]
        return torch._scaled_mm(a, w.t(), sa, sw, out_dtype=torch.bfloat16, use_fast_accum=self.fast)

    def errors(self):
        """(ours, cuBLASLt) as (max_rel, norm_rel) against the dequantized product in float64."""
        a, w, sa, sw = self.sets[0]
        ref = (a.double() @ w.double().t()) * sa.double().reshape(-1, 1) * sw.double().reshape(1, -1)
        result = []
        for out in (self.ours(0).clone(), self.cublas(0)):
            diff = out.double() - ref
            result.append((diff.abs().max().item() / ref.abs().max().item(), (diff.norm() / ref.norm()).item()))
        return result


def time_alternated(case, repeats, warmup):
    """Medians (us) of ours and cuBLASLt's, alternated call by call over the rotated sets."""
    times = {"ours": [], "cublas": []}
    calls = (("ours", case.ours), ("cublas", case.cublas))
    for it in range(warmup + repeats):
        for name, fn in (calls if it % 2 == 0 else calls[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(it % len(case.sets))
            end.record()
            end.synchronize()
            if it >= warmup:
                times[name].append(start.elapsed_time(end) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", required=True, help="libtpfuse.so of the C++ build")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    lib = load(args.library)
    rows = []
    print(f"{'shape':<28}{'M':>6}{'scaling':>11}{'accum':>9}{'ours us':>9}{'cuBLASLt us':>12}{'cuBLAS/ours':>12}"
          f"{'err ours':>10}{'err cuBLASLt':>13}", flush=True)
    for shape in _SHAPES["row_parallel"]:
        n, k = shape["n"], shape["k"] // args.world_size
        for m in _SHAPES["tokens"]:
            set_bytes = m * k + n * k + 2 * m * n
            sets = max(2, -(-2 * _L2_BYTES // set_bytes))
            for scaling in ("tensorwise", "rowwise"):
                for accumulation in ("promoted", "fast"):
                    case = Case(lib, m, n, k, scaling, accumulation, sets, seed=m + n + k)
                    (ours_err, cublas_err) = case.errors()
                    ok = all(o <= 1.1 * c + 1e-7 for o, c in zip(ours_err, cublas_err))
                    t = time_alternated(case, args.repeats, args.warmup)
                    row = dict(shape=shape["name"], m=m, n=n, k_per_rank=k, scaling=scaling, accumulation=accumulation,
                               ours_us=t["ours"], cublas_us=t["cublas"], cublas_over_ours=t["cublas"] / t["ours"],
                               ours_tflops=2 * m * n * k / t["ours"] / 1e6, error_ours=ours_err,
                               error_cublas=cublas_err, within_1_1x=ok)
                    rows.append(row)
                    print(f"{shape['name']:<28}{m:>6}{scaling:>11}{accumulation:>9}{t['ours']:>9.1f}"
                          f"{t['cublas']:>12.1f}{row['cublas_over_ours']:>12.3f}{ours_err[1]:>10.2e}"
                          f"{cublas_err[1]:>13.2e}{'' if ok else '  ERROR ABOVE 1.1x'}", flush=True)
                    del case
    summary = {}
    for scaling in ("tensorwise", "rowwise"):
        for accumulation in ("promoted", "fast"):
            ratios = [r["cublas_over_ours"] for r in rows if r["scaling"] == scaling and r["accumulation"] == accumulation]
            summary[f"{scaling}/{accumulation}"] = statistics.geometric_mean(ratios)
    print("geomean cuBLASLt/ours: " + ", ".join(f"{key} {v:.3f}" for key, v in summary.items()))
    print(f"checked: {sum(r['within_1_1x'] for r in rows)} of {len(rows)} within 1.1x of cuBLASLt's error")
    if args.json:
        info = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), world_size=args.world_size,
                    repeats=args.repeats, warmup=args.warmup)
        pathlib.Path(args.json).write_text(json.dumps(dict(info=info, rows=rows, geomean=summary), indent=1))
    return 0 if all(r["within_1_1x"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
