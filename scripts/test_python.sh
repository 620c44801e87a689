#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh runs this last; CI with it): the package is built once,
# as a wheel, the way `pip install .` builds it (an isolated build environment: scikit-build-core,
# CMake, Ninja and nvidia-cutlass from PyPI; no torch, no NCCL), then installed into two virtual
# environments, one with the newest torch the package is tested with (tests/python/requirements.txt)
# and one with the oldest it supports (tests/python/requirements-floor.txt, pyproject.toml's floor),
# and pytest runs tests/python in each. Without a Hopper GPU the GPU tests report "skipped" with
# their reason; the CPU tests need none. The output ends with the second pass's pytest summary.
#
#   bash scripts/test_python.sh
#
# Environment: TPFUSE_BUILD_DIR (default build): the environments are $TPFUSE_BUILD_DIR/python-venv
# and $TPFUSE_BUILD_DIR/python-venv-floor, the wheel's CMake build $TPFUSE_BUILD_DIR/pip (kept, so a
# rerun is incremental); TPFUSE_PYTHON, the Python to make them with (default python3);
# TPFUSE_PYTHON_PASSES, the passes to run (default "latest floor"); TPFUSE_PYTHON_DROP_VENVS=1 removes
# each environment after its pass (CI's, whose clone is thrown away: the disk holds one torch at a time).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly BUILD_DIR="${TPFUSE_BUILD_DIR:-build}"
readonly WHEEL_DIR="${BUILD_DIR}/python-wheel"
readonly PASSES="${TPFUSE_PYTHON_PASSES:-latest floor}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
start=${SECONDS}

echo "[test_python] building the wheel (pip wheel ., isolated, as pip install . does)"
rm -rf "${WHEEL_DIR}"
"${TPFUSE_PYTHON:-python3}" -m pip wheel --quiet --no-deps --wheel-dir "${WHEEL_DIR}" \
  --config-settings=build-dir="${BUILD_DIR}/pip" .
wheel="$(ls "${WHEEL_DIR}"/tpfuse-*.whl)"
echo "[test_python] built $(basename "${wheel}") in $((SECONDS - start)) s"

# pip from PyPI, a few tries: a registry that drops a connection or times out fails one try, not CI.
# No cache: the two torch environments take several GB each, and a cached copy would double that.
pip_install() {
  local venv="$1"; shift
  local try
  for try in 1 2 3; do
    if "${venv}/bin/python" -m pip install --quiet --no-cache-dir "$@"; then return 0; fi
    echo "[test_python] pip install $* failed (try ${try} of 3); free space: $(df -h --output=avail "${venv}" | tail -n1)" >&2
    if [[ ${try} != 3 ]]; then sleep $((30 * try)); fi
  done
  return 1
}

rc=0
for pass in ${PASSES}; do
  case "${pass}" in
    latest) venv="${BUILD_DIR}/python-venv" requirements=tests/python/requirements.txt ;;
    floor) venv="${BUILD_DIR}/python-venv-floor" requirements=tests/python/requirements-floor.txt ;;
    *) echo "[test_python] unknown pass ${pass} (latest, floor)" >&2; exit 2 ;;
  esac
  step=${SECONDS}
  if [[ ! -x "${venv}/bin/python" ]]; then
    "${TPFUSE_PYTHON:-python3}" -m venv "${venv}"
  fi
  echo "[test_python] ${pass}: pip install -r ${requirements}, then the wheel"
  pip_install "${venv}" -r "${requirements}"
  pip_install "${venv}" --no-deps --force-reinstall "${wheel}"
  echo "[test_python] ${pass}: torch $("${venv}/bin/python" -c 'import torch; print(torch.__version__)'), ready in" \
       "$((SECONDS - step)) s ($((SECONDS - start)) s so far); pytest"
  # pytest's exit code 5 (it collected no test) fails too: there are always CPU tests to run.
  set +e
  "${venv}/bin/python" -m pytest tests/python -rs -p no:cacheprovider
  pass_rc=$?
  set -e
  if [[ ${pass_rc} == 5 ]]; then echo "[test_python] ERROR: pytest collected no tests" >&2; fi
  if [[ ${pass_rc} != 0 && ${rc} == 0 ]]; then rc=${pass_rc}; fi
  if [[ "${TPFUSE_PYTHON_DROP_VENVS:-0}" == 1 ]]; then rm -rf "${venv}"; fi
done
exit "${rc}"
