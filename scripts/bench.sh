#!/usr/bin/env bash
# Builds the benchmark and runs the shape sweep on the visible GPUs. Results (the printed table,
# JSON, CSV and the environment) go to $TPFUSE_BUILD_DIR/runs/<date>-<GPUs>/, outside git: bench/results/
# keeps only the runs the docs cite, copied there by hand.
#
#   bash scripts/bench.sh [tpfuse_bench arguments]      e.g. --mode fused --iters 200 --check
#
# Arguments are passed through; --shapes sweep, --json and --csv are added unless given, and without
# --mode the sweep is the fused op against cuBLAS + NCCL (--mode fused --check) on 2 or more GPUs, and
# on one GPU the solo-rank proxy next to our GEMM and cuBLAS (--mode proxy --check). A plot (PNG) is
# drawn from the JSON where python3 has matplotlib.
# Environment: TPFUSE_BUILD_DIR (default build); TPFUSE_JOBS (default: all cores);
# TPFUSE_NO_BUILD=1 runs the binary already in the build folder (e.g. one built on another machine).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly BUILD_DIR="${TPFUSE_BUILD_DIR:-build}"
readonly JOBS="${TPFUSE_JOBS:-$(nproc)}"
readonly BENCH="${BUILD_DIR}/bench/tpfuse_bench"

if [[ "${TPFUSE_NO_BUILD:-0}" != 1 ]]; then
  bash scripts/install_deps.sh
  if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null; then
    for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
      if [[ -n "${candidate}" && -x "${candidate}/bin/nvcc" ]]; then export CUDACXX="${candidate}/bin/nvcc"; break; fi
    done
  fi
  cmake -S . -B "${BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPFUSE_CUDA=ON
  cmake --build "${BUILD_DIR}" -j "${JOBS}" --target tpfuse_bench
fi
[[ -x "${BENCH}" ]] || { echo "[bench] ${BENCH} not found: build it first (run without TPFUSE_NO_BUILD)" >&2; exit 1; }

# Name the results folder after the date and the GPUs, e.g. 2026-11-29-8xh200.
gpus="nogpu"
if command -v nvidia-smi >/dev/null && names="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" &&
   [[ -n "${names}" ]]; then
  count="$(wc -l <<< "${names}")"
  model="$(head -n1 <<< "${names}" | tr '[:upper:]' '[:lower:]' | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/^-//;s/-$//')"
  gpus="${count}x${model}"
fi
out_dir="${BUILD_DIR}/runs/$(date +%Y-%m-%d)-${gpus}"
[[ -e "${out_dir}" ]] && out_dir="${out_dir}-$(date +%H%M%S)"
mkdir -p "${out_dir}"

args=("$@")
has() { local flag; for flag in "${args[@]}"; do [[ "${flag}" == "$1" || "${flag}" == "$1="* ]] && return 0; done; return 1; }
if ! has --mode; then
  if [[ "${count:-0}" -ge 2 ]]; then args+=(--mode fused --check); else args+=(--mode proxy --check); fi
fi
has --shapes || args+=(--shapes sweep)
has --json || args+=(--json "${out_dir}/results.json")
has --csv || args+=(--csv "${out_dir}/results.csv")

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if commit="$(git rev-parse --verify -q HEAD 2>/dev/null)"; then
    echo "commit: ${commit}$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  else
    echo "commit: no git checkout here; the binary's commit is in the JSON's meta"
  fi
  echo "command: ${BENCH} ${args[*]}"
  command -v nvcc >/dev/null && echo "nvcc: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv
  command -v nvidia-smi >/dev/null && nvidia-smi topo -m
} > "${out_dir}/env.txt" 2>&1 || true

echo "[bench] results -> ${out_dir}"
set +e
"${BENCH}" "${args[@]}" 2>&1 | tee "${out_dir}/table.txt"
rc=${PIPESTATUS[0]}
set -e
if [[ "${rc}" -eq 0 && -s "${out_dir}/results.json" ]] && python3 -c "import matplotlib" 2>/dev/null; then
  python3 bench/plot.py "${out_dir}/results.json" -o "${out_dir}/results.png" && echo "[bench] plot: ${out_dir}/results.png"
fi
echo "[bench] exit ${rc}; results in ${out_dir}"
exit "${rc}"
