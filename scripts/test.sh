#!/usr/bin/env bash
# Builds everything (the CUDA library, kernels, benchmark and tests: a compile error fails) and runs
# the tests, then the Python package's (scripts/test_python.sh: torch from PyPI, pip install ., pytest).
# This is what CI runs. GPU tests report "Skipped" (with their reason below) without a GPU.
#
#   bash scripts/test.sh [extra cmake configure arguments, e.g. -DTPFUSE_CUDA_GENCODE=...]
#
# Environment: TPFUSE_CUDA=OFF for a CPU-only build and tests (no Python package: it needs the CUDA
# library); TPFUSE_BUILD_DIR (default build); TPFUSE_JOBS, parallel compile jobs (default 2).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly BUILD_DIR="${TPFUSE_BUILD_DIR:-build}"
readonly JOBS="${TPFUSE_JOBS:-2}"
readonly WANT_CUDA="${TPFUSE_CUDA:-ON}"
start=${SECONDS}

bash scripts/install_deps.sh

# CMake finds nvcc through CUDACXX or PATH; the toolkit's usual place need not be on PATH.
if [[ "${WANT_CUDA}" != "OFF" && -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null; then
  for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n "${candidate}" && -x "${candidate}/bin/nvcc" ]]; then export CUDACXX="${candidate}/bin/nvcc"; break; fi
  done
fi

echo "[test] configure ${BUILD_DIR} (Release, TPFUSE_CUDA=${WANT_CUDA})"
cmake -S . -B "${BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPFUSE_CUDA="${WANT_CUDA}" -DTPFUSE_TESTS=ON "$@"
echo "[test] build (-j${JOBS})"
cmake --build "${BUILD_DIR}" -j "${JOBS}"
echo "[test] built in $((SECONDS - start)) s; running the tests"

log="${BUILD_DIR}/ctest.log"
set +e
ctest --test-dir "${BUILD_DIR}" --output-on-failure --no-tests=error 2>&1 | tee "${log}"
rc=${PIPESTATUS[0]}
set -e

# CTest does not show a skipped test's output: print each skipped test's reason from its log, then
# end with CTest's summary line again.
skipped="$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "${log}")"
if [[ -n "${skipped}" ]]; then
  echo "Skipped tests, and why:"
  while read -r name; do
    reason="$(awk -v name="${name}" '
      /^[0-9]+\/[0-9]+ Test: / { in_test = (substr($0, index($0, "Test: ") + 6) == name) }
      in_test && /^Output:/ { getline; in_output = 1; next }
      in_output && /^<end of output>/ { exit }
      in_output && NF && first == "" { first = $0 }
      in_output && tolower($0) ~ /skip/ { print; found = 1; exit }
      END { if (!found && first != "") print first }' "${BUILD_DIR}/Testing/Temporary/LastTest.log")"
    echo "  ${name}: ${reason:-(no reason printed)}"
  done <<< "${skipped}"
  grep -E '^[0-9]+% tests passed' "${log}" | tail -n1
fi

if [[ "${WANT_CUDA}" == "OFF" ]]; then
  echo "[test] TPFUSE_CUDA=OFF: no Python package tests (the package needs the CUDA library)"
  exit "${rc}"
fi
echo "[test] C++ tests exit ${rc} after $((SECONDS - start)) s; now the Python package's"
# The output ends with pytest's summary line.
python_rc=0
CMAKE_BUILD_PARALLEL_LEVEL="${JOBS}" TPFUSE_BUILD_DIR="${BUILD_DIR}" bash scripts/test_python.sh || python_rc=$?
if [[ ${rc} != 0 ]]; then exit "${rc}"; fi
exit "${python_rc}"
