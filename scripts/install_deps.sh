#!/usr/bin/env bash
# Installs and checks what tpfuse's build needs. Idempotent: a second run only checks.
#
#   CuTe/CUTLASS 4.2 headers  -> third_party/cutlass/include, third_party/cutlass/tools/util/include
#                                (from PyPI nvidia-cutlass==4.2.0.0; skipped when the stamp matches)
#   GoogleTest                -> the system one (Debian libgtest-dev), apt-get installed if missing
#   cmake, ninja              -> apt-get installed if missing
#   nvcc, NCCL                -> checked and reported (they come with the CUDA toolkit)
#
# Environment: TPFUSE_CUDA=OFF skips the CUDA parts (nvcc, NCCL, CUTLASS) for a CPU-only build.
set -euo pipefail

readonly CUTLASS_VERSION="4.2.0.0"
readonly REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly CUTLASS_DIR="${REPO_ROOT}/third_party/cutlass"
readonly CUTLASS_STAMP="${CUTLASS_DIR}/.installed-nvidia-cutlass"
readonly WANT_CUDA="${TPFUSE_CUDA:-ON}"

log() { echo "[install_deps] $*"; }
die() { echo "[install_deps] ERROR: $*" >&2; exit 1; }

apt_updated=0
apt_install() {
  if [[ "$(id -u)" != 0 ]]; then
    die "missing $*; install it (apt-get install -y $*) or run this script as root"
  fi
  command -v apt-get >/dev/null || die "missing $* and apt-get is not available; install it by hand"
  if [[ "${apt_updated}" == 0 ]]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---- Build tools ----
command -v cmake >/dev/null || apt_install cmake
command -v ninja >/dev/null || apt_install ninja-build
log "cmake: $(cmake --version | head -n1)"
log "ninja: $(ninja --version)"

# ---- GoogleTest ----
if [[ -f /usr/src/googletest/CMakeLists.txt || -n "$(ls /usr/lib/*/cmake/GTest/GTestConfig.cmake 2>/dev/null)" ]]; then
  log "GoogleTest: system package ($(dpkg-query -W -f='${Version}' libgtest-dev 2>/dev/null || echo 'version unknown'))"
else
  apt_install libgtest-dev
  log "GoogleTest: installed libgtest-dev"
fi

if [[ "${WANT_CUDA}" == "OFF" ]]; then
  log "TPFUSE_CUDA=OFF: skipping nvcc, NCCL and CUTLASS"
  exit 0
fi

# ---- CUDA toolkit ----
NVCC="$(command -v nvcc || true)"
if [[ -z "${NVCC}" ]]; then
  for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n "${candidate}" && -x "${candidate}/bin/nvcc" ]]; then NVCC="${candidate}/bin/nvcc"; break; fi
  done
fi
[[ -n "${NVCC}" ]] || die "nvcc not found (not on PATH, nor in \$CUDA_HOME or /usr/local/cuda). Install the CUDA toolkit (12.8 or later), or build without CUDA: TPFUSE_CUDA=OFF"
CUDA_ROOT="$(cd "$(dirname "${NVCC}")/.." && pwd)"
log "nvcc: ${NVCC} ($("${NVCC}" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"

NCCL_HEADER=""
for dir in "${CUDA_ROOT}/include" /usr/include /usr/local/include; do
  if [[ -f "${dir}/nccl.h" ]]; then NCCL_HEADER="${dir}/nccl.h"; break; fi
done
[[ -n "${NCCL_HEADER}" ]] || die "nccl.h not found in ${CUDA_ROOT}/include, /usr/include or /usr/local/include (NCCL 2.28 or later is needed; install libnccl-dev)"
nccl_code="$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "${NCCL_HEADER}")"
nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "${NCCL_HEADER}" | paste -sd.)"
log "NCCL: ${NCCL_HEADER}: ${nccl_version} (NCCL_VERSION_CODE ${nccl_code})"
if [[ -n "${nccl_code}" && "${nccl_code}" -lt 22800 ]]; then
  die "NCCL ${nccl_version} is too old: tpfuse needs 2.28 or later (the device API header nccl_device.h)"
fi

# ---- CuTe / CUTLASS headers ----
if [[ -f "${CUTLASS_STAMP}" && "$(cat "${CUTLASS_STAMP}")" == "nvidia-cutlass==${CUTLASS_VERSION}" &&
      -f "${CUTLASS_DIR}/include/cute/tensor.hpp" ]]; then
  log "CUTLASS: nvidia-cutlass==${CUTLASS_VERSION} already in ${CUTLASS_DIR}"
  exit 0
fi

log "CUTLASS: installing nvidia-cutlass==${CUTLASS_VERSION} headers into ${CUTLASS_DIR}"
command -v python3 >/dev/null || apt_install python3
python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
# --target bypasses any environment: the wheel is only unpacked, nothing is installed into python3.
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
  python3 -m pip install --quiet --no-deps --no-compile --target "${tmp}/wheel" "nvidia-cutlass==${CUTLASS_VERSION}" ||
  die "pip could not fetch nvidia-cutlass==${CUTLASS_VERSION} from PyPI"
source_dir="${tmp}/wheel/cutlass_library/source"
[[ -f "${source_dir}/include/cute/tensor.hpp" ]] ||
  die "the nvidia-cutlass wheel has no cutlass_library/source/include/cute/tensor.hpp; its layout changed"

# Assemble next to the destination, then swap it in, so an interrupted run leaves no half install.
staging="${REPO_ROOT}/third_party/.cutlass.staging"
rm -rf "${staging}"
mkdir -p "${staging}/tools/util"
cp -r "${source_dir}/include" "${staging}/include"
cp -r "${source_dir}/tools/util/include" "${staging}/tools/util/include"
license="$(ls "${tmp}"/wheel/nvidia_cutlass-*.dist-info/licenses/LICENSE* 2>/dev/null | head -n1 || true)"
if [[ -n "${license}" ]]; then cp "${license}" "${staging}/LICENSE.txt"; fi
echo "nvidia-cutlass==${CUTLASS_VERSION}" > "${staging}/.installed-nvidia-cutlass"
rm -rf "${CUTLASS_DIR}"
mv "${staging}" "${CUTLASS_DIR}"

cutlass_version="$(sed -n 's/^#define CUTLASS_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
                     "${CUTLASS_DIR}/include/cutlass/version.h" | paste -sd.)"
log "CUTLASS: headers ${cutlass_version} installed in ${CUTLASS_DIR}"
