#!/usr/bin/env bash
# Device run 113: per-CTA timestamps (run 109's v7 stamps on the shared mainloop, on cd790d6's
# GEMM and reduce-scatter: build v10) at decode-sized M, P = 8: where the fused op's time goes
# against our GEMM's on the same per-rank shape.
set -u
B=${TMPDIR:-/tmp}/run113; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of v10/tpfuse_bench}"
O=$OUT/run113; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
run() {  # name -- command
  local name=$1; shift
  local t0=$SECONDS
  timeout 120 "$@" --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
for s in 64,8192,1024 32,8192,1024 64,6144,768 32,6144,768 256,8192,1024; do
  run stamps_rs_${s//,/_} $B/v10/tpfuse_bench --mode proxy --tp 8 --layout nk --shapes "$s" --iters 100 --no-gate
done
cd $OUT && tar -czf run113.tgz run113
