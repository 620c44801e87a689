#!/usr/bin/env bash
# Device run 111 (770e874): the all-gather at M = 512, P = 8 with bands of one block forced
# (shared_tiles=0: one wave of 64-row bands, now down the bands) against the config's bands of two,
# alternating; and the plain GEMM's raster groups (group_rows 2 and 8 against the default 32, in
# one process each: --compare) on the sweep's per-rank shapes and on the all-gather's M x N/P x K.
set -u
B=${TMPDIR:-/tmp}/run111; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of new/bench/tpfuse_bench}"
O=$OUT/run111; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
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
X=$B/new/bench/tpfuse_bench
S512="512,1280,8192;512,7168,8192;512,1024,6144;512,4096,6144"
for pass in 1 2; do
  check=""; [[ $pass == 1 ]] && check="--check"
  run ag512_nk_default_$pass $X --mode ag-proxy --tp 8 --layout nk --shapes "$S512" $check
  run ag512_nk_separate_$pass $X --mode ag-proxy --tp 8 --layout nk --shapes "$S512" --overrides shared_tiles=0 $check
done
run ag512_kn_default_1 $X --mode ag-proxy --tp 8 --layout kn --shapes "$S512" --check
run ag512_kn_separate_1 $X --mode ag-proxy --tp 8 --layout kn --shapes "$S512" --overrides shared_tiles=0 --check
for g in 2 8; do
  run gemm_sweep_nk_g$g $X --mode gemm --layout nk --compare group_rows=$g
done
run gemm_sweep_kn_g2 $X --mode gemm --layout kn --compare group_rows=2
AG=""
for nk in "1280 8192" "7168 8192" "1024 6144" "4096 6144"; do
  set -- $nk
  for m in 2048 8192 32768; do AG+="$m,$1,$2;"; done
done
run gemm_ag_nk_g2 $X --mode gemm --layout nk --shapes "${AG%;}" --compare group_rows=2
grep -h "# ag-proxy:\|# gemm" $O/*.txt | grep -v "^# gemm:" | head -40
cd $OUT && tar -czf run111.tgz run111
