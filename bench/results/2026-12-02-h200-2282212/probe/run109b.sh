#!/usr/bin/env bash
# Device run 109, second call: the timestamp probe (v7) again, without the bench's start gate (the
# probe's host-side read synchronizes inside the queued loop).
set -u
B=${TMPDIR:-/tmp}/run109; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?the run 109 tarball}"
O=$OUT/run109b; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
run() {  # name -- command
  local name=$1; shift
  local t0=$SECONDS
  timeout 120 "$@" --json $O/$name.json > $O/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
}
for s in 512,1280,8192 512,7168,8192 512,1024,6144 512,4096,6144 2048,1024,6144; do
  run stamps_ag_${s//,/_} $B/v7/tpfuse_bench --mode ag-proxy --tp 8 --layout nk --shapes "$s" --iters 100 --no-gate
done
for s in 512,8192,1024 512,6144,768 2048,8192,1024; do
  run stamps_rs_${s//,/_} $B/v7/tpfuse_bench --mode proxy --tp 8 --layout nk --shapes "$s" --iters 100 --no-gate
done
cd $OUT && tar -czf run109b.tgz run109b
