// The call count's arithmetic (comm/epoch.h): whatever order a call's CTAs add their shares in, the
// epoch stays the call's until the last share and then moves on by exactly one, also across the
// count's wrap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "comm/epoch.h"

namespace tpfuse {
namespace {

// Adds every CTA's share to `calls` in `order`, checking the epoch after each; returns the count.
uint64_t finish_call(uint64_t calls, const std::vector<int>& order) {
  const uint32_t epoch = epoch_of(calls);
  for (size_t i = 0; i < order.size(); ++i) {
    calls += call_share(order[i], int(order.size()));
    if (i + 1 < order.size()) {
      EXPECT_EQ(epoch_of(calls), epoch) << "after " << i + 1 << " of " << order.size() << " shares";
    }
  }
  EXPECT_EQ(epoch_of(calls), epoch + 1u);
  EXPECT_EQ(calls & 0xffffffffu, 0u) << "the next call starts with the low word at 0";
  return calls;
}

TEST(Epoch, MovesOnByOneAfterTheLastShareInAnyOrder) {
  std::mt19937 rng(7);
  for (int ctas : {1, 2, 3, 16, 66, 132, 1024}) {
    std::vector<int> order(ctas);
    std::iota(order.begin(), order.end(), 0);
    uint64_t calls = 0;
    calls = finish_call(calls, order);  // CTA 0 first
    std::reverse(order.begin(), order.end());
    calls = finish_call(calls, order);  // CTA 0 last
    std::shuffle(order.begin(), order.end(), rng);
    calls = finish_call(calls, order);
    EXPECT_EQ(epoch_of(calls), 4u) << ctas << " CTAs: three calls completed";
  }
}

TEST(Epoch, WrapsModuloTwoToThe32) {
  std::vector<int> order(132);
  std::iota(order.begin(), order.end(), 0);
  uint64_t calls = uint64_t(0xfffffffeu) << 32;  // 2^32 - 2 calls completed
  EXPECT_EQ(epoch_of(calls), 0xffffffffu);
  calls = finish_call(calls, order);
  EXPECT_EQ(epoch_of(calls), 0u);
  calls = finish_call(calls, order);  // the 64-bit count wraps to 0
  EXPECT_EQ(calls, 0u);
  EXPECT_EQ(epoch_of(calls), 1u);
}

}  // namespace
}  // namespace tpfuse
