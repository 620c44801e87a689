#!/usr/bin/env bash
# Device run 109: the all-gather's cost at M = 512 taken apart. Builds of 0c64df4 (base) and probes
# on top of its copier moving nothing (v1 = run 107's nocopy): v2 no flag wait (no fences), v3 also
# no epoch read, v4 every tile's A from X_r (no gathered loads), v6 no end-of-call barrier and
# count; v7 = v1 with per-CTA timestamps of one call printed (the shared mainloop: the GEMM's, the
# all-gather's and the reduce-scatter's kernels).
set -u
B=${TMPDIR:-/tmp}/run109; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of base/ v1/ v2/ v3/ v4/ v6/ v7/ (tpfuse_bench each)}"
O=$OUT/run109; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if nccl_dir=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null); then
  export LD_LIBRARY_PATH="${nccl_dir}:${LD_LIBRARY_PATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
run() {  # name -- command
  local name=$1; shift
  local t0=$SECONDS
  timeout 120 "$@" --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
S512="512,1280,8192;512,7168,8192;512,1024,6144;512,4096,6144"
S="$S512;2048,1280,8192;2048,1024,6144"
for pass in 1 2; do
  check=""; [[ $pass == 1 ]] && check="--check"
  run ag_nk_base_$pass $B/base/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$S" $check
  run ag_nk_v1_$pass $B/v1/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$S" $check
  for v in v2 v3 v4 v6; do run ag_nk_${v}_$pass $B/$v/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$S"; done
done
for v in base v1 v2 v4; do run ag_kn_${v}_1 $B/$v/tpfuse_bench --mode ag-proxy --tp 8 --layout kn --shapes "$S512"; done
# Timestamps: one shape an invocation (the 100th call of each kernel's translation unit prints).
IFS=';' read -ra shapes <<< "$S512"
for s in "${shapes[@]}"; do
  run stamps_ag_${s//,/_} $B/v7/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$s" --iters 100
done
for s in 512,8192,1024 512,6144,768 2048,8192,1024; do
  run stamps_rs_${s//,/_} $B/v7/tpfuse_bench --mode proxy --tp 8 --layout nk --shapes "$s" --iters 100
done
grep -h "# ag-proxy:\|# proxy:" $O/*.txt
cd $OUT && tar -czf run109.tgz run109
