#!/usr/bin/env bash
# Recompiles kernel translation units with ptxas's report (-Xptxas -v) and fails when ptxas has
# serialized a WGMMA pipeline (advisories C7510-C7520 and any other "wgmma.mma_async instructions are
# serialized due to ..."). Results stay right, only every mainloop gets slower (15-20% when it
# happened to the fused kernel), so no GPU test would notice; here the build tells. Needs the Ninja
# build tree.
#
#   check_ptxas_advisories.sh BUILD_DIR OBJECT...     (OBJECT: as ninja names it, e.g.
#                                                      src/CMakeFiles/tpfuse.dir/runtime/fused.cu.o)
set -uo pipefail

build=$1
shift
status=0
scratch=$(mktemp -d)
trap 'rm -rf "${scratch}"' EXIT

for object in "$@"; do
  command=$(ninja -C "${build}" -t commands "${object}" | tail -n 1)
  if [[ "${command}" != *"-o ${object}"* ]]; then
    echo "${object}: no compile command for it in ${build}"
    status=1
    continue
  fi
  # The same compile, into a scratch object (and dependency file), with ptxas's report.
  command=${command/-o ${object}/-o ${scratch}/object.o}
  command=${command/-MF ${object}.d/-MF ${scratch}/object.d}
  if ! report=$(cd "${build}" && eval "${command} -Xptxas -v" 2>&1); then
    echo "${object}: the compile failed:"
    echo "${report}" | tail -n 20
    status=1
    continue
  fi
  kernels=$(grep -c "Compiling entry function" <<<"${report}")
  advisories=$(grep -E "\(C75[0-9][0-9]\)|wgmma.mma_async instructions are serialized" <<<"${report}")
  if [[ "${kernels}" -eq 0 ]]; then
    # No report to read (e.g. ptxas printed nothing): passing would check nothing.
    echo "${object}: ptxas reported no kernels"
    status=1
  elif [[ -n "${advisories}" ]]; then
    echo "${object}: ptxas serialized WGMMAs:"
    echo "${advisories}" | sed 's/^/  /'
    status=1
  else
    echo "${object}: ${kernels} kernels, no WGMMA serialized"
  fi
done
exit ${status}
