// Division by a divisor that is fixed for a launch, as a multiply-high and a shift.
//
// The kernels map every step to its tile on single threads (the producer, the sender, the
// watcher). A 32-bit division there is about 25 dependent instructions, and the first step's sit
// between a CTA's start and its first load: with the divisors prepared on the host, each takes two.
//
// For 0 <= n < 2^31 and a divisor d >= 2, with L = ceil(log2 d) and p = 31 + L:
//   m = ceil(2^p / d) fits 32 bits (d > 2^(L-1)), and floor(n / d) = floor(n * m / 2^p),
// since n * m / 2^p = n / d + n * e / (d * 2^p) with e = m * d - 2^p < d, and n * e < 2^31 * 2^L
// = 2^p keeps the excess under 1 / d, the least distance from n / d up to the next integer.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tpfuse {

class FastDivision {
 public:
  FastDivision() = default;  // division by 1

  // On the host, once per launch. divisor >= 1.
  explicit FastDivision(int divisor) : divisor_(divisor) {
    if (divisor <= 1) return;
    int ceil_log2 = 0;
    while ((int64_t(1) << ceil_log2) < divisor) ++ceil_log2;
    const int p = 31 + ceil_log2;
    multiplier_ = uint32_t(((uint64_t(1) << p) + uint64_t(divisor) - 1) / uint64_t(divisor));
    shift_ = uint32_t(p - 32);
  }

  TPFUSE_HOST_DEVICE int divisor() const { return divisor_; }

  // floor(n / divisor) for 0 <= n < 2^31.
  TPFUSE_HOST_DEVICE int div(int n) const {
    return divisor_ == 1 ? n : int(mul_hi(uint32_t(n), multiplier_) >> shift_);
  }

 private:
  TPFUSE_HOST_DEVICE static uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return uint32_t((uint64_t(a) * b) >> 32);
#endif
  }

  int divisor_ = 1;
  uint32_t multiplier_ = 0;
  uint32_t shift_ = 0;
};

}  // namespace tpfuse
