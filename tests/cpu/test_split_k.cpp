// The split-K schedule (gemm/split_k.h): every K block of every tile is multiplied by exactly one
// step, the splits of a tile (of every tile, or of the tail's) are consecutive steps of balanced K
// slices over the same tile, and the workspace holds every step the config can ask for. And a model of the epilogue's count: whichever
// split counts in last, the counters are back at 0 after each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gemm/config.h"
#include "gemm/split_k.h"

namespace tpfuse {
namespace {

struct Case {
  int m, n, block_m, block_n, num_splits, num_k_blocks, whole_tiles;
  std::string name() const {
    return "m " + std::to_string(m) + " n " + std::to_string(n) + " tile " + std::to_string(block_m) + "x" +
           std::to_string(block_n) + " S " + std::to_string(num_splits) + " kb " + std::to_string(num_k_blocks) +
           " whole " + std::to_string(whole_tiles);
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int num_k_blocks : {1, 2, 3, 7, 12, 16, 56, 1000}) {
    for (int num_splits : {1, 2, 3, 4, 5, 8, 13}) {
      if (num_splits > num_k_blocks) continue;
      out.push_back({8, 8192, 64, 256, num_splits, num_k_blocks, 0});
      out.push_back({200, 1000, 128, 192, num_splits, num_k_blocks, 0});
      out.push_back({1, 264, 64, 256, num_splits, num_k_blocks, 0});
      // A split tail: 10 tiles (2 x 5), the first 6 or 9 whole.
      out.push_back({200, 1000, 128, 192, num_splits, num_k_blocks, 6});
      out.push_back({200, 1000, 128, 192, num_splits, num_k_blocks, 9});
    }
  }
  return out;
}

TEST(SplitKSchedule, EveryKBlockOfEveryTileOnce) {
  for (const Case& t : cases()) {
    const GemmSchedule tiles(t.m, t.n, t.block_m, t.block_n, 32);
    const SplitKSchedule schedule(tiles, SplitPlan{t.whole_tiles, t.num_splits}, t.num_k_blocks);
    const int whole = t.num_splits > 1 ? t.whole_tiles : 0;  // a plan of one split has no tail
    ASSERT_EQ(schedule.whole_tiles(), whole) << t.name();
    ASSERT_EQ(schedule.num_tiles(), whole + (tiles.num_tiles() - whole) * t.num_splits) << t.name();
    // times[tile][k block]: how many steps multiply it.
    std::vector<std::vector<int>> times(tiles.num_tiles(), std::vector<int>(t.num_k_blocks, 0));
    std::vector<int> split_slots;  // the workspace slots (split tile, split) the steps take, in order
    for (int step = 0; step < schedule.num_tiles(); ++step) {
      const KSlice k = schedule.k_slice(step);
      const std::string what = t.name() + ", step " + std::to_string(step);
      // The tile the step multiplies: itself before the tail, else the tail's tile of its splits.
      const int tile = step < whole ? step : whole + (step - whole) / t.num_splits;
      if (step < whole) {
        ASSERT_EQ(k.tile_index, step) << what;
        ASSERT_EQ(k.split, 0) << what;
        ASSERT_EQ(k.num_splits, 1) << what << ": a tile before the tail is whole";
        ASSERT_EQ(k.k_block_begin, 0) << what;
        ASSERT_EQ(k.num_k_blocks, t.num_k_blocks) << what;
      } else {
        ASSERT_EQ(k.tile_index, (step - whole) / t.num_splits) << what << ": a tile's splits are consecutive steps";
        ASSERT_EQ(k.split, (step - whole) % t.num_splits) << what;
        ASSERT_EQ(k.num_splits, t.num_splits) << what;
        ASSERT_GE(k.k_block_begin, 0) << what;
        ASSERT_LE(k.k_block_begin + k.num_k_blocks, t.num_k_blocks) << what;
        // Balanced: every split has floor(kb / S) or ceil(kb / S) K blocks, never none.
        EXPECT_GE(k.num_k_blocks, t.num_k_blocks / t.num_splits) << what;
        EXPECT_LE(k.num_k_blocks, (t.num_k_blocks + t.num_splits - 1) / t.num_splits) << what;
        EXPECT_GE(k.num_k_blocks, 1) << what;
        if (t.num_splits > 1) split_slots.push_back(k.tile_index * t.num_splits + k.split);
      }
      EXPECT_EQ(KSplits(t.num_splits, t.whole_tiles).last_split(step),
                step < whole || (step - whole) % t.num_splits == t.num_splits - 1)
          << what;
      // Every split of a tile has the tile itself.
      const Tile a = schedule.tile(step), b = tiles.tile(tile);
      EXPECT_TRUE(a.row_begin == b.row_begin && a.row_end == b.row_end && a.col_begin == b.col_begin &&
                  a.col_end == b.col_end)
          << what;
      for (int kb = k.k_block_begin; kb < k.k_block_begin + k.num_k_blocks; ++kb) ++times[tile][kb];
    }
    for (int tile = 0; tile < tiles.num_tiles(); ++tile) {
      for (int kb = 0; kb < t.num_k_blocks; ++kb) {
        ASSERT_EQ(times[tile][kb], 1) << t.name() << ": tile " << tile << ", K block " << kb;
      }
    }
    // The split steps take the workspace's first slots, each once: the tail's steps need no more
    // room than its own.
    for (size_t i = 0; i < split_slots.size(); ++i) ASSERT_EQ(split_slots[i], int(i)) << t.name();
  }
}

// Which tiles a call splits: all of them (as many splits as fit), or the tail past the last full
// wave of the CTAs, whose steps fit in one wave.
TEST(SplitKSchedule, SplitPlansFitTheirCtas) {
  // Every tile: the splits that fit.
  EXPECT_EQ(split_plan(40, 3, false, 132).splits, 3);
  EXPECT_EQ(split_plan(40, 3, false, 132).whole_tiles, 0);
  EXPECT_EQ(split_plan(40, 3, false, 100).splits, 2);
  // The tail: 320 tiles on 132 CTAs leave 56 past two full waves, in 2 splits (3 would be 168 steps).
  EXPECT_EQ(split_plan(320, 2, true, 132).whole_tiles, 264);
  EXPECT_EQ(split_plan(320, 2, true, 132).splits, 2);
  EXPECT_EQ(split_plan(320, 3, true, 132).splits, 2);
  // On 16 CTAs (emulated ranks): 320 = 20 full waves, no tail; 330 leaves 10 tiles, in one split.
  EXPECT_EQ(split_plan(320, 2, true, 16).splits, 1);
  EXPECT_EQ(split_plan(330, 2, true, 16).splits, 1);
  const SplitPlan emulated = split_plan(324, 4, true, 16);  // 4 tiles past 20 waves, 4 splits: 16 steps
  EXPECT_EQ(emulated.whole_tiles, 320);
  EXPECT_EQ(emulated.splits, 4);
  for (int64_t tiles = 1; tiles < 600; tiles += 7) {
    for (int ctas : {1, 16, 66, 132}) {
      for (int splits = 1; splits <= 8; ++splits) {
        const SplitPlan plan = split_plan(tiles, splits, true, ctas);
        ASSERT_GE(plan.splits, 1);
        ASSERT_LE(plan.splits, splits);
        if (plan.splits == 1) continue;
        EXPECT_EQ(plan.whole_tiles % ctas, 0) << tiles << " tiles on " << ctas;
        EXPECT_LE((tiles - plan.whole_tiles) * plan.splits, ctas) << tiles << " tiles on " << ctas;
      }
    }
  }
}

// Schedules that do not split K give every step all of it, split 0 of 1.
TEST(SplitKSchedule, UnsplitSchedulesTakeAllOfK) {
  const GemmSchedule tiles(1000, 776, 128, 256, 8);
  for (int step = 0; step < tiles.num_tiles(); ++step) {
    const KSlice k = k_slice_of(tiles, step, 17);
    EXPECT_EQ(k.tile_index, step);
    EXPECT_EQ(k.split, 0);
    EXPECT_EQ(k.num_splits, 1);
    EXPECT_EQ(k.k_block_begin, 0);
    EXPECT_EQ(k.num_k_blocks, 17);
  }
}

// Every step and tile slot a split config uses lies inside the workspace of the device's SMs.
TEST(SplitKSchedule, WorkspaceHoldsEveryStep) {
  const DeviceInfo device;
  const SplitKWorkspaceSize size = split_k_workspace_size(device.num_sms);
  int split = 0;
  for (int64_t m : {1, 8, 16, 24, 32, 64, 100, 128, 200, 256, 512, 8192}) {
    for (int64_t n : {8, 264, 1000, 6144, 8192}) {
      for (int64_t k : {64, 1000, 1024, 3584, 8192}) {
        Problem p;
        p.m = m;
        p.n = n;
        p.k_per_rank = k;
        GemmConfig c;
        ASSERT_TRUE(select_plain_gemm_config(p, device, {}, &c).ok()) << p.to_string();
        if (c.split_k == 1) continue;
        ++split;
        const GemmVariant& v = c.tile();
        const GemmSchedule tiles(int(m), int(n), v.block_m, v.block_n, c.group_rows);
        const SplitKSchedule schedule(tiles, SplitPlan{c.whole_tiles, c.split_k}, int((k + 63) / 64));
        const size_t split_steps = size_t(schedule.num_tiles() - schedule.whole_tiles());
        const size_t split_tiles = size_t(tiles.num_tiles() - schedule.whole_tiles());
        EXPECT_LE(split_steps * v.block_m * v.block_n * sizeof(float), size.partial_bytes) << p.to_string();
        EXPECT_LE(split_tiles * kConsumers * sizeof(uint32_t), size.counter_bytes) << p.to_string();
        EXPECT_EQ(size.counter_bytes % 16, 0u) << "the partials after the counters stay 16-byte aligned";
      }
    }
  }
  EXPECT_GT(split, 0);
}

// The epilogue's count (gemm/split_k_epilogue.cuh), modelled: each split adds 1 to its tile's
// counter and the one that sees S - 1 before its add is the last and sets it back to 0. In any
// order of the splits' arrival exactly one is last, and the counters end every call at 0, calls of
// different splits and tiles one after another on the same workspace.
TEST(SplitKSchedule, CountersEndEveryCallAtZero) {
  std::vector<uint32_t> counters(64, 0);
  std::mt19937 random(7);
  for (int num_splits : {2, 3, 5, 8, 2}) {
    for (int num_tiles : {1, 7, 32}) {
      std::vector<int> steps(num_tiles * num_splits);
      std::iota(steps.begin(), steps.end(), 0);
      std::shuffle(steps.begin(), steps.end(), random);
      std::vector<int> lasts(num_tiles, 0);
      for (int step : steps) {
        uint32_t& done = counters[step / num_splits];
        const bool last = done++ == uint32_t(num_splits - 1);
        if (last) {
          done = 0;
          ++lasts[step / num_splits];
        }
      }
      for (int tile = 0; tile < num_tiles; ++tile) EXPECT_EQ(lasts[tile], 1) << "tile " << tile;
      EXPECT_TRUE(std::all_of(counters.begin(), counters.end(), [](uint32_t c) { return c == 0; }));
    }
  }
}

}  // namespace
}  // namespace tpfuse
