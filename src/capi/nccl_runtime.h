// Which NCCL library the C ABI runs against. With TPFUSE_NCCL_DEVICE_API=OFF, NCCL's host functions
// are resolved at run time (nccl_runtime.cpp) from the library nccl_open names; with it ON, NCCL is
// linked and nccl_open has nothing to do.
#pragma once

#include <nccl.h>

#include "tpfuse/status.h"

namespace tpfuse {

// Resolves NCCL's host functions from `path` (null: the libnccl.so.2 already loaded), once per
// process; kUnsupported if it is missing one of them or older than TPFUSE_NCCL_MIN_VERSION_CODE.
Status nccl_open(const char* path);

}  // namespace tpfuse
