#!/usr/bin/env bash
# Runs the GPU checks and benchmarks from an already-built tree (e.g. built elsewhere and copied to
# the GPU machine) and collects logs, JSON and tables in one folder, plus an archive of it.
#
#   bash scripts/gpu_run.sh BUILD_DIR OUT_DIR [STEP...]
#
# Steps (default: all, in this order): env tests sanitize gemm proxy timeline ag_proxy baseline fused;
# fp8 (not in the default) runs the E4M3 tests, then the GEMM and both ops' proxies (the
# reduce-scatter's and the all-gather's) N x K with E4M3 inputs, tensorwise and rowwise, promoted and
# fast, and blockwise (promoted), checked, then the reduce-scatter's proxy at P = 8 N x K with its push
# timeline, BF16 and each tensorwise and rowwise mode and blockwise, and bench/projection.py's E at P = 8
# from each (as the timeline step, in the same session); ncu_fp8 (not in the default) profiles the
# promoted E4M3 GEMM (cuBLASLt's and ours) and the all-gather, blockwise and rowwise, with ncu;
# small_m (not in the default) times the small-M targets: the GEMM at M = 1..512 and the
# reduce-scatter's proxy at M = 8..512 (P = 8 both layouts, P = 4 and 2 N x K), interleaved and
# checked, then N x K in separate loops (the cycles x clock split).
# timeline: the proxy at P = 8 with its push timeline, both layouts, then bench/projection.py's E at
# P = 8 from it (T_gemm: cuBLAS from the timeline run's own loop, under each T_comm model; M = 512 and
# 2048 marked). baseline (and fused) time NCCL's reduce-scatter on plain buffers and on symmetric windows.
# Each step's output goes to OUT_DIR/<step>.log; its last lines are echoed. Every step is bounded by
# STEP_TIMEOUT seconds (default 300). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail

build=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(env tests sanitize gemm proxy timeline ag_proxy baseline fused)
bench="${build}/bench/tpfuse_bench"
projection="$(cd "$(dirname "$0")/.." && pwd)/bench/projection.py"

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

# memcheck, racecheck and synccheck (steps <tool>_NAME) on the tests of BINARY that FILTER names;
# racecheck without FILTER's entry NOT_RACECHECK, if given (several steps a CTA: the sanitize step says
# why).
sanitize_tools() {
  local name=$1 binary=$2 filter=$3 not_racecheck=${4:-} tool tool_filter
  for tool in memcheck racecheck synccheck; do
    tool_filter=${filter}
    [[ ${tool} == racecheck && -n ${not_racecheck} ]] && tool_filter=${filter//":${not_racecheck}"/}
    run_step "${tool}_${name}" compute-sanitizer --tool "${tool}" --error-exitcode 1 "${binary}" --gtest_filter="${tool_filter}"
  done
}

for step in "${steps[@]}"; do
  case "${step}" in
    env)
      run_step env bash -c 'nvidia-smi; nvidia-smi topo -m; nvcc --version | tail -1; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"'
      ;;
    tests)
      run_step test_gemm "${build}/tests/gpu/test_gemm"
      run_step test_fused "${build}/tests/gpu/test_fused"
      run_step test_all_gather "${build}/tests/gpu/test_all_gather"
      run_step test_fp8 "${build}/tests/gpu/test_fp8"
      # One process per GPU needs 2 or more GPUs; on one it runs a single rank, to check the harness.
      run_step test_multiprocess bash -c "\"${build}/tests/gpu/test_multiprocess\"; rc=\$?; [ \$rc -ne 77 ] && exit \$rc; TPFUSE_TEST_RANKS=1 \"${build}/tests/gpu/test_multiprocess\""
      ;;
    sanitize)
      # Small shapes, one of each variant the tests reach: the GEMM's 64-row and one-wave tiles, the
      # fused op at P = 2, 4 (bands of two segments) and 8 (one wave: 4 stages, slabs staged in
      # halves), own tiles inside the rounds (_lag0), and the partial rounds (FusedRandom ..._lag0).
      small_gemm='*GemmShapes*/M8_N8_K8_KxN:*GemmShapes*/M8_N1000_K1024_NxK:*GemmShapes*/M200_N8192_K72_KxN:*GemmExact*'
      small_fused='*FusedExact*/P2_M512_N776_K128_KxN:*FusedExact*/P8_M512_N8192_K32_KxN:*FusedExact*/P8_M64_N264_K32_KxN'
      small_fused+=':*FusedExact*/P4_M256_N1000_K64_KxN:*FusedExact*/P4_M256_N1000_K64_KxN_lag0:*FusedErrors.BadCalls*'
      # Tiles of several owners' rows: from registers at M <= 64 (1, 2, 4 rows per rank spread over a
      # warp's lanes, 8 and 32 held), staged above (32 rows per rank at P = 4), K whole and split.
      small_fused+=':*FusedExact*/P8_M8_N512_K32_NxK:*FusedExact*/P4_M8_N264_K64_KxN:*FusedExact*/P2_M8_N520_K128_NxK:*FusedExact*/P4_M128_N1000_K64_KxN:*FusedExact*/P2_M64_N520_K128_KxN_split2:*FusedExact*/P4_M128_N520_K128_KxN_split2'
      small_fused+=':*FusedExact*/P4_M32_N520_K128_KxN_split2:*RegisterEpilogueBitIdenticalToStaged*'
      # 128 x 128 tiles at M = 256: shared (P = 8) and in bands of 128 rows (P = 2).
      small_fused+=':*FusedExact*/P8_M256_N8192_K32_KxN:*FusedExact*/P2_M256_N1000_K128_NxK'
      # Sequences (a tile's slabs from two shards: two boxes), and a bias on the staged and register paths.
      small_fused+=':*FusedExact*/P4_M1024_N1000_K64_NxK_batch4:*FusedExact*/P4_M1024_N1000_K64_NxK_batch4_bias'
      small_fused+=':*FusedExact*/P8_M8_N512_K32_NxK_bias:*FusedExact*/P4_M128_N520_K128_KxN_split2_bias'
      run_step memcheck_gemm compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter="${small_gemm}"
      run_step memcheck_fused compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter="${small_fused}"
      # The GEMM's tiles of one consumer (64 x 64 and 64 x 192: its ring released by one warpgroup),
      # whole and split, and the swap-AB kernel (forced in the split tests too), several tiles a CTA.
      # (Tests without cuBLAS: racecheck reports cuBLAS's own small-M kernel.)
      one_consumer='*GemmSplitK.SmallIntegers*/M8_N1000_K1024_NxK:*GemmSplitK.SmallIntegers*/M24_N1000_K2056_KxN'
      one_consumer+=':*GemmSplitK.SmallIntegers*/M200_N264_K1000_NxK:*GemmSwapAb*'
      # A split tail: whole tiles, then the last wave's tiles in splits.
      run_step memcheck_gemm_split_tail compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter='*GemmSplitTail*/M5760_N768_K1280_KxN'
      run_step memcheck_gemm_one_consumer compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter="${one_consumer}"
      run_step racecheck_gemm compute-sanitizer --tool racecheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter="${one_consumer}"
      run_step synccheck_gemm compute-sanitizer --tool synccheck --error-exitcode 1 "${build}/tests/gpu/test_gemm" --gtest_filter="${one_consumer}"
      # Not the P = 8 cases of one wave (M = 512; M = 256 on 128 x 128 tiles): eight emulated ranks
      # share the SMs, so a CTA takes several steps, and then racecheck reports the producer's note
      # of a later step (stage_tile) against the consumers' reads of an earlier one, which the
      # stage's empty mbarrier orders (two arrivals, one per consumer warpgroup, each after a
      # warpgroup barrier); racecheck reports it all the same (docs/EXPERIMENTS.md).
      run_step racecheck_fused compute-sanitizer --tool racecheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter='*FusedExact*/P2_M512_N776_K128_KxN:*FusedExact*/P4_M256_N1000_K64_KxN:*FusedExact*/P8_M8_N512_K32_NxK:*FusedExact*/P4_M8_N264_K64_KxN:*FusedExact*/P2_M8_N520_K128_NxK:*FusedExact*/P2_M64_N520_K128_KxN_split2:*FusedExact*/P4_M128_N520_K128_KxN_split2:*FusedExact*/P4_M32_N520_K128_KxN_split2:*FusedExact*/P2_M256_N1000_K128_NxK:*FusedExact*/P4_M1024_N1000_K64_NxK_batch4_bias:*FusedExact*/P8_M8_N512_K32_NxK_bias'
      run_step synccheck_fused compute-sanitizer --tool synccheck --error-exitcode 1 "${build}/tests/gpu/test_fused" --gtest_filter='*FusedExact*/P2_M512_N776_K128_KxN:*FusedExact*/P8_M512_N8192_K32_KxN:*FusedExact*/P4_M256_N1000_K64_KxN:*FusedExact*/P8_M8_N512_K32_NxK:*FusedExact*/P4_M8_N264_K64_KxN:*FusedExact*/P2_M8_N520_K128_NxK:*FusedExact*/P2_M64_N520_K128_KxN_split2:*FusedExact*/P4_M128_N520_K128_KxN_split2:*FusedExact*/P4_M32_N520_K128_KxN_split2:*FusedExact*/P8_M256_N8192_K32_KxN:*FusedExact*/P2_M256_N1000_K128_NxK:*FusedExact*/P4_M1024_N1000_K64_NxK_batch4_bias:*FusedExact*/P8_M8_N512_K32_NxK_bias'
      # The all-gather + GEMM: P = 2, 3 (rows per rank not a multiple of 64) and 8 (64-row tiles); bands
      # of two 64-row blocks, one band of all blocks (8, 24 and 48 rows each), split K.
      small_ag='*AllGatherExact*/P2_M512_N776_K256_KxN:*AllGatherExact*/P3_M999_N136_K200_KxN:*AllGatherExact*/P8_M64_N264_K256_KxN'
      small_ag+=':*AllGatherExact*/P4_M256_N1000_K128_NxK_shared:*AllGatherExact*/P8_M512_N1280_K256_NxK_shared'
      small_ag+=':*AllGatherExact*/P4_M96_N136_K256_NxK:*AllGatherExact*/P2_M96_N264_K256_KxN'
      small_ag+=':*AllGatherExact*/P2_M256_N520_K256_NxK_split2:*AllGatherExact*/P4_M256_N264_K128_KxN_split2'
      # Every CTA copying where the config leaves the copy to the CTAs without a tile (the others do).
      small_ag+=':*AllGatherExact*/P4_M256_N1000_K128_KxN_allcopy'
      # Sequences (Y stored by shard, the gathered X copied by sequence), with a bias.
      small_ag+=':*AllGatherExact*/P4_M1024_N1000_K256_KxN_batch4_bias'
      # Racecheck not on the P = 8 bands of two: several steps a CTA, the stage_tile report above.
      sanitize_tools all_gather "${build}/tests/gpu/test_all_gather" "${small_ag}" '*AllGatherExact*/P8_M512_N1280_K256_NxK_shared'
      # The all-gather on 128 x 128 tiles (its variant of its own), random inputs.
      run_step memcheck_all_gather_128x128 compute-sanitizer --tool memcheck --error-exitcode 1 "${build}/tests/gpu/test_all_gather" --gtest_filter='*AllGatherRandom*/P8_M1024_N1024_K6144_KxN'
      # Blockwise E4M3 scales (their 128 x 128 promoted variant, a K block's scales loaded once its stage
      # is full): the GEMM (17 rows; K split in two), the reduce-scatter at P = 2 and 8 (17 rows and one
      # a rank), the all-gather at P = 2 (17 rows a rank in a band of both blocks, K split as the config
      # splits it; forced splits in bands of one) and 8 (one row a rank with a bias, in a band of every
      # block, K split as the config splits it; bands of two 64-row blocks, not under racecheck, as above).
      small_blockwise='*Fp8BlockwiseGemmExact*/P1_M17_N520_K384_powers:*Fp8BlockwiseGemmExact*/P1_M64_N2048_K4096_powers_split2'
      small_blockwise+=':*Fp8BlockwiseReduceScatter*/P2_M34_N520_K256_cancelling:*Fp8BlockwiseReduceScatter*/P8_M8_N1024_K256_cancelling'
      small_blockwise+=':*Fp8BlockwiseAllGather*/P2_M34_N520_K4096:*Fp8BlockwiseAllGather*/P2_M256_N520_K1024_split2'
      small_blockwise+=':*Fp8BlockwiseAllGather*/P8_M8_N256_K4096_bias:*Fp8BlockwiseAllGather*/P8_M512_N4096_K256_bias'
      # The GEMM's 128 x 192 blockwise variant: a slab over two blocks of W's scales (17 rows; zero
      # blocks; K split in two).
      small_blockwise+=':*Fp8BlockwiseGemmExact*/P1_M17_N248_K384_powers_wide192'
      small_blockwise+=':*Fp8BlockwiseGemmExact*/P1_M200_N1000_K512_cancelling_zero_blocks_wide192'
      small_blockwise+=':*Fp8BlockwiseGemmExact*/P1_M64_N2048_K4096_powers_split2_wide192'
      sanitize_tools blockwise "${build}/tests/gpu/test_fp8" "${small_blockwise}" '*Fp8BlockwiseAllGather*/P8_M512_N4096_K256_bias'
      # Partial rounds during the K loop: a small shape with its own tiles interleaved.
      sanitize_tools rounds "${build}/tests/gpu/test_fused" '*FusedRandom*/P2_M512_N512_K320_KxN_lag0'
      ;;
    gemm)
      run_step gemm_kn "${bench}" --mode gemm --layout kn --check --json "${out}/gemm_kn.json" --csv "${out}/gemm_kn.csv"
      run_step gemm_nk "${bench}" --mode gemm --layout nk --check --json "${out}/gemm_nk.json" --csv "${out}/gemm_nk.csv"
      ;;
    proxy)
      run_step proxy_kn "${bench}" --mode proxy --layout kn --check --json "${out}/proxy_kn.json" --csv "${out}/proxy_kn.csv"
      run_step proxy_nk "${bench}" --mode proxy --layout nk --check --json "${out}/proxy_nk.json" --csv "${out}/proxy_nk.csv"
      ;;
    timeline)
      for layout in kn nk; do
        run_step timeline_${layout} "${bench}" --mode proxy --tp 8 --layout ${layout} --timeline --json "${out}/timeline_${layout}.json" --csv "${out}/timeline_${layout}.csv"
        # T_gemm from the timeline run's own loop (projection.py refuses another run's).
        TAIL_LINES=20 run_step projection_${layout} python3 "${projection}" "${out}/timeline_${layout}.json" --json "${out}/projection_${layout}.json"
      done
      ;;
    ag_proxy)
      run_step ag_proxy_kn "${bench}" --mode proxy --op ag --layout kn --check --json "${out}/ag_proxy_kn.json" --csv "${out}/ag_proxy_kn.csv"
      run_step ag_proxy_nk "${bench}" --mode proxy --op ag --layout nk --check --json "${out}/ag_proxy_nk.json" --csv "${out}/ag_proxy_nk.csv"
      ;;
    small_m)
      # The four projections' per-rank shapes at P (K/P of that P) for each M.
      shapes_at() {
        local p=$1 list=() m
        shift
        for m in "$@"; do
          list+=("${m},8192,$((8192 / p))" "${m},8192,$((28672 / p))" "${m},6144,$((6144 / p))" "${m},6144,$((16384 / p))")
        done
        local IFS=';'
        echo "${list[*]}"
      }
      gemm_shapes=$(shapes_at 8 1 8 16 32 64 128 256 512)
      for layout in nk kn; do
        run_step gemm_small_${layout} "${bench}" --mode gemm --layout ${layout} --shapes "${gemm_shapes}" --check --json "${out}/gemm_small_${layout}.json"
      done
      for pl in 8:nk 8:kn 4:nk 2:nk; do
        p=${pl%:*} layout=${pl#*:}
        run_step proxy_small_p${p}_${layout} "${bench}" --mode proxy --tp ${p} --layout ${layout} --shapes "$(shapes_at ${p} 8 16 32 64 128 256 512)" --check --json "${out}/proxy_small_p${p}_${layout}.json"
      done
      run_step separate_gemm_small_nk "${bench}" --mode gemm --layout nk --shapes "${gemm_shapes}" --separate-loops --json "${out}/separate_gemm_small_nk.json"
      for p in 8 4 2; do
        run_step separate_proxy_small_p${p}_nk "${bench}" --mode proxy --tp ${p} --layout nk --shapes "$(shapes_at ${p} 8 16 32 64 128 256 512)" --separate-loops --json "${out}/separate_proxy_small_p${p}_nk.json"
      done
      ;;
    baseline)
      run_step baseline "${bench}" --mode baseline --check --json "${out}/baseline.json" --csv "${out}/baseline.csv"
      ;;
    fp8)
      run_step test_fp8 "${build}/tests/gpu/test_fp8"
      # Blockwise scales are promoted only.
      for scaling in tensorwise rowwise blockwise; do
        for accumulation in promoted fast; do
          [[ ${scaling} == blockwise && ${accumulation} == fast ]] && continue
          flags=(--layout nk --fp8 "${scaling}" --check)
          [[ ${accumulation} == fast ]] && flags+=(--fast-accum)
          run_step "gemm_fp8_${scaling}_${accumulation}" "${bench}" --mode gemm "${flags[@]}" \
            --json "${out}/gemm_fp8_${scaling}_${accumulation}.json"
          run_step "proxy_fp8_${scaling}_${accumulation}" "${bench}" --mode proxy "${flags[@]}" \
            --json "${out}/proxy_fp8_${scaling}_${accumulation}.json"
          run_step "ag_proxy_fp8_${scaling}_${accumulation}" "${bench}" --mode proxy --op ag "${flags[@]}" \
            --json "${out}/ag_proxy_fp8_${scaling}_${accumulation}.json"
        done
      done
      # The push timeline at P = 8 (NAME, then the inputs' flags), and projection.py's E from it (T_gemm
      # from the timeline run's own loop, as in the timeline step).
      timeline_at_8() {
        local name=$1
        shift
        run_step "timeline_${name}" "${bench}" --mode proxy --tp 8 --layout nk "$@" --timeline \
          --json "${out}/timeline_${name}.json"
        TAIL_LINES=20 run_step "projection_${name}" python3 "${projection}" "${out}/timeline_${name}.json" \
          --json "${out}/projection_${name}.json"
      }
      timeline_at_8 bf16_nk
      for scaling in tensorwise rowwise; do
        for accumulation in promoted fast; do
          flags=(--fp8 "${scaling}")
          [[ ${accumulation} == fast ]] && flags+=(--fast-accum)
          timeline_at_8 "fp8_${scaling}_${accumulation}" "${flags[@]}"
        done
      done
      timeline_at_8 fp8_blockwise_promoted --fp8 blockwise
      ;;
    ncu_fp8)
      # Where a promoted E4M3 call's time goes, blockwise beside rowwise: the first launches of the
      # GEMM mode's kernels (cuBLASLt's and ours, by name) at an o_proj shape, and one all-gather
      # launch, each with ncu's full set of metrics (CSV, one row a launch).
      for scaling in blockwise rowwise; do
        run_step "ncu_gemm_${scaling}" ncu --clock-control none --set full --csv --page raw -k regex:gemm \
          --launch-count 4 "${bench}" --mode gemm --layout nk --fp8 "${scaling}" --shapes 8192,8192,1024 \
          --warmup 1 --iters 1 --no-gate
        run_step "ncu_ag_${scaling}" ncu --clock-control none --set full --csv --page raw -k regex:all_gather_kernel \
          --launch-skip 2 --launch-count 1 "${bench}" --mode proxy --op ag --layout nk --fp8 "${scaling}" \
          --shapes 8192,4096,6144 --warmup 1 --iters 1 --no-gate
      done
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
