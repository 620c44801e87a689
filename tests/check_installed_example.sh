#!/usr/bin/env bash
# Installs the built library into a scratch prefix with `cmake --install`, then configures, builds
# and runs examples/gemm against it with find_package(tpfuse), as a project outside this tree would.
# Without a GPU the example says so and exits 0; a missing header, target or symbol fails the build.
#
#   check_installed_example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
scratch=$(mktemp -d)
trap 'rm -rf "${scratch}"' EXIT

cmake --install "${build}" --prefix "${scratch}/prefix" >/dev/null
for path in include/tpfuse/gemm.h include/tpfuse/reduce_scatter.h lib/libtpfuse.so lib/libtpfuse_static.a \
            lib/cmake/tpfuse/tpfuseConfig.cmake; do
  [[ -e "${scratch}/prefix/${path}" ]] || { echo "not installed: ${path}"; exit 1; }
done
# The GEMM's header alone compiles without NCCL's headers on the include path.
if grep -q '#include <nccl.h>' "${scratch}/prefix/include/tpfuse/gemm.h"; then
  echo "tpfuse/gemm.h includes nccl.h"
  exit 1
fi
cmake -S "${source}/examples/gemm" -B "${scratch}/example" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="${scratch}/prefix" >/dev/null
cmake --build "${scratch}/example" >/dev/null
"${scratch}/example/example_gemm"
echo "examples/gemm built against the installed package and ran"
