#!/usr/bin/env bash
# Device run 110: the all-gather's steps down the bands in one wave of one-row bands (new) against
# 2282212 (base): every GPU test and sanitizer of new; the all-gather's solo-rank proxy (its copier
# at work), base and new alternating, checked: P = 8 N x K two passes, K x N, P = 4 and 2 one.
set -u
B=${TMPDIR:-/tmp}/run110; rm -rf $B; mkdir -p $B; tar -C $B -xzf "${BINARIES:?a tarball of base/ and new/ (bench/tpfuse_bench; new/ also tests/gpu/test_*)}"
O=$OUT/run110; mkdir -p $O
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
STEP_TIMEOUT=200 TAIL_LINES=2 bash scripts/gpu_run.sh $B/new $O/checks tests sanitize
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
for p in 4 2; do
  for v in base new; do run ag_p${p}_nk_${v}_1 $B/$v/bench/tpfuse_bench --mode ag-proxy --tp $p --layout nk --check; done
done
grep -h "# ag-proxy:" $O/*.txt
cd $OUT && tar -czf run110.tgz run110
