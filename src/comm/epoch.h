// A rank's call count and the epochs of its calls: the arithmetic the fused kernel runs and the
// CPU tests check.
//
// The count is 64 bits; its high word is the number of calls the rank has completed, so a call's
// epoch is that number plus one (modulo 2^32, as the flags compare). At the end of a call each of
// its CTAs adds its share without waiting for the others: CTA 0 adds 2^32 - (CTAs - 1), every other
// CTA 1. The shares sum to exactly 2^32 and a call starts with the low word at 0, so no carry
// reaches the high word before the last share is in: a CTA that reads the epoch late in a call
// still reads that call's, and the next call (stream-ordered after it) reads the next.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tpfuse {

TPFUSE_HOST_DEVICE uint64_t call_share(int cta, int num_ctas) {
  return cta == 0 ? (uint64_t(1) << 32) - uint64_t(num_ctas - 1) : uint64_t(1);
}

TPFUSE_HOST_DEVICE uint32_t epoch_of(uint64_t calls) { return uint32_t(calls >> 32) + 1; }

}  // namespace tpfuse
