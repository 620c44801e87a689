// The all-gather + GEMM's own part of the kernel's shared memory (gemm/shared_storage.h composes it
// with the mainloop's): the copier thread's ring of staging buffers, through which its bulk copies
// move the pieces of X_r to the peers (ops/ag_gemm/epilogue.cuh), and the layout of the deeper ring
// a copier without tiles lays over the mainloop's stages. Pure C++.
#pragma once

#include <cstdint>

#include "gemm/variants.h"

namespace tpfuse {

constexpr int kCopyStages = 4;
constexpr int kCopyStageBytes = 4096;

struct CopyStages {
  alignas(128) uint8_t buffer[kCopyStages][kCopyStageBytes];
  uint64_t full[kCopyStages];  // a stage's bulk load has landed

  static constexpr bool takes(const GemmVariant& v) { return storing_ops_take(v); }
};

// The deeper ring of a copier CTA without a tile, laid over the mainloop's stages (which it does
// not use): 128 KB, loads 8 stages ahead.
constexpr int kIdleCopyStages = 16;
constexpr int kIdleCopyStageBytes = 8192;
constexpr int kIdleCopyAhead = 8;

struct IdleCopyStages {
  alignas(128) uint8_t buffer[kIdleCopyStages][kIdleCopyStageBytes];
  uint64_t full[kIdleCopyStages];
};

}  // namespace tpfuse
