// The benchmark's input rotation: how many sets, and which set each call of an interleaved loop takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "rotation.h"

namespace tpfuse::bench {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(BenchRotation, SetsCoverFourTimesL2WithinBudgetAndCap) {
  EXPECT_EQ(rotation_sets(10 * kMiB, 50 * kMiB, 1000 * kMiB), 16) << "at most 16";
  EXPECT_EQ(rotation_sets(40 * kMiB, 50 * kMiB, 1000 * kMiB), 5) << "ceil(200 / 40)";
  EXPECT_EQ(rotation_sets(40 * kMiB, 50 * kMiB, 100 * kMiB), 2) << "what the budget holds";
  EXPECT_EQ(rotation_sets(400 * kMiB, 50 * kMiB, 100 * kMiB), 1) << "at least one";
  EXPECT_EQ(rotation_sets(0, 50 * kMiB, 100 * kMiB), 1);
}

// Calls numbered as time_loop numbers them: iteration * launches + launch.
TEST(BenchRotation, InterleavedLaunchesEachTakeEverySet) {
  for (int num_sets = 3; num_sets <= 16; ++num_sets) {
    for (int launches = 1; launches <= 4; ++launches) {
      std::vector<std::vector<int>> taken(launches, std::vector<int>(num_sets, 0));
      const int iterations = 4 * num_sets * launches;
      int previous = -1;
      for (int call = 0; call < iterations * launches; ++call) {
        const int set = rotation_set(call, num_sets);
        ASSERT_GE(set, 0);
        ASSERT_LT(set, num_sets);
        EXPECT_NE(set, previous) << "call " << call << " of " << num_sets << " sets takes its predecessor's set";
        previous = set;
        ++taken[call % launches][set];
      }
      for (int k = 0; k < launches; ++k) {
        for (int s = 0; s < num_sets; ++s) {
          EXPECT_GT(taken[k][s], 0) << "launch " << k << " of " << launches << " never takes set " << s << " of "
                                    << num_sets;
        }
      }
    }
  }
}

TEST(BenchRotation, TwoLaunchesOnAnEvenNumberOfSetsNoLongerSplitThem) {
  // The old rotation (call % sets) gave launch 0 the even sets only.
  std::vector<int> launch0;
  for (int call = 0; call < 64; call += 2) launch0.push_back(rotation_set(call, 16));
  EXPECT_NE(std::count_if(launch0.begin(), launch0.end(), [](int s) { return s % 2 == 1; }), 0);
}

TEST(BenchRotation, FewSets) {
  EXPECT_EQ(rotation_set(5, 1), 0);
  EXPECT_EQ(rotation_set(0, 2), 0);
  EXPECT_EQ(rotation_set(1, 2), 1);
  EXPECT_EQ(rotation_set(2, 2), 0);
}

}  // namespace
}  // namespace tpfuse::bench
