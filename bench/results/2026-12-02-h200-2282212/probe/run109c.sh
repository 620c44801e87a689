#!/usr/bin/env bash
# Device run 109, third call: v8 = v1 (the copier moving nothing) with the GEMM's tile order over
# all bands (the plain GEMM's raster of the whole m x n/P output), against v1; v9 = v8 with run
# 109's timestamps (the all-gather's kernel only).
set -u
B=${TMPDIR:-/tmp}/run109c; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of v1/ v8/ v9/}"
O=$OUT/run109c; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
run() {  # name -- command
  local name=$1; shift
  local t0=$SECONDS
  timeout 120 "$@" --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
S="512,1280,8192;512,7168,8192;512,1024,6144;512,4096,6144;2048,1280,8192;2048,1024,6144"
for pass in 1 2; do
  check=""; [[ $pass == 1 ]] && check="--check"
  for v in v1 v8; do run ag_nk_${v}_$pass $B/$v/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$S" $check; done
done
for v in v1 v8; do run ag_kn_${v}_1 $B/$v/tpfuse_bench --mode ag-proxy --tp 8 --layout kn --shapes "$S" --check; done
for s in 512,1280,8192 512,1024,6144 2048,1024,6144; do
  run stamps_ag_${s//,/_} $B/v9/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$s" --iters 100 --no-gate
done
grep -h "# ag-proxy:" $O/*.txt
cd $OUT && tar -czf run109c.tgz run109c
