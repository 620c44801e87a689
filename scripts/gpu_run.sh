#!/usr/bin/env bash
# Runs the GPU checks and benchmarks from an already-built tree (e.g. built elsewhere and copied to
# the GPU machine) and collects logs, JSON and tables in one folder, plus an archive of it.
#
#   bash scripts/gpu_run.sh BUILD_DIR OUT_DIR [STEP...]
#
# Steps (default: all, in this order): env tests sanitize gemm proxy baseline fused; also
# tests_c2 and gemm_c2, the same with clusters of two CTAs (TPFUSE_CLUSTER_SIZE=2, not the default;
# the GEMM's option only: the fused op runs without clusters whatever it says).
# Each step's output goes to OUT_DIR/<step>.log; its last lines are echoed. Every step is bounded by
# STEP_TIMEOUT seconds (default 300). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail

build=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(env tests sanitize gemm proxy baseline fused)
bench="${build}/bench/tpfuse_bench"

export NCCL_NVLS_ENABLE=0
# The NCCL device API is inlined from the headers we built with (2.28.9): prefer a matching library,
# PyTorch's, when it is there.
if nccl_dir=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null); then
  export LD_LIBRARY_PATH="${nccl_dir}:${LD_LIBRARY_PATH:-}"
fi

run_step() {
  local name=$1
  shift
  echo "== ${name}: $*"
  local start=${SECONDS}
  timeout "${STEP_TIMEOUT:-300}" "$@" >"${out}/${name}.log" 2>&1
  local rc=$?
  echo "   exit ${rc} after $((SECONDS - start)) s"
  tail -n "${TAIL_LINES:-6}" "${out}/${name}.log" | sed 's/^/   /'
}

for step in "${steps[@]}"; do
  case "${step}" in
    env)
      run_step env bash -c 'nvidia-smi; nvidia-smi topo -m; nvcc --version | tail -1; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"'
      ;;
    tests)
      run_step test_gemm "${build}/tests/gpu/test_gemm"
      run_step test_fused "${build}/tests/gpu/test_fused"
      # Own tiles inside the rounds from the first ones (the tests' shapes are too small for the
      # default lag of a wave to interleave anything).
      run_step test_fused_lag0 env TPFUSE_OWN_LAG=0 "${build}/tests/gpu/test_fused"
      # One process per GPU needs 2 or more GPUs; on one it runs a single rank, to check the harness.
      run_step test_multiprocess bash -c "\"${build}/tests/gpu/test_multiprocess\"; rc=\$?; [ \$rc -ne 77 ] && exit \$rc; TPFUSE_TEST_RANKS=1 \"${build}/tests/gpu/test_multiprocess\""
      ;;
    tests_c2)
      run_step test_gemm_c2 env TPFUSE_CLUSTER_SIZE=2 "${build}/tests/gpu/test_gemm"
      run_step test_fused_c2 env TPFUSE_CLUSTER_SIZE=2 "${build}/tests/gpu/test_fused"
      ;;
    sanitize)
      # Small shapes, and one of each one-wave variant (4 stages, the slab staged 2 chunks at a time):
      # GEMM 200 x 8192 (GemmShapes/68), fused P = 8, 512 x 8192 (FusedExact/3).
      small_gemm='*GemmShapes*/0:*GemmShapes*/17:*GemmShapes*/68:*GemmExact*'
      small_fused='*FusedExact*/1:*FusedExact*/3:*FusedExact*/6:*FusedExact*/7:*FusedErrors.BadCalls*'
      run_step memcheck_gemm compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter="${small_gemm}"
      run_step memcheck_fused compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter="${small_fused}"
      # Not FusedExact/3: with several steps per CTA racecheck reports the producer's note of a later
      # step (stage_work) against the consumers' reads of an earlier one, which the stage's empty
      # mbarrier orders (two arrivals, one per consumer warpgroup, each after a warpgroup barrier);
      # racecheck reports it all the same (bench/results/2026-11-29-h200-e10c069/README.md), also
      # with a barrier per consumer (bench/results/2026-11-29-h200-7df702d/racecheck_empty_per_consumer/).
      run_step racecheck_fused compute-sanitizer --tool racecheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter='*FusedExact*/1:*FusedExact*/7'
      run_step synccheck_fused compute-sanitizer --tool synccheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter='*FusedExact*/1:*FusedExact*/3:*FusedExact*/7'
      # Partial rounds during the K loop: a small shape with its own tiles interleaved (FusedRandom/5).
      for tool in memcheck racecheck synccheck; do
        run_step ${tool}_rounds env TPFUSE_OWN_LAG=0 compute-sanitizer --tool ${tool} --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter='*FusedRandom*/5'
      done
      ;;
    gemm)
      run_step gemm_kn "${bench}" --mode gemm --layout kn --check --json "${out}/gemm_kn.json" --csv "${out}/gemm_kn.csv"
      run_step gemm_nk "${bench}" --mode gemm --layout nk --check --json "${out}/gemm_nk.json" --csv "${out}/gemm_nk.csv"
      ;;
    gemm_c2)
      run_step gemm_kn_c2 env TPFUSE_CLUSTER_SIZE=2 "${bench}" --mode gemm --layout kn --json "${out}/gemm_kn_c2.json"
      ;;
    proxy)
      run_step proxy_kn "${bench}" --mode proxy --layout kn --check --json "${out}/proxy_kn.json" --csv "${out}/proxy_kn.csv"
      run_step proxy_nk "${bench}" --mode proxy --layout nk --check --json "${out}/proxy_nk.json" --csv "${out}/proxy_nk.csv"
      ;;
    baseline)
      run_step baseline "${bench}" --mode baseline --check --json "${out}/baseline.json" --csv "${out}/baseline.csv"
      ;;
    fused)
      run_step fused "${bench}" --mode fused --check --json "${out}/fused.json" --csv "${out}/fused.csv"
      ;;
    *)
      echo "unknown step '${step}'" >&2
      exit 2
      ;;
  esac
done
tar -C "$(dirname "${out}")" -czf "${out}.tgz" "$(basename "${out}")"
echo "archive: ${out}.tgz"
