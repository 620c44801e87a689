// The benchmark's interleaved loops: how many input sets, which set each call takes, the launches'
// order (a compared pair alternating), and a launch's time from its calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loop_order.h"
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

// --compare's pair trades places every other pass through the input sets; the other launches keep theirs.
TEST(BenchLoopOrder, TheComparedPairAlternatesByPass) {
  const AlternatePair pair{2, 3};
  const int pass = kAlternationPass;
  EXPECT_EQ(launch_order(4, 0, pair), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(launch_order(4, pass - 1, pair), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(launch_order(4, pass, pair), (std::vector<int>{0, 1, 3, 2}));
  EXPECT_EQ(launch_order(4, 2 * pass - 1, pair), (std::vector<int>{0, 1, 3, 2}));
  EXPECT_EQ(launch_order(4, 2 * pass, pair), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(launch_order(3, 3 * pass, AlternatePair{1, 2}), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(launch_order(3, pass, std::nullopt), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(launch_order(2, pass, AlternatePair{1, 2}), (std::vector<int>{0, 1})) << "a pair outside the loop";
  // Over whole pairs of passes each of the two runs second as often as first.
  int b_after_a = 0, a_after_b = 0;
  for (int iteration = 0; iteration < 12 * pass; ++iteration) {
    const std::vector<int> order = launch_order(4, iteration, pair);
    const auto a = std::find(order.begin(), order.end(), 2) - order.begin();
    const auto b = std::find(order.begin(), order.end(), 3) - order.begin();
    ++(b == a + 1 ? b_after_a : a_after_b);
  }
  EXPECT_EQ(b_after_a, 6 * pass);
  EXPECT_EQ(a_after_b, 6 * pass);
}

// Calls numbered as time_loop numbers them, in the order they run, over the default loop (20 warm-up
// iterations, 200 timed): with the pair alternating, consecutive calls still take different sets, and
// every launch takes every set in each place it runs in.
TEST(BenchLoopOrder, AlternatingLaunchesTakeEverySetInEachPlace) {
  for (int launches = 2; launches <= 4; ++launches) {
    const AlternatePair pair{launches - 2, launches - 1};
    for (int num_sets = 3; num_sets <= kMaxRotationSets; ++num_sets) {
      // taken[launch][in its own place or its partner's][set]
      std::vector<std::vector<std::vector<int>>> taken(
          launches, std::vector<std::vector<int>>(2, std::vector<int>(num_sets, 0)));
      int previous = -1;
      for (int iteration = 0; iteration < 220; ++iteration) {
        const std::vector<int> order = launch_order(launches, iteration, pair);
        for (int place = 0; place < launches; ++place) {
          const int set = rotation_set(iteration * launches + place, num_sets);
          EXPECT_NE(set, previous) << launches << " launches, " << num_sets << " sets, iteration " << iteration;
          previous = set;
          if (iteration >= 20) ++taken[order[place]][order[place] == place ? 0 : 1][set];
        }
      }
      for (int k = 0; k < launches; ++k) {
        const bool in_pair = k == pair.first || k == pair.second;
        for (int place = 0; place < (in_pair ? 2 : 1); ++place) {
          for (int s = 0; s < num_sets; ++s) {
            EXPECT_GT(taken[k][place][s], 0) << launches << " launches, launch " << k << ", place " << place
                                             << ", set " << s << " of " << num_sets;
          }
        }
      }
    }
  }
}

TEST(BenchLoopOrder, APairsTimeWeighsBothPlaces) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 2.0, 3.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  // Second place 4% faster (what L2 left by the first gives it): both launches of the pair get the same
  // time however the places' times are spread.
  const std::vector<double> first = {1.00, 1.01, 0.99}, second = {0.96, 0.97, 0.95};
  EXPECT_DOUBLE_EQ(placed_median(first, second), std::sqrt(1.00 * 0.96));
  EXPECT_DOUBLE_EQ(placed_median(second, first), placed_median(first, second));
  EXPECT_DOUBLE_EQ(placed_median(first, {}), 1.00) << "a launch outside the pair";
  EXPECT_DOUBLE_EQ(placed_median({}, second), 0.96);
}

}  // namespace
}  // namespace tpfuse::bench
