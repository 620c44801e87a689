#!/usr/bin/env bash
# Times two builds of the benchmark in one session on the GPU(s): the gemm and proxy sweeps in both
# weight layouts, the two binaries alternating (before, after, before, after), each run checked,
# then bench/compare.py's per-shape ratios and geomeans.
#
#   bash scripts/compare_builds.sh BEFORE_BENCH AFTER_BENCH OUT_DIR [extra tpfuse_bench arguments]
#
# BEFORE_BENCH and AFTER_BENCH are tpfuse_bench executables. Each run is bounded by STEP_TIMEOUT
# seconds (default 300). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
before=$1
after=$2
out=$(mkdir -p "$3" && cd "$3" && pwd)
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export NCCL_NVLS_ENABLE=0

for mode in gemm proxy; do
  for layout in kn nk; do
    for build in before after; do
      bin=$([[ ${build} == before ]] && echo "${before}" || echo "${after}")
      name="${mode}_${layout}_${build}"
      start=${SECONDS}
      timeout "${STEP_TIMEOUT:-300}" "${bin}" --mode "${mode}" --layout "${layout}" --check \
        --json "${out}/${name}.json" "$@" > "${out}/${name}.txt" 2>&1
      echo "== ${name}: exit $? after $((SECONDS - start)) s; $(tail -n 1 "${out}/${name}.txt")"
    done
    python3 "${here}/bench/compare.py" "${out}/${mode}_${layout}_before.json" "${out}/${mode}_${layout}_after.json" \
      > "${out}/${mode}_${layout}_compare.txt" 2>&1
    grep -E "geomean|differ" "${out}/${mode}_${layout}_compare.txt" | sed "s/^/   ${mode} ${layout} /"
  done
done
