#!/usr/bin/env bash
# Device run 112: the all-gather's 64-row blocks kept in bands of one where those make one wave
# (new) against 770e874 (base): test_all_gather and its sanitizers (the runs of
# scripts/gpu_run.sh's all-gather filter); the all-gather's solo-rank proxy, base and new
# alternating, checked: P = 8 N x K two passes, K x N one.
set -u
B=${TMPDIR:-/tmp}/run112; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of base/ and new/ (bench/tpfuse_bench; new/ also tests/gpu/test_all_gather)}"
O=$OUT/run112; mkdir -p $O/checks
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
small_ag='*AllGatherExact*/P2_M512_N776_K256_KxN:*AllGatherExact*/P3_M999_N136_K200_KxN:*AllGatherExact*/P8_M64_N264_K256_KxN'
small_ag+=':*AllGatherExact*/P4_M256_N1000_K128_NxK_shared:*AllGatherExact*/P8_M512_N1280_K256_NxK_shared'
small_ag+=':*AllGatherExact*/P4_M96_N136_K256_NxK:*AllGatherExact*/P2_M96_N264_K256_KxN'
small_ag+=':*AllGatherExact*/P2_M256_N520_K256_NxK_split2:*AllGatherExact*/P4_M256_N264_K128_KxN_split2'
small_ag+=':*AllGatherExact*/P4_M256_N1000_K128_KxN_allcopy'
timeout 200 $B/new/tests/gpu/test_all_gather > $O/checks/test_all_gather.log 2>&1; echo "test_all_gather rc=$?"; tail -1 $O/checks/test_all_gather.log
for tool in memcheck racecheck synccheck; do
  filter="${small_ag}"
  [[ ${tool} == racecheck ]] && filter="${small_ag//:\*AllGatherExact\*\/P8_M512_N1280_K256_NxK_shared/}"
  timeout 200 compute-sanitizer --tool ${tool} --error-exitcode 1 $B/new/tests/gpu/test_all_gather --gtest_filter="${filter}" > $O/checks/${tool}_all_gather.log 2>&1
  echo "${tool} rc=$?"; tail -1 $O/checks/${tool}_all_gather.log
done
if nccl_dir=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null); then
  export LD_LIBRARY_PATH="${nccl_dir}:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
run() {  # name -- command
  local name=$1; shift
  local t0=$SECONDS
  timeout 200 "$@" --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
for pass in 1 2; do
  check=""; [[ $pass == 1 ]] && check="--check"
  for v in base new; do run ag_p8_nk_${v}_$pass $B/$v/bench/tpfuse_bench --mode ag-proxy --tp 8 --layout nk $check; done
done
for v in base new; do run ag_p8_kn_${v}_1 $B/$v/bench/tpfuse_bench --mode ag-proxy --tp 8 --layout kn --check; done
grep -h "# ag-proxy:" $O/*.txt
cd $OUT && tar -czf run112.tgz run112
