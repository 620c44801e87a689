// The split-K schedule (gemm/split_k.h): every K block of every tile is multiplied by exactly one
// step, the splits of a tile are consecutive steps of balanced K slices over the same tile, and the
// workspace holds every step the config can ask for. And a model of the epilogue's count: whichever
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
  int m, n, block_m, block_n, num_splits, num_k_blocks;
  std::string name() const {
    return "m " + std::to_string(m) + " n " + std::to_string(n) + " tile " + std::to_string(block_m) + "x" +
           std::to_string(block_n) + " S " + std::to_string(num_splits) + " kb " + std::to_string(num_k_blocks);
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int num_k_blocks : {1, 2, 3, 7, 12, 16, 56, 1000}) {
    for (int num_splits : {1, 2, 3, 4, 5, 8, 13}) {
      if (num_splits > num_k_blocks) continue;
      out.push_back({8, 8192, 64, 256, num_splits, num_k_blocks});
      out.push_back({200, 1000, 128, 192, num_splits, num_k_blocks});
      out.push_back({1, 264, 64, 256, num_splits, num_k_blocks});
    }
  }
  return out;
}

TEST(SplitKSchedule, EveryKBlockOfEveryTileOnce) {
  for (const Case& t : cases()) {
    const GemmSchedule tiles(t.m, t.n, t.block_m, t.block_n, 32);
    const SplitKSchedule schedule(tiles, t.num_splits, t.num_k_blocks);
    ASSERT_EQ(schedule.num_tiles(), tiles.num_tiles() * t.num_splits) << t.name();
    // times[tile][k block]: how many steps multiply it.
    std::vector<std::vector<int>> times(tiles.num_tiles(), std::vector<int>(t.num_k_blocks, 0));
    for (int step = 0; step < schedule.num_tiles(); ++step) {
      const KSlice k = schedule.k_slice(step);
      const std::string what = t.name() + ", step " + std::to_string(step);
      ASSERT_EQ(k.tile_index, step / t.num_splits) << what << ": a tile's splits are consecutive steps";
      ASSERT_EQ(k.split, step % t.num_splits) << what;
      ASSERT_EQ(k.num_splits, t.num_splits) << what;
      ASSERT_GE(k.k_block_begin, 0) << what;
      ASSERT_LE(k.k_block_begin + k.num_k_blocks, t.num_k_blocks) << what;
      // Balanced: every split has floor(kb / S) or ceil(kb / S) K blocks, never none.
      EXPECT_GE(k.num_k_blocks, t.num_k_blocks / t.num_splits) << what;
      EXPECT_LE(k.num_k_blocks, (t.num_k_blocks + t.num_splits - 1) / t.num_splits) << what;
      EXPECT_GE(k.num_k_blocks, 1) << what;
      // Every split of a tile has the tile itself.
      const Tile a = schedule.tile(step), b = tiles.tile(k.tile_index);
      EXPECT_TRUE(a.row_begin == b.row_begin && a.row_end == b.row_end && a.col_begin == b.col_begin &&
                  a.col_end == b.col_end)
          << what;
      for (int kb = k.k_block_begin; kb < k.k_block_begin + k.num_k_blocks; ++kb) ++times[k.tile_index][kb];
    }
    for (int tile = 0; tile < tiles.num_tiles(); ++tile) {
      for (int kb = 0; kb < t.num_k_blocks; ++kb) {
        ASSERT_EQ(times[tile][kb], 1) << t.name() << ": tile " << tile << ", K block " << kb;
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
  for (int64_t m : {1, 8, 16, 24, 32, 64, 100, 128, 200, 256, 512}) {
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
        const SplitKSchedule schedule(tiles, c.split_k, int((k + 63) / 64));
        const size_t last_step = size_t(schedule.num_tiles()) - 1;
        EXPECT_LE((last_step + 1) * v.block_m * v.block_n * sizeof(float), size.partial_bytes) << p.to_string();
        EXPECT_LE(size_t(tiles.num_tiles()) * kConsumers * sizeof(uint32_t), size.counter_bytes) << p.to_string();
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
