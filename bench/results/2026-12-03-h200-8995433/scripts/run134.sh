#!/usr/bin/env bash
# Device run 134: the reduce-scatter on one wave of 128 x 128 tiles at M = 256 (the new build)
# against 13b972e (the old one). Every GPU test and sanitizer step of scripts/gpu_run.sh on the new
# build; then the proxy at M = 256 for P = 8, 4, 2 (the four projections' per-rank shapes; M = 512
# at P = 8 as a control whose config did not change), old and new alternating, two passes, N x K,
# checked; one pass K x N at P = 8.
set -u
B=${TMPDIR:-/tmp}/run134; rm -rf $B; mkdir -p $B/old $B/new
tar -C $B/new -xzf "${BINARIES:?a tarball of the new build}"; tar -C $B/old -xzf "${BASE_BINARIES:?a tarball of the old build}"
O=$OUT/run134; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if nccl_dir=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null); then
  export LD_LIBRARY_PATH="${nccl_dir}:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
STEP_TIMEOUT=150 TAIL_LINES=2 bash scripts/gpu_run.sh $B/new/build $O/checks tests sanitize 2>&1 | grep -E "^== |exit|PASSED|FAILED|SUMMARY"
shapes() {  # P: M = 256 of the four projections at K / P
  local p=$1
  echo "256,8192,$((8192 / p));256,8192,$((28672 / p));256,6144,$((6144 / p));256,6144,$((16384 / p))"
}
run() {  # name -- arguments
  local name=$1; shift
  timeout 120 "$@" --check --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$?: $(grep -h '^# proxy:' $O/$name.txt | cut -c1-110)"
}
for pass in 1 2; do
  for build in old new; do
    for p in 8 4 2; do
      extra=""; [[ $p == 8 ]] && extra=";512,8192,1024"
      run proxy_p${p}_nk_${build}_$pass $B/$build/build/bench/tpfuse_bench --mode proxy --tp $p --layout nk --shapes "$(shapes $p)$extra"
    done
  done
done
for build in old new; do
  run proxy_p8_kn_${build}_1 $B/$build/build/bench/tpfuse_bench --mode proxy --tp 8 --layout kn --shapes "$(shapes 8)"
done
cd $OUT && tar -czf run134.tgz run134
