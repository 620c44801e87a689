#!/usr/bin/env bash
# The Python package on a GPU machine without network (torch, scikit-build-core, cmake, ninja and pytest
# already installed; third_party/cutlass present, e.g. carried): installs the package into python3,
# runs the Python tests (the CPU ones, then the GPU ones under torchrun), the training example
# (examples/tp_mlp; BF16, then with --fp8 blockwise beside it) and `python -m tpfuse.bench` under torchrun (BF16, then --fp8 rowwise and blockwise), at world size 1 unless TPFUSE_GPU_NPROC
# says otherwise. Logs, JUnit XML and the benchmark's JSON go to OUT_DIR; a failed step does not stop the later ones; each step's exit code
# and time are printed last.
#
#   bash scripts/gpu_python.sh OUT_DIR
#
# Environment: PYTHON (default python3); TPFUSE_WHEEL, a wheel to install instead of building the package; TPFUSE_GPU_NPROC, the world size of the tests and benchmark
# (default 1; at 2 or more the multi-GPU tests run too); TPFUSE_GPU_BUDGET_S, the whole run's time
# limit in seconds (default 540: each step gets what is left of it, up to its own limit);
# TPFUSE_GIT_COMMIT, the commit the benchmark's JSON names where the tree has no .git.
set -uo pipefail

if [[ $# != 1 ]]; then echo "usage: bash scripts/gpu_python.sh OUT_DIR" >&2; exit 2; fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$1"
readonly OUT_DIR="$(cd "$1" && pwd)"
readonly PYTHON="${PYTHON:-python3}"
readonly BUDGET_S="${TPFUSE_GPU_BUDGET_S:-540}"
readonly NPROC="${TPFUSE_GPU_NPROC:-1}"
# A copy of the tree may come without .git: then TPFUSE_GIT_COMMIT names the commit for the JSON.
readonly COMMIT="${TPFUSE_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# NVLink multicast stays off, in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# CMake finds nvcc through CUDACXX or PATH; the toolkit's usual place need not be on PATH.
if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null; then
  for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n "${candidate}" && -x "${candidate}/bin/nvcc" ]]; then export CUDACXX="${candidate}/bin/nvcc"; break; fi
  done
fi
start=${SECONDS}
summary=()

# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in OUT_DIR/NAME.log, for at most LIMIT_S
# seconds or what is left of the budget, and notes its exit code (124: out of time).
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET_S - (SECONDS - start)))
  if ((left < limit)); then limit=${left}; fi
  if ((limit < 10)); then
    summary+=("$(printf '%-14s not run: the %s s budget is spent' "${name}" "${BUDGET_S}")")
    return 124
  fi
  local began=${SECONDS}
  echo "[gpu_python] ${name} (at most ${limit} s): $*"
  timeout --kill-after=15 "${limit}" "$@" > "${OUT_DIR}/${name}.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s exit %3d  %4d s  %s' "${name}" "${rc}" $((SECONDS - began)) "${name}.log")")
  return "${rc}"
}

if [[ ! -f third_party/cutlass/include/cute/tensor.hpp ]]; then
  echo "[gpu_python] third_party/cutlass is missing: run scripts/install_deps.sh where there is network and bring" \
       "third_party/cutlass along; the install step will fail" >&2
fi
{
  timeout 30 nvidia-smi
  "${CUDACXX:-nvcc}" --version
  timeout 60 "${PYTHON}" -c 'import sys, torch, nvidia.nccl as package
print("python", sys.version)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(),
      "GPUs", torch.cuda.device_count())
print("nvidia.nccl", list(package.__path__)[0])'
  env | grep -E '^(NCCL|TORCH|NVSHMEM)_' | sort
} > "${OUT_DIR}/env.log" 2>&1

# TPFUSE_WHEEL: a wheel built elsewhere (pip wheel .), installed instead of building here.
package="${TPFUSE_WHEEL:-.}"
step install 240 "${PYTHON}" -m pip install -v --no-build-isolation --no-deps "${package}"
if [[ $? != 0 ]] && grep -qE 'Permission denied|Read-only file system' "${OUT_DIR}/install.log"; then
  # python3's site-packages is not writable: a folder of our own on PYTHONPATH instead.
  step install_target 240 "${PYTHON}" -m pip install -v --no-build-isolation --no-deps --target /tmp/tpfuse-site \
    "${package}"
  export PYTHONPATH="/tmp/tpfuse-site${PYTHONPATH:+:${PYTHONPATH}}"
fi
step nccl 60 "${PYTHON}" -c "import tpfuse; print(tpfuse.nccl_info())"
# 180 s: test_symm_mem_override.py compiles with Inductor's C++ backend on the CPU.
step cpu_tests 180 "${PYTHON}" -m pytest tests/python/cpu -rs -v -p no:cacheprovider \
  --junitxml="${OUT_DIR}/cpu_tests.xml"
step gpu_tests 240 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" -m pytest tests/python/gpu \
  -rs -v -p no:cacheprovider --junitxml="${OUT_DIR}/gpu_tests.xml"
step example 120 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" examples/tp_mlp/train.py --steps 5
step example_fp8 120 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" examples/tp_mlp/train.py --steps 5 \
  --fp8 blockwise
step bench 300 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" -m tpfuse.bench \
  --json "${OUT_DIR}/bench_python.json" --git-commit "${COMMIT}"
step bench_fp8 300 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" -m tpfuse.bench --fp8 rowwise \
  --json "${OUT_DIR}/bench_python_fp8.json" --git-commit "${COMMIT}"
step bench_fp8_blockwise 300 "${PYTHON}" -m torch.distributed.run --nproc-per-node="${NPROC}" -m tpfuse.bench \
  --fp8 blockwise --json "${OUT_DIR}/bench_python_fp8_blockwise.json" --git-commit "${COMMIT}"

echo
echo "[gpu_python] ${OUT_DIR}, $((SECONDS - start)) s:"
for line in "${summary[@]}"; do echo "  ${line}"; done
for name in cpu_tests gpu_tests; do
  [[ -f "${OUT_DIR}/${name}.log" ]] && echo "  ${name}: $(grep -E '^=+ .*(passed|failed|error|skipped).* =+$' "${OUT_DIR}/${name}.log" | tail -n1)"
done
for name in bench bench_fp8 bench_fp8_blockwise; do
  if [[ -f "${OUT_DIR}/${name}.log" ]]; then
    line="$(grep -E '^\[tpfuse.bench\] summary' "${OUT_DIR}/${name}.log" | tail -n1)"
    echo "  ${name}: ${line:-no summary; its last error: $(grep -E '(Error|Exception):' "${OUT_DIR}/${name}.log" | grep -v ChildFailedError | tail -n1)}"
  fi
done
failed=0
for line in "${summary[@]}"; do [[ "${line}" =~ exit\ +0\  ]] || failed=1; done
exit "${failed}"
