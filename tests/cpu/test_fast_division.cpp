// FastDivision: the multiply-and-shift division the schedule uses on the GPU gives floor(n / d)
// for every divisor the schedule can meet and every n in [0, 2^31).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_division.h"

namespace tpfuse {
namespace {

// n around the places where a multiply-high could round wrong: multiples of d and their
// neighbours, powers of two, and the top of the range.
std::vector<int> hard_numerators(int d) {
  const int64_t d64 = d, top_multiple = (int64_t(INT32_MAX) / d64) * d64;
  std::vector<int64_t> candidates = {0,           1,       2,           3,
                                     d64 - 1,     d64,     d64 + 1,     2 * d64 - 1,
                                     2 * d64,     INT32_MAX, INT32_MAX - 1, INT32_MAX - d64,
                                     top_multiple - 1, top_multiple, top_multiple + 1};
  for (int shift = 0; shift < 31; ++shift) {
    const int64_t p = int64_t(1) << shift;
    candidates.insert(candidates.end(), {p - 1, p, p + 1});
  }
  std::vector<int> n;
  for (int64_t x : candidates) {
    if (x >= 0 && x <= INT32_MAX) n.push_back(int(x));
  }
  return n;
}

void expect_exact(const FastDivision& f, int n) {
  const int d = f.divisor();
  ASSERT_EQ(f.div(n), n / d) << "n = " << n << ", d = " << d;
}

TEST(FastDivision, ExactForSmallDivisorsAndHardNumerators) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, INT32_MAX);
  for (int d = 1; d <= 5000; ++d) {
    const FastDivision f(d);
    ASSERT_EQ(f.divisor(), d);
    for (int n : hard_numerators(d)) expect_exact(f, n);
    for (int i = 0; i < 64; ++i) expect_exact(f, any(rng));
  }
}

TEST(FastDivision, ExactForLargeDivisors) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> any(0, INT32_MAX);
  std::vector<int> divisors = {INT32_MAX, INT32_MAX - 1, 1 << 30, (1 << 30) + 1, (1 << 30) - 1, 65535, 65536, 65537};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + any(rng));
  for (int d : divisors) {
    const FastDivision f(d);
    for (int n : hard_numerators(d)) expect_exact(f, n);
    for (int i = 0; i < 256; ++i) expect_exact(f, any(rng));
  }
}

TEST(FastDivision, EveryNumeratorBelowAMillionForTheScheduleDivisors) {
  // Band counts, peer band counts, group row counts and group sizes of the sweep's configs.
  for (int d : {1, 2, 3, 4, 7, 8, 16, 24, 32, 96, 128, 256, 768, 1024}) {
    const FastDivision f(d);
    for (int n = 0; n < 1000000; ++n) {
      if (f.div(n) != n / d) FAIL() << "n = " << n << ", d = " << d;
    }
  }
}

TEST(FastDivision, DefaultDividesByOne) {
  const FastDivision f;
  EXPECT_EQ(f.divisor(), 1);
  EXPECT_EQ(f.div(12345), 12345);
}

}  // namespace
}  // namespace tpfuse
