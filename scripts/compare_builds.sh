#!/usr/bin/env bash
# Times two builds of the benchmark in one session on the GPU(s): the GEMM sweep, the reduce-scatter's
# proxy and the all-gather's proxy in both weight layouts, the two binaries alternating (before, after;
# a second pass, after, before), each run checked, then bench/compare.py's per-shape ratios and
# geomeans over the passes.
#
#   bash scripts/compare_builds.sh BEFORE_BENCH AFTER_BENCH OUT_DIR [extra tpfuse_bench arguments]
#
# BEFORE_BENCH and AFTER_BENCH are tpfuse_bench executables. Environment: MODES (default "gemm proxy
# ag-proxy"), PASSES (default 1; a pass after the first reverses the order of the two builds),
# STEP_TIMEOUT (seconds for each run, default 300). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
before=$1
after=$2
out=$(mkdir -p "$3" && cd "$3" && pwd)
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export NCCL_NVLS_ENABLE=0

for mode in ${MODES:-gemm proxy ag-proxy}; do
  for layout in kn nk; do
    for pass in $(seq 1 "${PASSES:-1}"); do
      order="before after"
      [[ ${pass} -gt 1 ]] && order="after before"
      for build in ${order}; do
        bin=$([[ ${build} == before ]] && echo "${before}" || echo "${after}")
        name="${mode}_${layout}_${build}_${pass}"
        start=${SECONDS}
        timeout "${STEP_TIMEOUT:-300}" "${bin}" --mode "${mode}" --layout "${layout}" --check \
          --json "${out}/${name}.json" "$@" > "${out}/${name}.txt" 2>&1
        echo "== ${name}: exit $? after $((SECONDS - start)) s; $(tail -n 1 "${out}/${name}.txt")"
      done
    done
    python3 "${here}/bench/compare.py" "${out}/${mode}_${layout}_before_*.json" "${out}/${mode}_${layout}_after_*.json" \
      > "${out}/${mode}_${layout}_compare.txt" 2>&1
    grep -E "geomean|differ" "${out}/${mode}_${layout}_compare.txt" | sed "s/^/   ${mode} ${layout} /"
  done
done
