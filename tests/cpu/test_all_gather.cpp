// The all-gather + GEMM's schedule and config (ops/ag_gemm/): every tile of Y exactly once on every
// rank, the own band first, then r-1, r-2, ... (in one wave of one-row bands, down the bands for each
// column); tiles inside their band; configs over the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "gemm/variants.h"
#include "ops/ag_gemm/config.h"
#include "ops/ag_gemm/schedule.h"
#include "ops/ag_gemm/workspace.h"
#include "tpfuse/problem.h"

namespace tpfuse {
namespace {

AllGatherShape shape_of(int p, int rank, int m, int n, int block_m, int block_n, int splits = 1, int sources = 1) {
  AllGatherShape shape;
  shape.world_size = p;
  shape.rank = rank;
  shape.m = m;
  shape.n = n;
  shape.block_m = block_m;
  shape.block_n = block_n;
  shape.group_rows = 4;
  shape.num_splits = splits;
  shape.sources_per_band = sources;
  return shape;
}

TEST(AllGatherSchedule, EveryTileOnceOwnBandFirst) {
  // (P, m, n, block_m, block_n, G): bands of one block, of two (64-row blocks), of all.
  for (const auto& [p, m, n, block_m, block_n, g] : std::vector<std::tuple<int, int, int, int, int, int>>{
           {1, 256, 512, 128, 256, 1}, {2, 1000, 776, 128, 256, 1}, {4, 1024, 1280, 128, 192, 1},
           {8, 512, 1024, 64, 256, 1}, {8, 65536, 7168, 128, 256, 1}, {8, 8, 264, 64, 256, 1}, {3, 999, 8, 128, 256, 1},
           {8, 512, 7168, 128, 256, 2}, {4, 256, 1000, 128, 192, 2}, {8, 64, 264, 64, 256, 8}, {8, 256, 520, 128, 256, 8},
           {2, 48, 136, 64, 128, 2}}) {
    const int rows = m / p, band_rows = rows * g, bands = p / g;
    for (int rank = 0; rank < p; ++rank) {
      SCOPED_TRACE(::testing::Message() << "P=" << p << " m=" << m << " n=" << n << " G=" << g << " rank " << rank);
      const AllGatherSchedule s(shape_of(p, rank, m, n, block_m, block_n, 1, g));
      ASSERT_EQ(s.num_bands(), bands);
      std::set<std::tuple<int, int, int>> seen;
      int64_t area = 0;
      for (int step = 0; step < s.num_tiles(); ++step) {
        const Tile t = s.tile(step);
        const int offset = step / s.tiles_per_band();
        const int band = ((rank / g - offset) % bands + bands) % bands;
        ASSERT_EQ(t.owner_rank, band * g) << "step " << step << ": the own band first, then the ones before it";
        ASSERT_GE(t.row_begin, band * band_rows);
        ASSERT_LE(t.row_end, (band + 1) * band_rows) << "a tile stays in its band";
        ASSERT_EQ(t.row_begin, band * band_rows + t.segment_row);
        ASSERT_LT(t.row_begin, t.row_end);
        ASSERT_LT(t.col_begin, t.col_end);
        ASSERT_LE(t.col_end, n);
        ASSERT_TRUE(seen.insert({t.owner_rank, t.row_begin, t.col_begin}).second) << "step " << step << " twice";
        area += int64_t(t.row_end - t.row_begin) * (t.col_end - t.col_begin);
      }
      EXPECT_EQ(area, int64_t(m) * n) << "the tiles cover Y exactly";
    }
  }
}

TEST(AllGatherSchedule, OneWaveOfOneRowBandsGoesDownTheBands) {
  // (P, m, n, block_m, block_n, splits, G): llama qkv at M = 512 (64-row bands, split 3), bands of
  // two 64-row blocks, 128-row bands at P = 4, a ragged last column.
  for (const auto& [p, m, n, block_m, block_n, splits, g] : std::vector<std::tuple<int, int, int, int, int, int, int>>{
           {8, 512, 1280, 64, 256, 3, 1}, {8, 512, 7168, 128, 256, 1, 2}, {4, 512, 2560, 128, 192, 1, 1},
           {2, 100, 1000, 64, 256, 2, 1}}) {
    const int bands = p / g;
    for (int rank = 0; rank < p; ++rank) {
      SCOPED_TRACE(::testing::Message() << "P=" << p << " m=" << m << " n=" << n << " G=" << g << " rank " << rank);
      AllGatherShape shape = shape_of(p, rank, m, n, block_m, block_n, splits, g);
      const AllGatherSchedule banded(shape);
      shape.num_ctas = banded.num_tiles();
      const AllGatherSchedule s(shape);
      ASSERT_FALSE(banded.bands_interleaved()) << "CTAs unknown: the bands one after another";
      ASSERT_TRUE(s.bands_interleaved());
      ASSERT_EQ(s.num_tiles(), banded.num_tiles());
      std::set<std::tuple<int, int>> seen;
      for (int step = 0; step < s.num_tiles(); ++step) {
        const Tile t = s.tile(step);
        const int tile = step / splits, offset = tile % bands;
        const int band = ((rank / g - offset) % bands + bands) % bands;
        ASSERT_EQ(t.owner_rank, band * g) << "step " << step << ": down the bands, the own one first";
        ASSERT_EQ(t.col_begin, tile / bands * block_n) << "step " << step << ": a column's bands side by side";
        ASSERT_EQ(t.segment_row, 0);
        ASSERT_EQ(t.row_begin, band * (m / bands));
        ASSERT_EQ(t.row_end, (band + 1) * (m / bands));
        ASSERT_EQ(t.col_end, std::min(n, t.col_begin + block_n));
        if (step % splits == 0) {
          ASSERT_TRUE(seen.insert({t.owner_rank, t.col_begin}).second) << "step " << step << " twice";
        } else {
          const Tile first = s.tile(step - 1);
          ASSERT_EQ(std::tie(t.owner_rank, t.col_begin), std::tie(first.owner_rank, first.col_begin))
              << "a tile's splits side by side";
        }
      }
      EXPECT_EQ(int(seen.size()), s.num_tiles() / splits) << "every tile once";
      // A wave short of the steps, or bands of two rows of tiles, keep the bands one after another.
      shape.num_ctas = s.num_tiles() - 1;
      EXPECT_FALSE(AllGatherSchedule(shape).bands_interleaved());
      shape.num_ctas = INT32_MAX;
      shape.m = 2 * m;
      EXPECT_EQ(AllGatherSchedule(shape).bands_interleaved(), m / bands * 2 <= block_m);
    }
  }
}

TEST(AllGatherSchedule, SplitsOfATileAreConsecutiveAndCoverK) {
  const int p = 8, m = 512, n = 1280, block_m = 64, block_n = 256, splits = 3, num_k_blocks = 128;
  const AllGatherSchedule whole(shape_of(p, 5, m, n, block_m, block_n));
  const AllGatherSchedule split(shape_of(p, 5, m, n, block_m, block_n, splits));
  ASSERT_EQ(split.num_tiles(), whole.num_tiles() * splits);
  for (int step = 0; step < split.num_tiles(); ++step) {
    const Tile t = split.tile(step), w = whole.tile(step / splits);
    ASSERT_EQ(t.owner_rank, w.owner_rank);
    ASSERT_EQ(t.row_begin, w.row_begin);
    ASSERT_EQ(t.col_begin, w.col_begin);
    const KSlice k = split.k_slice(step, num_k_blocks);
    ASSERT_EQ(k.tile_index, step / splits);
    ASSERT_EQ(k.split, step % splits);
    ASSERT_EQ(k.num_splits, splits);
    // The splits of a tile tile its K blocks in order.
    const int begin = k.split == 0 ? 0 : split.k_slice(step - 1, num_k_blocks).k_block_begin +
                                             split.k_slice(step - 1, num_k_blocks).num_k_blocks;
    ASSERT_EQ(k.k_block_begin, begin) << "step " << step;
    ASSERT_GE(k.num_k_blocks, num_k_blocks / splits);
    if (k.split == splits - 1) ASSERT_EQ(k.k_block_begin + k.num_k_blocks, num_k_blocks);
  }
  const KSlice all = whole.k_slice(7, num_k_blocks);
  EXPECT_EQ(all.k_block_begin, 0);
  EXPECT_EQ(all.num_k_blocks, num_k_blocks);
  EXPECT_EQ(all.num_splits, 1);
  // Emulated ranks with fewer CTAs take fewer splits; never fewer than one.
  EXPECT_EQ(splits_that_fit(40, 3, 132), 3);
  EXPECT_EQ(splits_that_fit(40, 3, 100), 2);
  EXPECT_EQ(splits_that_fit(40, 3, 16), 1);
}

// A split tail: the tiles from whole_tiles on (the last band's last tiles) in splits side by side,
// every tile's K blocks once, the tiles in the order of the unsplit schedule.
TEST(AllGatherSchedule, ASplitTailKeepsTheOrderOfTheTiles) {
  const int p = 8, m = 8192, n = 1280, block_m = 128, block_n = 256, splits = 2, num_k_blocks = 128;
  const AllGatherSchedule whole(shape_of(p, 3, m, n, block_m, block_n));
  AllGatherShape tail_shape = shape_of(p, 3, m, n, block_m, block_n, splits);
  tail_shape.whole_tiles = 264;
  const AllGatherSchedule tail(tail_shape);
  ASSERT_EQ(whole.num_tiles(), 320);
  ASSERT_EQ(tail.whole_tiles(), 264);
  ASSERT_EQ(tail.num_tiles(), 264 + 56 * splits);
  std::vector<std::vector<int>> times(whole.num_tiles(), std::vector<int>(num_k_blocks, 0));
  for (int step = 0; step < tail.num_tiles(); ++step) {
    const int index = step < 264 ? step : 264 + (step - 264) / splits;
    const Tile t = tail.tile(step), w = whole.tile(index);
    ASSERT_EQ(std::tie(t.owner_rank, t.row_begin, t.col_begin), std::tie(w.owner_rank, w.row_begin, w.col_begin))
        << "step " << step;
    const KSlice k = tail.k_slice(step, num_k_blocks);
    ASSERT_EQ(k.num_splits, step < 264 ? 1 : splits) << "step " << step;
    for (int kb = k.k_block_begin; kb < k.k_block_begin + k.num_k_blocks; ++kb) ++times[index][kb];
  }
  for (const auto& tile : times) {
    for (int n_times : tile) ASSERT_EQ(n_times, 1);
  }
  // The split tiles are the last bands': rank 3's go 3, 2, 1, 0, 7, 6, 5, 4, 40 tiles each.
  EXPECT_EQ(tail.tile(264).owner_rank, 5);
  EXPECT_EQ(tail.tile(tail.num_tiles() - 1).owner_rank, 4);
}

TEST(AllGatherSchedule, PiecesCoverEveryRowBlockOnce) {
  // Blocks of the sweep (P = 8: 64 .. 4096 rows, K = 8192 and 6144), of decode size, and ragged ones,
  // for a full GPU's CTAs and an emulated rank's.
  for (const auto& [rows, k] : std::vector<std::pair<int64_t, int64_t>>{
           {64, 8192}, {256, 8192}, {1024, 6144}, {4096, 8192}, {1, 8192}, {8, 512}, {100, 24}, {130, 1000}, {3, 8}}) {
    for (int ctas : {132, 16, 1}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows x " << k << ", " << ctas << " CTAs");
      const CopyPlan plan =
          copy_plan(rows, k, DType::kBF16, ctas, /*steps=*/ctas, /*step_k_blocks=*/128, /*destinations=*/7);
      EXPECT_EQ(plan.first_copier, 0) << "no CTA without a step: all copy";
      EXPECT_EQ(plan.copiers, ctas);
      ASSERT_EQ(plan.row_blocks, copy_row_blocks(rows));
      ASSERT_GT(plan.pieces_per_block, 0);
      ASSERT_EQ(plan.piece_elems % 8, 0) << "pieces start 16-byte aligned (8 BF16)";
      EXPECT_LE(plan.piece_elems, std::max<int64_t>(std::min<int64_t>(rows, kCopyRows) * k, 8));
      EXPECT_GE(plan.piece_elems, std::min<int64_t>(kMinPieceBytes / 2, std::min<int64_t>(rows, kCopyRows) * k));
      // Walking the pieces in order tiles every row block with no gap or overlap; each piece lies
      // inside its row block, and every row block has pieces_per_block of them (empty ones included).
      int64_t next = 0;
      std::vector<int> pieces_of_block(plan.row_blocks, 0);
      for (int piece = 0; piece < plan.row_blocks * plan.pieces_per_block; ++piece) {
        const PieceRange r = piece_range(plan, rows, k, piece);
        ASSERT_EQ(r.block, piece / plan.pieces_per_block);
        ASSERT_EQ(r.begin, std::min(next, std::min<int64_t>((r.block + 1) * kCopyRows, rows) * k)) << "piece " << piece;
        ASSERT_GE(r.begin, int64_t(r.block) * kCopyRows * k);
        ASSERT_LE(r.end, std::min<int64_t>((r.block + 1) * kCopyRows, rows) * k);
        ASSERT_LE(r.end - r.begin, plan.piece_elems);
        ASSERT_GE(r.end, r.begin);
        next = r.end;
        ++pieces_of_block[r.block];
      }
      EXPECT_EQ(next, rows * k) << "the pieces cover the block";
      for (int n : pieces_of_block) EXPECT_EQ(n, plan.pieces_per_block);
      if (ctas == 132 && rows * k * 2 >= 2 * 132 * kMinPieceBytes) {
        // About a piece a CTA where the block is large enough for every CTA to copy.
        const int pieces = plan.row_blocks * plan.pieces_per_block;
        EXPECT_GE(pieces, ctas);
        EXPECT_LE(pieces, 2 * ctas);
      }
    }
  }
}

TEST(AllGatherCopy, CtasWithoutAStepCopyWhereTheyFinishInAStep) {
  // Llama-3-70B qkv at M = 2048, P = 8: 256 rows x 8192 a block, 112 tiles of 128 x 192 (128 K
  // blocks: 96 of a tile 256 wide) on 132 CTAs: 20 CTAs without a step store 4 MiB to 7 peers,
  // 1.4 MiB each, within the 3 MiB of a step.
  CopyPlan plan = copy_plan(256, 8192, DType::kBF16, 132, 112, 96, 7);
  EXPECT_EQ(plan.first_copier, 112);
  EXPECT_EQ(plan.copiers, 20);
  EXPECT_GE(plan.row_blocks * plan.pieces_per_block, plan.copiers) << "about a piece a copier";
  EXPECT_LE(plan.row_blocks * plan.pieces_per_block, 2 * plan.copiers);
  // Mixtral qkv at M = 512: 64 x 256 tiles split in 4 (24 K blocks a step, 0.75 MiB), 128 steps:
  // 4 idle CTAs would store 1.3 MiB each; every CTA copies.
  plan = copy_plan(64, 6144, DType::kBF16, 132, 128, 24, 7);
  EXPECT_EQ(plan.first_copier, 0);
  EXPECT_EQ(plan.copiers, 132);
  // Llama qkv at M = 512: split in 3 (42.7 K blocks a step), 120 steps: 12 idle CTAs, 0.58 MiB each.
  plan = copy_plan(64, 8192, DType::kBF16, 132, 120, 128.0 / 3, 7);
  EXPECT_EQ(plan.first_copier, 120);
  EXPECT_EQ(plan.copiers, 12);
  // Mixtral w1/w3 at M = 512: 128 x 256 tiles over bands of two blocks split in 2 (48 K blocks a
  // step, 1.5 MiB), 128 steps: the 4 idle CTAs store 1.3 MiB each.
  plan = copy_plan(64, 6144, DType::kBF16, 132, 128, 48, 7);
  EXPECT_EQ(plan.first_copier, 128);
  EXPECT_EQ(plan.copiers, 4);
  // Mixtral qkv at M = 2048: 128 x 256 tiles split in 2, 128 steps: 4 idle CTAs, 5.25 MiB each.
  plan = copy_plan(256, 6144, DType::kBF16, 132, 128, 48, 7);
  EXPECT_EQ(plan.first_copier, 0);
  EXPECT_EQ(plan.copiers, 132);
  // More steps than CTAs (several waves): every CTA.
  plan = copy_plan(4096, 8192, DType::kBF16, 132, 1280, 128, 7);
  EXPECT_EQ(plan.first_copier, 0);
  EXPECT_EQ(plan.copiers, 132);
  // The limit is the bytes a copier stores in a step: exactly at it, the idle CTAs copy; over, all.
  const int64_t rows = 64, k = 10 * kIdleCopierBytesPerKBlock / (2 * 64);
  plan = copy_plan(rows, k, DType::kBF16, 132, 131, 10, 1);
  EXPECT_EQ(plan.first_copier, 131);
  EXPECT_EQ(plan.copiers, 1);
  plan = copy_plan(rows, k, DType::kBF16, 132, 131, 10, 2);
  EXPECT_EQ(plan.copiers, 132);
  // overrides.idle_copiers: 1 whenever a CTA has no step, 0 never.
  plan = copy_plan(rows, k, DType::kBF16, 132, 131, 10, 2, /*idle_copiers=*/1);
  EXPECT_EQ(plan.first_copier, 131);
  EXPECT_EQ(plan.copiers, 1);
  plan = copy_plan(rows, k, DType::kBF16, 132, 132, 10, 2, /*idle_copiers=*/1);
  EXPECT_EQ(plan.copiers, 132) << "no CTA without a step";
  plan = copy_plan(256, 8192, DType::kBF16, 132, 112, 96, 7, /*idle_copiers=*/0);
  EXPECT_EQ(plan.first_copier, 0);
  EXPECT_EQ(plan.copiers, 132);
}

TEST(AllGatherCopy, WorkspaceHoldsEveryBlock) {
  CommunicatorOptions options;
  options.max_m = 8192;
  options.max_k = 8192;
  const WorkspaceSize size = all_gather_workspace(options, 8);
  EXPECT_EQ(size.data_bytes, size_t(8192) * 8192 * 2) << "every rank's block of X, BF16";
  EXPECT_EQ(size.flag_words, size_t(8) * 16) << "a flag per row block: 8 sources x 16 row blocks";
  EXPECT_EQ(size.count_words, size.flag_words) << "and a counter beside each";
}

TEST(AllGatherConfig, ChoicesAreCompiledVariants) {
  const DeviceInfo device;
  for (int p : {1, 2, 4, 8}) {
    for (int64_t m : {8, 512, 2048, 8192, 32768}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{10240, 8192}, {57344, 8192}, {8192, 6144}, {32768, 6144}}) {
        AllGatherProblem problem;
        problem.m = m * p;
        problem.n_per_rank = n / 8;
        problem.k = k;
        problem.world_size = p;
        AllGatherConfig c;
        ASSERT_TRUE(select_all_gather_config(problem, device, {}, &c).ok()) << problem.to_string();
        ASSERT_GE(c.gemm.variant, 0);
        ASSERT_LT(c.gemm.variant, kNumGemmVariants);
        EXPECT_TRUE(storing_ops_take(c.gemm.tile())) << problem.to_string() << " -> " << c.gemm.to_string();
        EXPECT_LE(c.gemm.smem_bytes, size_t(device.max_smem_per_block));
        const int64_t band_rows = problem.rows_per_rank() * c.sources_per_band;
        EXPECT_EQ(c.gemm.tile().block_m, band_rows <= 64 ? 64 : 128) << problem.to_string();
        const AllGatherSchedule schedule(all_gather_shape(problem, c, 0));
        EXPECT_LE(schedule.num_tiles() - schedule.whole_tiles(), c.gemm.split_k == 1 ? INT32_MAX : device.num_sms)
            << "split steps are one wave";
        // One band of all blocks under 64 rows, else bands of one (the sizes here have no 64-row blocks).
        const int64_t rows = problem.rows_per_rank();
        EXPECT_EQ(c.sources_per_band, p > 1 && rows < 64 ? p : 1) << problem.to_string();
      }
    }
  }
}

TEST(AllGatherConfig, SplitsKWhereTheTilesFillFewSms) {
  const DeviceInfo device;
  // Llama qkv at M = 512, P = 8, K = 8192: bands of one block would be 8 x 5 tiles of 64 x 256 in
  // splits; bands of two take 4 x 10 tiles of 128 x 128 in splits instead.
  AllGatherProblem qkv;
  qkv.m = 512;
  qkv.n_per_rank = 1280;
  qkv.k = 8192;
  qkv.world_size = 8;
  AllGatherConfig c;
  ASSERT_TRUE(select_all_gather_config(qkv, device, {}, &c).ok());
  EXPECT_GT(c.gemm.split_k, 1) << c.to_string();
  EXPECT_EQ(c.sources_per_band, 2) << c.to_string();
  EXPECT_EQ(c.gemm.tile().block_m * 1000 + c.gemm.tile().block_n, 128128) << c.to_string();
  // Mixtral qkv (N/P = 1024, K = 6144): bands of one, 64 x 128 tiles in splits (128 x 128 in bands
  // of two measured no faster).
  AllGatherProblem mixtral_qkv{512, 1024, 6144, 8};
  ASSERT_TRUE(select_all_gather_config(mixtral_qkv, device, {}, &c).ok());
  EXPECT_EQ(c.sources_per_band, 1) << c.to_string();
  EXPECT_EQ(c.gemm.tile().block_m * 1000 + c.gemm.tile().block_n, 64128) << c.to_string();
  AllGatherProblem gate_up = qkv;  // 4 bands of two x 28 tiles: nearly a wave already
  gate_up.n_per_rank = 7168;
  ASSERT_TRUE(select_all_gather_config(gate_up, device, {}, &c).ok());
  EXPECT_EQ(c.sources_per_band, 2) << "64-row blocks: 128-row tiles over two";
  EXPECT_EQ(c.gemm.tile().block_m, 128);
  EXPECT_EQ(c.gemm.split_k, 1) << c.to_string();
  // W1/w3: bands of one block would make one wave of 8 x 16 tiles of 64 x 256; bands of two make one
  // of 4 x 32 tiles of 128 x 128.
  AllGatherProblem w1_w3 = qkv;
  w1_w3.n_per_rank = 4096;
  w1_w3.k = 6144;
  ASSERT_TRUE(select_all_gather_config(w1_w3, device, {}, &c).ok());
  EXPECT_EQ(c.sources_per_band, 2) << c.to_string();
  EXPECT_EQ(c.gemm.tile().block_m * 1000 + c.gemm.tile().block_n, 128128) << c.to_string();
  EXPECT_EQ(c.gemm.split_k, 1) << c.to_string();
  ConfigOverrides one_block;
  one_block.shared_tiles = 0;
  ASSERT_TRUE(select_all_gather_config(w1_w3, device, one_block, &c).ok());
  EXPECT_EQ(c.sources_per_band, 1) << c.to_string();
  EXPECT_TRUE(AllGatherSchedule(all_gather_shape(w1_w3, c, 0)).bands_interleaved());
  ConfigOverrides forced;
  forced.split_k = 2;
  ASSERT_TRUE(select_all_gather_config(qkv, device, forced, &c).ok());
  EXPECT_EQ(c.gemm.split_k, 2);
  EXPECT_FALSE(select_all_gather_config(gate_up, device, forced, &c).ok()) << "224 steps are more than a wave";
  ConfigOverrides separate;
  separate.shared_tiles = 0;
  ASSERT_TRUE(select_all_gather_config(gate_up, device, separate, &c).ok());
  EXPECT_EQ(c.sources_per_band, 1);
  EXPECT_EQ(c.gemm.tile().block_m, 64);
  ConfigOverrides pairs;
  pairs.shared_tiles = 1;
  ASSERT_TRUE(select_all_gather_config(mixtral_qkv, device, pairs, &c).ok());
  EXPECT_EQ(c.sources_per_band, 2) << "forced";
}

// Where the tiles take more than a wave and the last leaves most SMs idle, the all-gather splits that
// wave's tiles as the plain GEMM does: llama qkv at M = 8192, P = 8, 8 bands x 40 tiles of 128 x 256,
// the 56 past two full waves in 2 splits. overrides.split_k = 1 never splits.
TEST(AllGatherConfig, SplitsTheTailAsThePlainGemm) {
  const DeviceInfo device;
  const AllGatherProblem qkv{8192, 1280, 8192, 8};
  AllGatherConfig c;
  ASSERT_TRUE(select_all_gather_config(qkv, device, {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_n, 256) << c.to_string();
  EXPECT_EQ(c.gemm.split_k, 2) << c.to_string();
  EXPECT_EQ(c.gemm.whole_tiles, 264) << c.to_string();
  EXPECT_EQ(AllGatherSchedule(all_gather_shape(qkv, c, 0)).num_tiles(), 264 + 2 * 56);
  ConfigOverrides never;
  never.split_k = 1;
  ASSERT_TRUE(select_all_gather_config(qkv, device, never, &c).ok());
  EXPECT_EQ(c.gemm.split_k, 1) << c.to_string();
  EXPECT_EQ(c.gemm.whole_tiles, 0) << c.to_string();
}

// Mixtral qkv at P = 8, M = 2048: 8 bands x 2 x 8 tiles of 128 x 128 whole, one wave, on the
// all-gather's 5-stage variant (128 x 256 tiles would take 2 splits of K).
TEST(AllGatherConfig, TakesOneWaveOf128x128WhereWiderTilesSplit) {
  const DeviceInfo device;
  const AllGatherProblem qkv{2048, 1024, 6144, 8};
  AllGatherConfig c;
  ASSERT_TRUE(select_all_gather_config(qkv, device, {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_m * 1000 + c.gemm.tile().block_n, 128128) << c.to_string();
  EXPECT_EQ(c.gemm.split_k, 1) << c.to_string();
  EXPECT_TRUE(storing_ops_take(c.gemm.tile())) << c.to_string();
  EXPECT_EQ(c.gemm.tile().stages, 5) << c.to_string();
  EXPECT_LE(c.gemm.smem_bytes, size_t(device.max_smem_per_block)) << c.to_string();
  EXPECT_EQ(AllGatherSchedule(all_gather_shape(qkv, c, 0)).num_tiles(), 128);
}

TEST(AllGatherConfig, InterleavesTheBandsOfOneWave) {
  const DeviceInfo device;
  AllGatherProblem qkv;  // llama qkv, P = 8: at M = 512 40 tiles of 64 x 256 in 3 splits, one wave
  qkv.m = 512;
  qkv.n_per_rank = 1280;
  qkv.k = 8192;
  qkv.world_size = 8;
  AllGatherConfig c;
  ASSERT_TRUE(select_all_gather_config(qkv, device, {}, &c).ok());
  EXPECT_TRUE(AllGatherSchedule(all_gather_shape(qkv, c, 3)).bands_interleaved()) << c.to_string();
  c.gemm.num_ctas = 16;  // eight ranks emulated on one GPU: several waves, the own band first
  c.gemm.split_k = 1;
  EXPECT_FALSE(AllGatherSchedule(all_gather_shape(qkv, c, 3)).bands_interleaved());
  qkv.m = 2048;  // two rows of tiles a band
  ASSERT_TRUE(select_all_gather_config(qkv, device, {}, &c).ok());
  EXPECT_FALSE(AllGatherSchedule(all_gather_shape(qkv, c, 3)).bands_interleaved()) << c.to_string();
}

TEST(AllGatherProblemTest, ValidationNamesItsFields) {
  AllGatherProblem p;
  p.m = 1024;
  p.n_per_rank = 1020;
  p.k = 512;
  p.world_size = 8;
  Status s = validate(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("problem.n_per_rank = 1020 is not a multiple of 8"), std::string::npos) << s.message();
  p.n_per_rank = 1024;
  p.k = 100;
  s = validate(p);
  EXPECT_NE(s.message().find("problem.k = 100 is not a multiple of 8"), std::string::npos) << s.message();
  p.k = 512;
  p.m = 1001;
  s = validate(p);
  EXPECT_NE(s.message().find("problem.m = 1001 is not divisible by world_size = 8"), std::string::npos) << s.message();
  p.m = 1024;
  EXPECT_TRUE(validate(p).ok());
}

}  // namespace
}  // namespace tpfuse
