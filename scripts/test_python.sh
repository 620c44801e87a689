#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh runs this last; CI with it): a virtual environment with
# the pinned torch from PyPI (tests/python/requirements.txt), the package installed as the README
# says (pip install --no-build-isolation --no-deps .), then pytest on tests/python. Without a Hopper
# GPU the GPU tests report "skipped" with their reason; the CPU tests need none.
#
#   bash scripts/test_python.sh
#
# Environment: TPFUSE_BUILD_DIR (default build): the environment is $TPFUSE_BUILD_DIR/python-venv,
# the package's CMake build $TPFUSE_BUILD_DIR/pip; TPFUSE_PYTHON, the Python to make it with
# (default python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly BUILD_DIR="${TPFUSE_BUILD_DIR:-build}"
readonly VENV="${BUILD_DIR}/python-venv"
readonly PYTHON="${VENV}/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
start=${SECONDS}

if [[ ! -x "${PYTHON}" ]]; then
  echo "[test_python] virtual environment ${VENV} ($(${TPFUSE_PYTHON:-python3} --version))"
  "${TPFUSE_PYTHON:-python3}" -m venv "${VENV}"
fi
echo "[test_python] pip install -r tests/python/requirements.txt"
"${PYTHON}" -m pip install --quiet -r tests/python/requirements.txt
echo "[test_python] environment ready in $((SECONDS - start)) s; pip install --no-build-isolation --no-deps ."
step=${SECONDS}
# The venv's bin first: its cmake and ninja, if pip brought any, and its python for CMake's FindPython.
PATH="$(cd "${VENV}/bin" && pwd):${PATH}" "${PYTHON}" -m pip install --quiet --no-build-isolation --no-deps \
  --config-settings=build-dir="${BUILD_DIR}/pip" .
echo "[test_python] package built and installed in $((SECONDS - step)) s ($((SECONDS - start)) s so far); pytest"

# pytest's exit code 5 (it collected no test) fails too: there are always CPU tests to run.
set +e
"${PYTHON}" -m pytest tests/python -rs -p no:cacheprovider
rc=$?
set -e
if [[ ${rc} == 5 ]]; then echo "[test_python] ERROR: pytest collected no tests" >&2; fi
exit "${rc}"
