// The all-gather + GEMM's own part of the kernel's shared memory (gemm/shared_storage.h composes it
// with the mainloop's): the copier thread's ring of staging buffers, through which its bulk copies
// move the pieces of X_r to the peers (ops/ag_gemm/epilogue.cuh). Pure C++.
#pragma once

#include <cstdint>

namespace tpfuse {

constexpr int kCopyStages = 4;
constexpr int kCopyStageBytes = 4096;

struct CopyStages {
  alignas(128) uint8_t buffer[kCopyStages][kCopyStageBytes];
  uint64_t full[kCopyStages];  // a stage's bulk load has landed
};

}  // namespace tpfuse
