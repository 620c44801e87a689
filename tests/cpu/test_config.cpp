// The config choices (gemm/config.h, ops/gemm_rs/config.h): every choice is a compiled variant that
// fits the device (shared memory, registers, WGMMA shapes), whatever its shared memory; overrides
// apply and are checked; unsupported devices get an error, not a config.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gemm/config.h"
#include "gemm/shared_storage.h"
#include "ops/ag_gemm/config.h"
#include "ops/gemm_rs/config.h"
#include "ops/gemm_rs/partial_rounds.h"
#include "ops/gemm_rs/schedule.h"
#include "ops/gemm_rs/shared_storage.h"
#include "ops/gemm_rs/workspace.h"
#include "tpfuse/problem.h"

namespace tpfuse {
namespace {

Problem make(int64_t m, int64_t n, int64_t k_total, int world_size, WeightLayout layout = WeightLayout::kKxN) {
  Problem p;
  p.m = m;
  p.n = n;
  p.k_per_rank = k_total / world_size;
  p.world_size = world_size;
  p.weight_layout = layout;
  return p;
}

std::vector<Problem> sweep(int world_size) {
  std::vector<Problem> out;
  for (int64_t m : {512, 2048, 8192, 32768}) {
    for (const auto& nk : {std::pair<int64_t, int64_t>{8192, 8192}, {8192, 28672}, {6144, 6144}, {6144, 16384}}) {
      out.push_back(make(m, nk.first, nk.second, world_size));
    }
  }
  return out;
}

// The sweep at P = 1, 2, 4, 8, the GPU tests' shapes and odd ones.
std::vector<Problem> covered_problems() {
  std::vector<Problem> out;
  for (int p : {1, 2, 4, 8}) {
    for (const Problem& s : sweep(p)) out.push_back(s);
    for (int64_t m : {1, 8, 16, 32, 64, 128, 256, 512}) out.push_back(make(m * p, 8192, 8192, p));
  }
  for (const Problem& p : {make(256, 512, 256, 1), make(512, 776, 256, 2), make(1000, 1024, 256, 4),
                           make(512, 8192, 256, 8), make(2048, 1000, 256, 8), make(64, 264, 256, 8),
                           make(256, 1000, 256, 4), make(1000, 2056, 2080, 4), make(4096, 1024, 4096, 2),
                           make(8192, 4096, 4096, 8), make(512, 512, 640, 2), make(2048, 1024, 256, 8),
                           make(1024, 512, 128, 4), make(8, 8, 64, 8), make(1000, 1000, 8000, 8),
                           make(520, 264, 1032, 8), make(24, 8, 8, 1), make(200, 8192, 1024, 1)}) {
    out.push_back(p);
  }
  return out;
}

DeviceInfo h100() { return DeviceInfo{}; }  // the defaults: 132 SMs, 227 KiB opt-in shared memory, cc 9.0

// Registers: 65536 per SM for one CTA. With setmaxnreg the producer warpgroup drops to 40 per thread
// and the consumers get the rest, in multiples of 8.
int consumer_register_budget() {
  const int producer_threads = 128, producer_registers = 40;
  const int per_consumer = (65536 - producer_threads * producer_registers) / (128 * kConsumers);
  return per_consumer / 8 * 8;
}

void expect_fits(const GemmConfig& c, const DeviceInfo& device, const SmemByVariant& smem, const std::string& what) {
  ASSERT_GE(c.variant, 0) << what;
  ASSERT_LT(c.variant, kNumGemmVariants) << what << ": not a compiled variant";
  const GemmVariant& v = c.tile();
  EXPECT_EQ(c.smem_bytes, smem[c.variant]) << what << ": the launch takes the variant's storage";
  EXPECT_LE(c.smem_bytes, size_t(device.max_smem_per_block)) << what;
  EXPECT_EQ(v.block_m % 64, 0) << what;
  EXPECT_LE(v.block_n * 64 / v.block_m, 256) << what << ": a consumer's WGMMA N is at most 256";
  EXPECT_GE(v.stages, 2) << what;
  EXPECT_GE(c.group_rows, 1) << what;
  EXPECT_EQ(c.num_ctas, device.num_sms) << what << ": one persistent CTA per SM";
  // FP32 accumulators per consumer thread, plus headroom for fragments and addresses.
  const int accumulators = v.block_m * v.block_n / (128 * kConsumers);
  EXPECT_LE(accumulators + 64, consumer_register_budget()) << what;
  EXPECT_FALSE(c.to_string().empty()) << what;
  EXPECT_GE(c.split_k, 1) << what;
}

// A split plain GEMM config: at most one wave of split steps (the workspace holds a step per SM), a
// few K blocks at least in every split; a split tail starts after full waves of tiles.
void expect_split_fits(const GemmConfig& c, const Problem& p, const DeviceInfo& device, const std::string& what) {
  if (c.split_k == 1) return;
  const GemmVariant& v = c.tile();
  const int64_t tiles = ((p.m + v.block_m - 1) / v.block_m) * ((p.n + v.block_n - 1) / v.block_n);
  const int64_t num_k_blocks = k_blocks_of(p.k_per_rank, p.dtype);
  EXPECT_EQ(c.whole_tiles % device.num_sms, 0) << what << ": a split tail after full waves";
  EXPECT_LT(c.whole_tiles, tiles) << what;
  EXPECT_LE((tiles - c.whole_tiles) * c.split_k, device.num_sms) << what << ": more split steps than SMs";
  EXPECT_GE(num_k_blocks / c.split_k, 3) << what << ": splits of under 3 K blocks";
  EXPECT_LE(c.split_k, 8) << what;
}

const SmemByVariant& gemm_smem() {
  static constexpr SmemByVariant kSmem = smem_bytes_by_variant<NoOpSync>();
  return kSmem;
}

TEST(Config, SweepShapesFitTheDevice) {
  for (const Problem& p : sweep(1)) {
    GemmConfig c;
    const Status s = select_plain_gemm_config(p, h100(), {}, &c);
    ASSERT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
    expect_fits(c, h100(), gemm_smem(), p.to_string() + " -> " + c.to_string());
  }
  for (int world_size : {2, 4, 8}) {
    for (const Problem& p : sweep(world_size)) {
      GemmRsConfig c;
      const Status s = select_gemm_rs_config(p, h100(), {}, &c);
      ASSERT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
      expect_fits(c.gemm, h100(), gemm_rs_smem_bytes(), p.to_string() + " -> " + c.to_string());
      EXPECT_GE(c.own_lag, 0) << c.to_string();
    }
  }
}

// E4M3 problems run E4M3 variants of their accumulation (promoted ones hold two accumulator sets:
// 128 x 192 tiles at most), never BF16's; the reduce-scatter adds no partial rounds to a partial
// before it is scaled.
TEST(Config, E4M3RunsItsOwnVariants) {
  int checked = 0;
  for (int world_size : {1, 2, 4, 8}) {
    for (Problem p : covered_problems()) {
      if (p.world_size != world_size || p.n % 16 != 0 || p.k_per_rank % 16 != 0) continue;
      p.dtype = DType::kE4M3;
      p.scaling = Scaling::kRowwise;
      for (const Accumulation accumulation : {Accumulation::kPromoted, Accumulation::kFast}) {
        p.accumulation = accumulation;
        const std::string what = p.to_string();
        GemmConfig gemm;
        const Status s = select_plain_gemm_config(p, h100(), {}, &gemm);
        ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
        EXPECT_EQ(gemm.tile().dtype, DType::kE4M3) << what;
        EXPECT_EQ(gemm.tile().promoted, accumulation == Accumulation::kPromoted) << what;
        EXPECT_EQ(swap_ab_rows(p, h100(), {}), 0) << what;
        if (gemm.tile().promoted) EXPECT_LE(gemm.tile().block_m * gemm.tile().block_n, 128 * 192) << what;
        EXPECT_FALSE(gemm.tile().block_scaled) << what;
        if (world_size == 1) continue;
        GemmRsConfig rs;
        const Status r = select_gemm_rs_config(p, h100(), {}, &rs);
        ASSERT_TRUE(r.ok()) << what << ": " << r.to_string();
        EXPECT_EQ(rs.gemm.tile().dtype, DType::kE4M3) << what;
        EXPECT_EQ(rs.gemm.tile().promoted, accumulation == Accumulation::kPromoted) << what;
        EXPECT_EQ(rs.partial_rounds, 0) << what;
        expect_fits(rs.gemm, h100(), gemm_rs_smem_bytes(), what + " -> " + rs.to_string());
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Promoted E4M3's plain GEMM takes its widest tile, 128 x 192, where BF16's would be 128 x 256 (the
// sweep's per-rank shapes from M = 2048 on), blockwise too; the reduce-scatter takes it blockwise
// (its rows of every rank fill many waves here), and 128 x 128 tensorwise, its widest.
TEST(Config, PromotedE4M3GemmTakesItsWidestTile) {
  for (const Scaling scaling : {Scaling::kTensorwise, Scaling::kBlockwise}) {
    for (const int64_t m : {2048, 8192, 32768}) {
      for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8192, 1024}, {8192, 3584}, {6144, 768}, {6144, 2048}}) {
        Problem p = make(m, n, k, 1);
        p.dtype = DType::kE4M3;
        p.scaling = scaling;
        if (scaling == Scaling::kBlockwise && k % kScaleBlock != 0) continue;
        GemmConfig gemm;
        ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &gemm).ok()) << p.to_string();
        EXPECT_EQ(gemm.tile().block_n, 192) << p.to_string() << " -> " << gemm.to_string();
        EXPECT_TRUE(gemm.tile().promoted) << p.to_string();
        EXPECT_EQ(gemm.tile().block_scaled, scaling == Scaling::kBlockwise) << p.to_string();
        p.world_size = 8;
        p.m = m * 8;
        GemmRsConfig rs;
        ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
        EXPECT_EQ(rs.gemm.tile().block_n, scaling == Scaling::kBlockwise ? 192 : 128)
            << p.to_string() << " -> " << rs.to_string();
      }
    }
  }
}

// The reduce-scatter's blockwise width by waves, its 192-wide step weighed at 1.42 of a 128-wide one:
// at P = 8 on the sweep, 128 x 128 where 128 x 192 leaves a last wave mostly idle (N = 8192 at M = 512
// and 2048: 172 and 688 tiles on 132 SMs against 256 and 1024), 128 x 192 elsewhere.
TEST(Config, BlockwiseReduceScatterCountsWaves) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8192, 1024}, {8192, 3584}, {6144, 768}, {6144, 2048}}) {
    for (const int64_t m : {512, 2048, 8192, 32768}) {
      Problem p = make(m, n, 8 * k, 8, WeightLayout::kNxK);
      p.dtype = DType::kE4M3;
      p.scaling = Scaling::kBlockwise;
      GemmRsConfig rs;
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
      EXPECT_TRUE(rs.gemm.tile().block_scaled) << p.to_string();
      EXPECT_EQ(rs.gemm.tile().block_m, 128) << p.to_string();
      const int width = n == 8192 && m <= 2048 ? 128 : 192;
      EXPECT_EQ(rs.gemm.tile().block_n, width) << p.to_string() << " -> " << rs.to_string();
    }
  }
}

// Where 128 x 192 tiles leave a last wave mostly idle and 128 x 128 ones fill theirs, promoted E4M3's
// plain GEMM takes 128 x 128: M = 512 of N = 8192 (172 tiles of 128 x 192 on 132 SMs, 256 of
// 128 x 128); at M = 512 of N = 6144 128 x 192 is one wave (128 tiles) and stays.
TEST(Config, PromotedE4M3GemmCountsWaves) {
  for (const Scaling scaling : {Scaling::kRowwise, Scaling::kBlockwise}) {
    for (const auto& [n, k, width] : {std::tuple<int64_t, int64_t, int>{8192, 1024, 128}, {8192, 3584, 128},
                                      {6144, 768, 192}, {6144, 2048, 192}}) {
      Problem p = make(512, n, k, 1);
      p.dtype = DType::kE4M3;
      p.scaling = scaling;
      GemmConfig gemm;
      ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &gemm).ok()) << p.to_string();
      EXPECT_EQ(gemm.tile().block_m, 128) << p.to_string() << " -> " << gemm.to_string();
      EXPECT_EQ(gemm.tile().block_n, width) << p.to_string() << " -> " << gemm.to_string();
      EXPECT_EQ(gemm.split_k, 1) << p.to_string() << " -> " << gemm.to_string();
      // A forced width is kept, or the nearest compiled one taken.
      ConfigOverrides wide;
      wide.block_n = 256;
      ASSERT_TRUE(select_plain_gemm_config(p, h100(), wide, &gemm).ok()) << p.to_string();
      EXPECT_EQ(gemm.tile().block_n, 192) << p.to_string() << " -> " << gemm.to_string();
    }
  }
}

// The all-gather takes the blockwise 128 x 192 variant too where its model wants wide tiles (the
// sweep's gate_up and w1_w3 projections from M = 2048 on), and 128 x 128 where narrower tiles win.
TEST(Config, BlockwiseAllGatherTakesTheWiderTile) {
  int wide = 0;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1280, 8192}, {7168, 8192}, {1024, 6144}, {4096, 6144}}) {
    for (const int64_t m : {512, 2048, 8192, 32768}) {
      AllGatherProblem p{m, n, k, 8, WeightLayout::kNxK, DType::kE4M3};
      p.scaling = Scaling::kBlockwise;
      p.accumulation = Accumulation::kPromoted;
      AllGatherConfig ag;
      ASSERT_TRUE(select_all_gather_config(p, h100(), {}, &ag).ok()) << p.to_string();
      EXPECT_TRUE(ag.gemm.tile().block_scaled) << p.to_string();
      EXPECT_EQ(ag.gemm.tile().block_m, 128) << p.to_string();
      const int block_n = ag.gemm.tile().block_n;
      EXPECT_TRUE(block_n == 128 || block_n == 192) << p.to_string() << " -> " << ag.gemm.to_string();
      if (n >= 4096 && m >= 2048) EXPECT_EQ(block_n, 192) << p.to_string() << " -> " << ag.gemm.to_string();
      wide += block_n == 192;
    }
  }
  EXPECT_GT(wide, 0);
}

// Blockwise scales run a block-scaled variant (promoted; 128 x 128 or 128 x 192), in the plain GEMM
// and the reduce-scatter, on the default device and whatever the overrides or the device's shared
// memory (or an error where it does not fit, never another variant), and in the all-gather on the
// default device; no other problem runs it. Small M splits K as other E4M3 does.
TEST(Config, BlockwiseRunsTheBlockScaledVariantOnly) {
  const auto e4m3 = [](Problem p, Scaling scaling, Accumulation accumulation) {
    p.weight_layout = WeightLayout::kNxK;
    p.dtype = DType::kE4M3;
    p.scaling = scaling;
    p.accumulation = accumulation;
    return p;
  };
  std::vector<ConfigOverrides> overrides(1);
  for (const int block_n : {256, 192, 128, 64}) overrides.emplace_back().block_n = block_n;
  for (const int split_k : {1, 2, 4}) overrides.emplace_back().split_k = split_k;
  for (const int shared_tiles : {0, 1}) overrides.emplace_back().shared_tiles = shared_tiles;
  for (const int registers : {0, 1}) overrides.emplace_back().register_epilogue = registers;
  DeviceInfo short_smem = h100();
  short_smem.max_smem_per_block = 160 * 1024;  // less than the variant's five stages
  int blockwise_choices = 0, other_choices = 0, blockwise_errors = 0;
  for (const Problem& shape : covered_problems()) {
    if (shape.k_per_rank % kScaleBlock != 0) continue;
    const Problem blockwise = e4m3(shape, Scaling::kBlockwise, Accumulation::kPromoted);
    for (const DeviceInfo& device : {h100(), DeviceInfo{132, 200 * 1024, 9, 0}, short_smem}) {
      for (const ConfigOverrides& o : overrides) {
        const std::string what = blockwise.to_string() + ", " + o.to_string() + ", " +
                                 std::to_string(device.max_smem_per_block) + " B";
        const auto expect_block_scaled = [&](const Status& s, const GemmConfig& c, const SmemByVariant& smem,
                                             bool wider) {
          if (!s.ok()) {
            const bool defaults = o.to_string() == "none" && device.max_smem_per_block == h100().max_smem_per_block;
            EXPECT_FALSE(defaults) << what << ": " << s.to_string();
            ++blockwise_errors;
            return;
          }
          EXPECT_TRUE(c.tile().block_scaled) << what << " -> " << c.to_string();
          EXPECT_TRUE(c.tile().promoted) << what;
          EXPECT_EQ(c.tile().dtype, DType::kE4M3) << what;
          EXPECT_EQ(c.tile().block_m, 128) << what;
          if (!wider || c.tile().block_n != 192) EXPECT_EQ(c.tile().block_n, 128) << what;
          expect_fits(c, device, smem, what);
          ++blockwise_choices;
        };
        GemmConfig gemm;
        expect_block_scaled(select_plain_gemm_config(blockwise, device, o, &gemm), gemm, gemm_smem(), /*wider=*/true);
        EXPECT_EQ(swap_ab_rows(blockwise, device, o), 0) << what;
        if (blockwise.world_size == 1) continue;
        GemmRsConfig rs;
        expect_block_scaled(select_gemm_rs_config(blockwise, device, o, &rs), rs.gemm, gemm_rs_smem_bytes(),
                            /*wider=*/true);
      }
    }
    // Every other problem of the shape: never the block-scaled variant.
    std::vector<Problem> others = {shape, e4m3(shape, Scaling::kNone, Accumulation::kPromoted)};
    others.back().dtype = DType::kBF16;
    for (const Scaling scaling : {Scaling::kTensorwise, Scaling::kRowwise}) {
      for (const Accumulation accumulation : {Accumulation::kPromoted, Accumulation::kFast}) {
        others.push_back(e4m3(shape, scaling, accumulation));
      }
    }
    for (const Problem& p : others) {
      for (const ConfigOverrides& o : overrides) {
        const std::string what = p.to_string() + ", " + o.to_string();
        GemmConfig gemm;
        if (select_plain_gemm_config(p, h100(), o, &gemm).ok()) {
          EXPECT_FALSE(gemm.tile().block_scaled) << what << " -> " << gemm.to_string();
          ++other_choices;
        }
        GemmRsConfig rs;
        if (p.world_size > 1 && select_gemm_rs_config(p, h100(), o, &rs).ok()) {
          EXPECT_FALSE(rs.gemm.tile().block_scaled) << what << " -> " << rs.to_string();
        }
        AllGatherProblem gathered{p.m, p.n, p.k_per_rank, p.world_size, p.weight_layout, p.dtype};
        gathered.scaling = p.scaling;
        gathered.accumulation = p.accumulation;
        AllGatherConfig ag;
        if (select_all_gather_config(gathered, h100(), o, &ag).ok()) {
          EXPECT_FALSE(ag.gemm.tile().block_scaled) << what << " -> " << ag.gemm.to_string();
        }
      }
    }
    AllGatherProblem gathered{blockwise.m, blockwise.n, blockwise.k_per_rank, blockwise.world_size,
                              WeightLayout::kNxK, DType::kE4M3};
    gathered.scaling = Scaling::kBlockwise;
    gathered.accumulation = Accumulation::kPromoted;
    AllGatherConfig ag;
    const Status s = select_all_gather_config(gathered, h100(), {}, &ag);
    ASSERT_TRUE(s.ok()) << gathered.to_string() << ": " << s.to_string();
    EXPECT_TRUE(ag.gemm.tile().block_scaled) << gathered.to_string() << " -> " << ag.gemm.to_string();
  }
  EXPECT_GT(blockwise_choices, 1000);
  EXPECT_GT(other_choices, 1000);
  EXPECT_GT(blockwise_errors, 0) << "160 KiB fits no block-scaled variant";

  // At decode-sized M the plain GEMM splits K as for other E4M3 (the GPU tests' split case).
  GemmConfig small_m;
  ASSERT_TRUE(
      select_plain_gemm_config(e4m3(make(64, 2048, 4096, 1), Scaling::kBlockwise, Accumulation::kPromoted), h100(),
                               {}, &small_m)
          .ok());
  EXPECT_GT(small_m.split_k, 1) << small_m.to_string();
}

// Whatever the device's shared memory, the choice is a compiled variant that fits it, or an error
// that says so: never a config the dispatch does not have.
TEST(Config, EveryChoiceIsCompiledAndFits) {
  int errors = 0, choices = 0;
  for (int kib = 64; kib <= 227; ++kib) {
    DeviceInfo device = h100();
    device.max_smem_per_block = kib * 1024;
    for (const Problem& p : covered_problems()) {
      const std::string what = p.to_string() + ", " + std::to_string(kib) + " KiB";
      GemmConfig gemm;
      Status s = select_plain_gemm_config(p, device, {}, &gemm);
      if (s.ok()) {
        expect_fits(gemm, device, gemm_smem(), what);
        expect_split_fits(gemm, p, device, what);
        ++choices;
      } else {
        EXPECT_EQ(s.code(), StatusCode::kUnsupported) << what;
        EXPECT_NE(s.message().find("shared memory"), std::string::npos) << s.message();
        ++errors;
      }
      if (p.world_size == 1) continue;
      GemmRsConfig rs;
      s = select_gemm_rs_config(p, device, {}, &rs);
      if (s.ok()) {
        expect_fits(rs.gemm, device, gemm_rs_smem_bytes(), what);
        if (!rs.shared_tiles) EXPECT_EQ(rs.gemm.split_k, 1) << what << ": only shared tiles split K";
        if (rs.segments_per_tile == 2 && p.world_size > 2) EXPECT_EQ(rs.gemm.tile().block_m, 128) << what;
        if (p.rows_per_rank() < kSlabRows && kSlabRows % p.rows_per_rank() == 0) {
          EXPECT_EQ(rs.segments_per_tile, p.world_size) << what;
        }
        ++choices;
      } else {
        EXPECT_EQ(s.code(), StatusCode::kUnsupported) << what;
        ++errors;
      }
    }
  }
  EXPECT_GT(choices, 0);
  EXPECT_GT(errors, 0) << "64 KiB fits no variant";
  // 200 KiB (the case that once picked an uncompiled 2-stage variant) gets a compiled one.
  DeviceInfo device = h100();
  device.max_smem_per_block = 200 * 1024;
  GemmRsConfig rs;
  ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 8192, 8), device, {}, &rs).ok());
  expect_fits(rs.gemm, device, gemm_rs_smem_bytes(), rs.to_string());
  GemmConfig gemm;
  ASSERT_TRUE(select_plain_gemm_config(make(8192, 8192, 8192, 1), device, {}, &gemm).ok());
  expect_fits(gemm, device, gemm_smem(), gemm.to_string());
}

// Rows in sequences: where a shard is whole 128-row tiles, the config of the same rows as one
// sequence (the same tiles and sums); else 64-row tiles only, so that no tile holds two shards, also
// where shared memory is short (or an error, never a 128-row tile).
TEST(Config, SequencesKeepTilesInsideAShard) {
  const auto batched = [](int64_t m, int p, int64_t batch) {
    Problem problem = make(m, 8192, 1024, p);
    problem.batch = batch;
    return problem;
  };
  for (const auto& [m, p, batch] : {std::tuple{8192, 8, 4}, std::tuple{16384, 8, 2}, std::tuple{2048, 4, 2}}) {
    GemmRsConfig one, several;
    ASSERT_TRUE(select_gemm_rs_config(make(m, 8192, 1024, p), h100(), {}, &one).ok());
    ASSERT_TRUE(select_gemm_rs_config(batched(m, p, batch), h100(), {}, &several).ok());
    EXPECT_EQ(several.to_string(), one.to_string()) << m << " rows, P " << p << ", batch " << batch;
  }
  for (int kib = 64; kib <= 227; kib += 3) {
    DeviceInfo device = h100();
    device.max_smem_per_block = kib * 1024;
    for (const auto& [m, p, batch] : {std::tuple{3072, 8, 2}, std::tuple{1024, 4, 4}, std::tuple{6144, 8, 4}}) {
      GemmRsConfig c;
      const Status s = select_gemm_rs_config(batched(m, p, batch), device, {}, &c);
      if (s.ok()) {
        EXPECT_EQ(c.gemm.tile().block_m, kSlabRows) << kib << " KiB: " << c.to_string();
      } else {
        EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
      }
      if (kib >= 200) EXPECT_TRUE(s.ok()) << kib << " KiB: " << s.to_string();
    }
  }
}

// A single wave of 128 x 256 tiles (M = 512, N = 8192: 128 tiles; at P = 8 its bands of two
// segments too) gets 4 stages, the epilogue staging 2 chunks at a time; with more waves (M = 2048:
// 512 tiles), or narrower tiles (N = 6144), the whole slab and 3 stages stay.
TEST(Config, OneWaveStagesInBatches) {
  GemmConfig c;
  ASSERT_TRUE(select_plain_gemm_config(make(512, 8192, 1024, 1), h100(), {}, &c).ok());
  EXPECT_EQ(c.tile().staged_chunks, 2) << c.to_string();
  EXPECT_EQ(c.tile().stages, 4) << c.to_string();
  GemmRsConfig rs;
  ASSERT_TRUE(select_gemm_rs_config(make(512, 8192, 8192, 8), h100(), {}, &rs).ok());
  EXPECT_EQ(rs.gemm.tile().staged_chunks, 2) << rs.to_string();
  EXPECT_EQ(rs.gemm.tile().stages, 4) << rs.to_string();
  for (const Problem& p : {make(2048, 8192, 1024, 1), make(32768, 8192, 3584, 1), make(512, 6144, 768, 1)}) {
    ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &c).ok());
    EXPECT_EQ(c.tile().staged_chunks, 0) << p.to_string() << " -> " << c.to_string();
  }
  ASSERT_TRUE(select_plain_gemm_config(make(2048, 8192, 1024, 1), h100(), {}, &c).ok());
  EXPECT_EQ(c.tile().stages, 3) << c.to_string();
}

// Segments of 64 rows share 128-row tiles in pairs from P = 4 on; at P = 2 they get 64-row tiles;
// shorter ones one band of all segments, with the plain GEMM's tiles for the whole M among those the
// fused ops take (W read once: 64 x 128 at M = 64, N = 8192 and K/P = 1024); larger ones 128-row
// tiles of their own.
TEST(Config, SmallSegments) {
  GemmRsConfig c;
  for (int world_size : {4, 8}) {
    ASSERT_TRUE(select_gemm_rs_config(make(64 * world_size, 8192, 8192, world_size), h100(), {}, &c).ok());
    EXPECT_EQ(c.gemm.tile().block_m, 128) << c.to_string();
    EXPECT_EQ(c.segments_per_tile, 2) << c.to_string();
  }
  ASSERT_TRUE(select_gemm_rs_config(make(128, 8192, 8192, 2), h100(), {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_m, 64) << c.to_string();
  EXPECT_EQ(c.segments_per_tile, 1) << c.to_string();
  for (int world_size : {2, 4, 8}) {
    for (int m : {world_size, 8 * world_size, 32 * world_size}) {
      const Problem p = make(m, 8192, 1024 * world_size, world_size);
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &c).ok());
      EXPECT_EQ(c.segments_per_tile, world_size) << p.to_string() << " -> " << c.to_string();
      EXPECT_EQ(c.partial_rounds, 0) << p.to_string() << " -> " << c.to_string();
      // The plain GEMM's tile and splits, or where the fused ops do not take its tile, its splits of
      // the op's tile.
      GemmConfig g;
      ASSERT_TRUE(select_plain_gemm_config(make(m, 8192, 1024 * world_size, world_size), h100(), {}, &g).ok());
      if (!fused_ops_take(g.tile())) {
        ConfigOverrides same_width;
        same_width.block_n = c.gemm.tile().block_n;
        ASSERT_TRUE(select_plain_gemm_config(make(m, 8192, 1024 * world_size, world_size), h100(), same_width, &g).ok());
      }
      EXPECT_TRUE(c.shared_tiles) << p.to_string() << " -> " << c.to_string();
      // From registers where the band is one slab of rows (m <= 64), staged above, unless forced.
      EXPECT_EQ(c.register_epilogue, m <= 64) << p.to_string() << " -> " << c.to_string();
      for (int forced : {0, 1}) {
        ConfigOverrides o;
        o.register_epilogue = forced;
        GemmRsConfig f;
        ASSERT_TRUE(select_gemm_rs_config(p, h100(), o, &f).ok());
        EXPECT_EQ(f.register_epilogue, forced == 1) << p.to_string() << " -> " << f.to_string();
      }
      // The same tile (128 x 128 at M = 256 on the fused ops' variant, a stage fewer).
      EXPECT_EQ(c.gemm.tile().block_m, g.tile().block_m) << p.to_string() << " -> " << c.to_string() << " against " << g.to_string();
      EXPECT_EQ(c.gemm.tile().block_n, g.tile().block_n) << p.to_string() << " -> " << c.to_string() << " against " << g.to_string();
      EXPECT_EQ(c.gemm.split_k, g.split_k) << p.to_string() << " -> " << c.to_string() << " against " << g.to_string();
      ConfigOverrides never;
      never.shared_tiles = 0;
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), never, &c).ok());
      EXPECT_EQ(c.segments_per_tile, 1) << p.to_string() << " -> " << c.to_string();
      EXPECT_EQ(c.gemm.split_k, 1) << p.to_string() << " -> " << c.to_string();
      EXPECT_FALSE(c.register_epilogue) << p.to_string() << " -> " << c.to_string() << ": tiles of one owner";
    }
  }
  // Segments whose rows do not divide a slab's keep tiles of their own.
  ASSERT_TRUE(select_gemm_rs_config(make(24 * 8, 8192, 8192, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.segments_per_tile, 1) << c.to_string();
  ASSERT_TRUE(select_gemm_rs_config(make(64, 8192, 8192, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_m, 64) << c.to_string();
  EXPECT_EQ(c.gemm.tile().block_n, 64) << c.to_string() << ": 128 CTAs on W (one consumer), K whole (16 K blocks)";
  EXPECT_TRUE(c.register_epilogue) << c.to_string();
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(64, 8192, 8192, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m, 64) << g.to_string();
  ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 8192, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_m, 128);
  EXPECT_EQ(c.segments_per_tile, 1);
}

// The communicator's flags (a word per source rank, tile of a band and slab: ops/gemm_rs/protocol.cuh's
// flag_index) hold every tile the config chooses for any call it serves, the register epilogue's
// 64 x 64 tiles and forced widths included.
TEST(Config, FlagsHoldEveryChosenTile) {
  ConfigOverrides defaults;
  ConfigOverrides narrowest, registers;
  narrowest.block_n = 64;
  registers.register_epilogue = 1;
  int one_consumer_tiles = 0;
  for (int world_size : {2, 4, 8}) {
    for (int64_t rows : {1, 8, 16, 32, 64, 100, 512}) {
      for (int64_t n : {8, 520, 1000, 6144, 8192}) {
        const Problem p = make(rows * world_size, n, 1024 * world_size, world_size);
        // A communicator sized for this call alone: no room to spare.
        CommunicatorOptions options;
        options.max_m = p.m;
        options.max_n = n;
        const WorkspaceSize size = gemm_rs_workspace(options, world_size);
        for (const ConfigOverrides* o : {&defaults, &narrowest, &registers}) {
          GemmRsConfig c;
          const Status s = select_gemm_rs_config(p, h100(), *o, &c);
          if (o == &narrowest && !c.register_epilogue && s.code() == StatusCode::kInvalidArgument) continue;
          ASSERT_TRUE(s.ok()) << p.to_string() << ", overrides " << o->to_string() << ": " << s.to_string();
          const TileSchedule schedule(schedule_shape(p, c, 0));
          const size_t words = size_t(world_size) * size_t(schedule.tiles_per_band()) * kConsumers;
          EXPECT_LE(words, size.flag_words) << p.to_string() << " -> " << c.to_string();
          one_consumer_tiles += c.gemm.tile().consumers == 1;
        }
      }
    }
  }
  EXPECT_GT(one_consumer_tiles, 0) << "the one-consumer tiles, whose flags the sizing must hold, were never chosen";
}

// A rank's own tiles come about two waves of steps (2 x 132) behind the peers' tiles of the same
// rows where a band has at least twice as many tiles as that lag and K per rank is at most 4096,
// else last; the raster groups of the P segments a wave works on add up to 32 row tiles.
TEST(Config, ScheduleOfTheFusedOp) {
  for (int world_size : {2, 4, 8}) {
    GemmRsConfig c;
    ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 8192, world_size), h100(), {}, &c).ok());
    EXPECT_EQ(c.own_lag, (2 * 132 + world_size - 1) / world_size) << "P=" << world_size;
    EXPECT_EQ(c.gemm.group_rows, 32 / world_size) << "P=" << world_size;
  }
  GemmRsConfig c;
  // M = 2048 at P = 8: 2 x 32 tiles a segment, under twice the lag of 33 rounds.
  ASSERT_TRUE(select_gemm_rs_config(make(2048, 8192, 8192, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  // At P = 2 a band needs only the lag's tiles: M = 2048 has 8 x 32 (N = 8192) or 8 x 24 (N = 6144)
  // against a lag of 132 rounds; M = 512 has 2 x 32.
  for (const Problem& p : {make(2048, 8192, 8192, 2), make(2048, 6144, 6144, 2)}) {
    ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &c).ok());
    EXPECT_EQ(c.own_lag, 132) << p.to_string();
  }
  ASSERT_TRUE(select_gemm_rs_config(make(512, 8192, 8192, 2), h100(), {}, &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  // Deep tiles (K per rank 14336 at P = 2) keep their own tiles last.
  ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 28672, 2), h100(), {}, &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  // Bands of two segments (M = 512 at P = 8): 32 tiles a band.
  ASSERT_TRUE(select_gemm_rs_config(make(512, 8192, 8192, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(8192, 8192, 8192, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.group_rows, 32);
}

// An own tile's peer partials come in rounds during its K loop, one peer a round, where the K loop
// holds them (and own tiles are interleaved, or P >= 4): every consumer's rounds end after the K
// block before the last one, start no earlier than kFirstAdd, and are spaced out.
TEST(Config, PartialRoundsFitTheKLoop) {
  struct Case {
    Problem problem;
    int rounds;
  };
  for (const Case& t : {
           Case{make(8192, 8192, 8192, 8), 6},    // 16 K blocks: rounds after 3, 5, ..., 13 (and 4, ..., 14)
           Case{make(8192, 6144, 6144, 8), 4},    // 12 K blocks
           Case{make(8192, 6144, 16384, 8), 7},   // 32 K blocks: every peer
           Case{make(8192, 8192, 8192, 2), 1},    // one peer
           Case{make(8192, 8192, 2048, 8), 0},    // 4 K blocks: too short
           Case{make(512, 8192, 8192, 8), 0},     // bands of two segments: the partner pushes after its K loop
           Case{make(2048, 8192, 8192, 2), 1},    // own tiles interleaved at P = 2: its one peer
           Case{make(2048, 8192, 8192, 8), 6},    // own tiles last at P = 8
           Case{make(8192, 8192, 28672, 2), 0},   // own tiles last (deep tiles) at P = 2
           Case{make(512, 8192, 4096, 4), 0},     // one wave, the slab staged in batches
       }) {
    GemmRsConfig c;
    ASSERT_TRUE(select_gemm_rs_config(t.problem, h100(), {}, &c).ok());
    EXPECT_EQ(c.partial_rounds, t.rounds) << t.problem.to_string() << " -> " << c.to_string();
    const int num_k_blocks = int((t.problem.k_per_rank + 63) / 64);
    const int rounds = c.partial_rounds;
    if (rounds > 0) {
      EXPECT_EQ(partial_round_k_block(kConsumers - 1, kConsumers, rounds - 1, rounds, num_k_blocks), num_k_blocks - 2)
          << c.to_string();
      EXPECT_GE(partial_round_k_block(0, kConsumers, 0, rounds, num_k_blocks), PartialRounds::kFirstAdd)
          << c.to_string();
      // Each consumer's rounds are spaced out, and the consumers take them at different K blocks.
      for (int r = 0; r < rounds; ++r) {
        const int kb = partial_round_k_block(0, kConsumers, r, rounds, num_k_blocks);
        EXPECT_LT(kb, partial_round_k_block(1, kConsumers, r, rounds, num_k_blocks));
        if (r + 1 < rounds) EXPECT_GE(partial_round_k_block(0, kConsumers, r + 1, rounds, num_k_blocks) - kb, 2);
      }
    }
  }
}

TEST(Config, OverridesApply) {
  ConfigOverrides o;
  o.block_n = 192;
  o.group_rows = 3;
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(8192, 8192, 8192, 1), h100(), o, &g).ok());
  EXPECT_EQ(g.tile().block_n, 192) << g.to_string();
  EXPECT_EQ(g.group_rows, 3) << g.to_string();
  // 64-row tiles take 64, 128, 192 (one consumer) or 256 when asked.
  for (int width : {64, 128, 192, 256}) {
    ConfigOverrides w;
    w.block_n = width;
    ASSERT_TRUE(select_plain_gemm_config(make(64, 8192, 8192, 1), h100(), w, &g).ok());
    EXPECT_EQ(g.tile().block_m, 64);
    EXPECT_EQ(g.tile().block_n, width) << g.to_string();
  }

  ConfigOverrides lag;
  lag.own_lag = 0;
  GemmRsConfig c;
  ASSERT_TRUE(select_gemm_rs_config(make(512, 512, 640, 2), h100(), lag, &c).ok());
  EXPECT_EQ(c.own_lag, 0);
  EXPECT_EQ(c.partial_rounds, 1) << "own tiles interleaved at P = 2: its one peer in a round";
  lag.partial_rounds = 0;
  ASSERT_TRUE(select_gemm_rs_config(make(512, 512, 640, 2), h100(), lag, &c).ok());
  EXPECT_EQ(c.partial_rounds, 0);
  ConfigOverrides more;
  more.partial_rounds = 100;  // at most what the K loop holds
  ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 8192, 8), h100(), more, &c).ok());
  EXPECT_EQ(c.partial_rounds, 6);
  EXPECT_NE(more.to_string().find("partial_rounds=100"), std::string::npos) << more.to_string();
  EXPECT_EQ(ConfigOverrides{}.to_string(), "none");
}

TEST(Config, BadOverridesAreErrors) {
  struct Case {
    ConfigOverrides overrides;
    const char* message;
  };
  ConfigOverrides block_n, group_rows, own_lag, rounds, split_k, idle_copiers, registers;
  block_n.block_n = 100;
  idle_copiers.idle_copiers = 2;
  registers.register_epilogue = 3;
  group_rows.group_rows = -2;
  own_lag.own_lag = -5;
  rounds.partial_rounds = -3;
  split_k.split_k = -1;
  for (const Case& t : {Case{block_n, "overrides.block_n = 100"}, Case{group_rows, "overrides.group_rows = -2"},
                        Case{own_lag, "overrides.own_lag = -5"}, Case{rounds, "overrides.partial_rounds = -3"},
                        Case{split_k, "overrides.split_k = -1"}, Case{idle_copiers, "overrides.idle_copiers = 2"},
                        Case{registers, "overrides.register_epilogue = 3"}}) {
    GemmRsConfig c;
    const Status s = select_gemm_rs_config(make(8192, 8192, 8192, 8), h100(), t.overrides, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << t.message;
    EXPECT_NE(s.message().find(t.message), std::string::npos) << s.message();
  }
}

TEST(Config, NonHopperIsUnsupported) {
  for (const auto& cc : {std::pair<int, int>{8, 0}, {8, 9}, {10, 0}, {12, 0}}) {
    DeviceInfo device = h100();
    device.cc_major = cc.first;
    device.cc_minor = cc.second;
    GemmRsConfig c;
    c.own_lag = -7;  // must stay untouched
    const Status s = select_gemm_rs_config(make(2048, 8192, 8192, 8), device, {}, &c);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << cc.first << "." << cc.second;
    EXPECT_NE(s.message().find(std::to_string(cc.first) + "." + std::to_string(cc.second)), std::string::npos)
        << s.message();
    EXPECT_EQ(c.own_lag, -7);
  }
}

TEST(Config, NullOutputIsAnError) {
  EXPECT_EQ(select_gemm_rs_config(make(2048, 8192, 8192, 8), h100(), {}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(select_plain_gemm_config(make(2048, 8192, 8192, 1), h100(), {}, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Tile width follows the waves: 128 x 256 tiles of M=512, N=6144 are 96 tiles on 132 SMs (a third
// idle), 128 x 192 tiles are 128; at N=8192, 128 x 256 tiles already fill one wave.
TEST(Config, NarrowerTilesWhereTheLastWaveWouldIdle) {
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(512, 6144, 768, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_n, 192) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(512, 8192, 1024, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_n, 256) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(32768, 8192, 3584, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_n, 256) << g.to_string();
  // 64 rows per rank at P = 8: bands of two segments, 4 x 24 tiles 256 wide, 4 x 32 tiles 192 wide.
  GemmRsConfig c;
  ASSERT_TRUE(select_gemm_rs_config(make(512, 6144, 768 * 8, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_n, 192) << c.to_string();
  ASSERT_TRUE(select_gemm_rs_config(make(512, 8192, 1024 * 8, 8), h100(), {}, &c).ok());
  EXPECT_EQ(c.gemm.tile().block_n, 256) << c.to_string();
}

// The storage the kernels and the launches take holds every part of a variant, counted here from
// the variant's own numbers: the stages of A and W tiles, the epilogue's chunk buffers, the ring's
// barriers and notes, the op's barriers; at most the alignment's padding more.
TEST(Config, SharedStorageHoldsEveryPart) {
  for (int i = 0; i < kNumGemmVariants; ++i) {
    const GemmVariant& v = kGemmVariants[i];
    const int slab_chunks = (v.block_m == 128 ? v.block_n : v.block_n / v.consumers) / 64;
    const int chunks = v.staged_chunks > 0 ? v.staged_chunks : slab_chunks;
    const size_t arrays = size_t(v.stages) * (v.block_m + v.block_n) * 64 * 2 + size_t(v.consumers) * chunks * 64 * 64 * 2;
    const size_t ring = size_t(v.stages) * (2 * 8 + sizeof(Tile));
    const size_t slack = 1024;  // the launch aligns the dynamic shared memory base
    const std::string what = "variant " + std::to_string(i);
    EXPECT_GE(gemm_smem()[i], arrays + ring + slack) << what;
    EXPECT_LT(gemm_smem()[i], arrays + ring + slack + 1024) << what;
    EXPECT_EQ(slab_chunks % chunks, 0) << what << ": a slab is staged in equal batches";
    if (!fused_ops_take(v)) continue;  // the plain GEMM's only
    const size_t op = sizeof(SlabHandoff) * kConsumers + 2 * kConsumers * 8 + 2 * 8;
    EXPECT_GE(gemm_rs_smem_bytes()[i], arrays + ring + op + slack) << what;
    EXPECT_LT(gemm_rs_smem_bytes()[i], arrays + ring + op + slack + 1024) << what;
  }
  EXPECT_EQ(sizeof(Tile), 7 * sizeof(int)) << "the ring's note of a step is a tile";
}

// Small M: where a call's tiles would leave most of the SMs idle, each tile's K loop is split so
// that about one wave of steps fills them: the four per-rank projections at P = 8 (N x K per rank),
// M = 1 .. 64 on 64 x 64 tiles (one consumer) or 64 x 128 split, M = 128 on 64 x 128, M = 256 on
// 128 x 128 (as many as 64 x 256 tiles, fewer bytes each) or at N = 6144 on
// 64 x 192 (one consumer: as few bytes each, a third more CTAs), M = 512 on 128-row tiles unsplit
// (one wave of tiles already).
TEST(Config, SplitKWhereTilesFillFewSms) {
  // Splits of at least 10 K blocks (kMinKBlocksPerSplit), where the tiles fill few SMs: split K
  // measured faster where K is deep (K/P = 2048 and 3584: 1.03-1.32 at M <= 256) and slower at
  // 1024 and 768 (0.69-0.99), whose splits would be 3-4 K blocks (docs/EXPERIMENTS.md). Up to
  // M = 256 the tiles may be 64 rows high (more CTAs on W), so fewer splits; up to M = 64 also 64
  // wide, four times the CTAs, whole.
  struct Expected {
    int64_t n, k;
    int block_n_64, splits_64;    // M = 1 .. 64
    int splits_128;               // M = 128: 64 x 128 tiles
    int block_m_256, block_n_256, splits_256;  // M = 256
    int block_n_512;              // M = 512: 128-row tiles, unsplit
  };
  for (const Expected& e : {
           Expected{8192, 1024, 64, 1, 1, 128, 128, 1, 256},   // 16 K blocks: no split of 10
           Expected{8192, 3584, 128, 2, 1, 128, 128, 1, 256},  // 56 K blocks: 64 tiles x 2 splits of 28
           Expected{6144, 768, 64, 1, 1, 64, 192, 1, 192},     // 12 K blocks
           Expected{6144, 2048, 64, 1, 1, 64, 192, 1, 192},    // 32 K blocks: 96 tiles 64 wide
       }) {
    for (int64_t m : {1, 8, 16, 32, 64, 128, 256, 512}) {
      GemmConfig c;
      const Problem p = make(m, e.n, e.k, 1);
      ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &c).ok()) << p.to_string();
      const std::string what = p.to_string() + " -> " + c.to_string();
      expect_split_fits(c, p, h100(), what);
      if (m <= 64) {
        EXPECT_EQ(c.tile().block_m, 64) << what;
        EXPECT_EQ(c.tile().block_n, e.block_n_64) << what;
        EXPECT_EQ(c.split_k, e.splits_64) << what;
      } else if (m == 128) {
        EXPECT_EQ(c.tile().block_m, 64) << what;
        EXPECT_EQ(c.tile().block_n, 128) << what;
        EXPECT_EQ(c.split_k, e.splits_128) << what;
      } else if (m == 256) {
        EXPECT_EQ(c.tile().block_m, e.block_m_256) << what;
        EXPECT_EQ(c.tile().block_n, e.block_n_256) << what;
        EXPECT_EQ(c.split_k, e.splits_256) << what;
      } else {
        EXPECT_EQ(c.tile().block_m, 128) << what;
        EXPECT_EQ(c.tile().block_n, e.block_n_512) << what;
        EXPECT_EQ(c.split_k, 1) << what;
      }
    }
  }
  // Many waves of tiles, or few K blocks, stay unsplit.
  for (const Problem& p : {make(8192, 8192, 8192, 1), make(2048, 8192, 1024, 1), make(8, 8192, 128, 1)}) {
    GemmConfig c;
    ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &c).ok()) << p.to_string();
    EXPECT_EQ(c.split_k, 1) << p.to_string() << " -> " << c.to_string();
  }
}

// Where the tiles take more than a wave and the last one leaves most SMs idle, that wave's tiles
// alone are split: M = 8192, N = 1280 (llama qkv's column-parallel part at P = 8), K = 8192 is 320
// tiles of 128 x 256, two full waves and 56 tiles, those in 2 splits (112 steps) after tile 264. In
// the model that beats 448 tiles of 128 x 192 (3 waves and 52 tiles, split too) and whole tiles
// (three waves). Where the tail is most of a wave (2048 tiles: 15 waves and 68, which 2 splits
// would make more steps than SMs) or the K loop short, none; overrides.split_k = 1 never splits.
TEST(Config, SplitsTheTailWhereTheLastWaveLeavesSmsIdle) {
  GemmConfig c;
  const Problem qkv = make(8192, 1280, 8192, 1);
  ASSERT_TRUE(select_plain_gemm_config(qkv, h100(), {}, &c).ok());
  EXPECT_EQ(c.tile().block_m, 128) << c.to_string();
  EXPECT_EQ(c.tile().block_n, 256) << c.to_string();
  EXPECT_EQ(c.split_k, 2) << c.to_string();
  EXPECT_EQ(c.whole_tiles, 264) << c.to_string();
  expect_split_fits(c, qkv, h100(), qkv.to_string());
  EXPECT_NE(c.to_string().find("from tile 264"), std::string::npos) << c.to_string();
  ConfigOverrides never;
  never.split_k = 1;
  ASSERT_TRUE(select_plain_gemm_config(qkv, h100(), never, &c).ok());
  EXPECT_EQ(c.split_k, 1) << c.to_string();
  EXPECT_EQ(c.whole_tiles, 0) << c.to_string();
  // Not on 64-row tiles (64 x 64 in a split tail measured 1.22-1.29x the time of whole 64 x 128), nor
  // where the model gives under a twentieth (2 splits of 16 K blocks measured no faster).
  for (const Problem& p : {make(8192, 8192, 8192, 1), make(8192, 1280, 256, 1), make(512, 1280, 2048, 1),
                           make(2048, 7168, 2048, 1)}) {
    ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &c).ok());
    EXPECT_EQ(c.split_k, 1) << p.to_string() << " -> " << c.to_string();
    EXPECT_EQ(c.whole_tiles, 0) << p.to_string() << " -> " << c.to_string();
  }
  // Every config of a sweep of shapes: its splits fit.
  for (int64_t m : {520, 1000, 2048, 4096, 8192, 12288, 32768}) {
    for (int64_t n : {1024, 1280, 4096, 6144, 7168, 8192}) {
      for (int64_t k : {768, 1024, 2048, 6144, 8192}) {
        const Problem p = make(m, n, k, 1);
        ASSERT_TRUE(select_plain_gemm_config(p, h100(), {}, &c).ok()) << p.to_string();
        expect_split_fits(c, p, h100(), p.to_string() + " -> " + c.to_string());
      }
    }
  }
}

// 128 x 128 tiles where they make about a wave that 128 x 256 tiles make only in splits of K (whose
// 128-row partials the model weighs as measured): M = 2048, N = 1024, K = 6144 takes 128 of them
// whole (128 x 256 in 2 splits measured 1.19x the time), M = 1024 64 in 2 splits; M = 4096 keeps a
// wave of 128 x 256 whole. The all-gather takes them on its own 5-stage variant (its copier's ring
// leaves no room for a sixth stage); the reduce-scatter, which hands its tiles on, never.
TEST(Config, OneWaveOf128x128WhereWiderTilesSplit) {
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(2048, 1024, 6144, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  EXPECT_EQ(g.split_k, 1) << g.to_string();
  EXPECT_EQ(g.tile().stages, 6) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(1024, 1024, 6144, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  EXPECT_EQ(g.split_k, 2) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(4096, 1024, 6144, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128256) << g.to_string();
  EXPECT_EQ(g.split_k, 1) << g.to_string();
  for (int world_size : {2, 8}) {
    for (int64_t m : {256, 1024, 2048, 8192}) {
      const Problem p = make(m, 1024 * world_size, 6144, world_size);
      GemmRsConfig rs;
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
      EXPECT_TRUE(fused_ops_take(rs.gemm.tile())) << p.to_string() << " -> " << rs.to_string();
    }
  }
}

// One band of 257..512 rows where the model gives 64 x 256 tiles: 128 x 128 ones with their own
// splits (M = 512: N = 4096 whole, N = 1280 in 3), where 128-row tiles hold no more rows past the
// band than 64-row ones (not at M = 448: 64 rows past it).
TEST(Config, OneBandOf512RowsOn128x128) {
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(512, 4096, 6144, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  EXPECT_EQ(g.split_k, 1) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(512, 1280, 8192, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  EXPECT_EQ(g.split_k, 3) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(448, 4096, 6144, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 64256) << g.to_string();
  // Where 128-row tiles were the model's choice anyway (the sweep's o_proj at M = 512).
  ASSERT_TRUE(select_plain_gemm_config(make(512, 8192, 1024, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128256) << g.to_string();
}

// The reduce-scatter at M = 129..256: one wave of 128 x 128 tiles (the fused ops' 5-stage variant)
// where wider ones leave SMs idle (P = 2, 4: bands of 128 rows, 86 tiles of 128 x 192 at N = 8192)
// or, in one band of shared tiles, where the model gives 64-row ones (P = 8), as the plain GEMM
// takes them; above M = 256, and on the sweep's shapes, the tiles of before.
TEST(Config, ReduceScatterTakesOneWaveOf128x128AtSmallM) {
  GemmRsConfig rs;
  for (int world_size : {1, 2, 4, 8}) {
    for (int64_t n : {8192, 6144}) {
      const Problem p = make(256, n, n == 8192 ? 1024 : 768, world_size);
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
      EXPECT_EQ(rs.gemm.tile().block_m * 1000 + rs.gemm.tile().block_n, 128128) << p.to_string() << " -> " << rs.to_string();
      EXPECT_TRUE(fused_ops_take(rs.gemm.tile())) << rs.to_string();
      EXPECT_LE(rs.gemm.smem_bytes, size_t(h100().max_smem_per_block)) << rs.to_string();
      EXPECT_EQ(rs.shared_tiles, world_size == 8) << p.to_string() << " -> " << rs.to_string();
      EXPECT_LE(TileSchedule(schedule_shape(p, rs, 0)).num_tiles(), h100().num_sms) << rs.to_string();
    }
  }
  const std::pair<Problem, int> before[] = {
      {make(512, 8192, 1024, 8), 128256}, {make(512, 6144, 768, 8), 128192}, {make(2048, 1024, 1024, 8), 128192},
      {make(512, 1024, 2048, 4), 128192}, {make(128, 8192, 2048, 4), 64128}};
  for (const auto& [p, tile] : before) {
    ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
    EXPECT_EQ(rs.gemm.tile().block_m * 1000 + rs.gemm.tile().block_n, tile) << p.to_string() << " -> " << rs.to_string();
  }
}

// Tiles of one consumer (64 x 64, 64 x 192) and the 6-stage 128 x 128 ones are the plain GEMM's: its config
// takes the first where the time model says (M <= 64, and M <= 256 where 64 x 192 tiles make one
// wave) and 128 x 128 for one band of 129..256 rows in one wave otherwise (not at M = 128: half the
// CTAs of 64 x 128), overrides.block_n = 64 forces 64 x 64. Of the fused ops only the
// reduce-scatter's register epilogue takes the one-consumer tiles; the others take none of them (a
// forced 64 is an error naming it).
TEST(Config, PlainGemmOnlyTiles) {
  ConfigOverrides narrowest;
  narrowest.block_n = 64;
  GemmConfig g;
  ASSERT_TRUE(select_plain_gemm_config(make(8, 8192, 1024, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().consumers, 1) << g.to_string();
  EXPECT_NE(g.to_string().find("threads 256"), std::string::npos) << g.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(8, 8192, 3584, 1), h100(), narrowest, &g).ok());
  EXPECT_EQ(g.tile().block_n, 64) << g.to_string();
  EXPECT_EQ(g.split_k, 1) << g.to_string() << ": 128 tiles, no room for a second split";
  ASSERT_TRUE(select_plain_gemm_config(make(1000, 8192, 1024, 1), h100(), narrowest, &g).ok());
  EXPECT_EQ(g.tile().block_m, 128) << g.to_string() << ": a forced width applies to the heights that have it";
  ASSERT_TRUE(select_plain_gemm_config(make(256, 8192, 2048, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  EXPECT_FALSE(fused_ops_take(g.tile())) << g.to_string();
  // 64 x 192 (one consumer) where its tiles make one wave: as few bytes a CTA as 128 x 128.
  ASSERT_TRUE(select_plain_gemm_config(make(256, 6144, 2048, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 64192) << g.to_string();
  EXPECT_EQ(g.tile().consumers, 1) << g.to_string();
  EXPECT_FALSE(fused_ops_take(g.tile())) << g.to_string();
  for (const auto& [m, tile] : {std::pair<int64_t, int>{136, 64192}, {192, 64192}, {200, 128128}}) {
    ASSERT_TRUE(select_plain_gemm_config(make(m, 8192, 3584, 1), h100(), {}, &g).ok());
    EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, tile) << g.to_string();
  }
  // Never split on its own (one consumer adds the partials): 64 x 128 whole at M = 128 instead.
  ASSERT_TRUE(select_plain_gemm_config(make(128, 6144, 2048, 1), h100(), {}, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 64128) << g.to_string();
  ConfigOverrides wide_split;
  wide_split.block_n = 192;
  wide_split.split_k = 2;
  ASSERT_TRUE(select_plain_gemm_config(make(128, 6144, 2048, 1), h100(), wide_split, &g).ok());
  EXPECT_EQ(g.tile().block_m * 1000 + g.tile().block_n, 64192) << g.to_string() << ": forced, it splits";
  EXPECT_EQ(g.split_k, 2) << g.to_string();
  // Two waves of 128 x 128 tiles: the model's own choice.
  ASSERT_TRUE(select_plain_gemm_config(make(256, 16384, 1024, 1), h100(), {}, &g).ok());
  EXPECT_NE(g.tile().block_m * 1000 + g.tile().block_n, 128128) << g.to_string();
  for (int world_size : {1, 2, 8}) {
    for (int64_t m : {8, 32, 64, 512}) {
      const Problem p = make(m * world_size, 8192, 1024 * world_size, world_size);
      GemmRsConfig rs;
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), {}, &rs).ok()) << p.to_string();
      const bool registers = rs.register_epilogue;
      EXPECT_EQ(registers, world_size > 1 && m * world_size <= 64) << p.to_string() << " -> " << rs.to_string();
      EXPECT_TRUE(registers ? register_epilogue_takes(rs.gemm.tile()) : fused_ops_take(rs.gemm.tile()))
          << p.to_string() << " -> " << rs.to_string();
      const Status s = select_gemm_rs_config(p, h100(), narrowest, &rs);
      if (registers) {
        ASSERT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
        EXPECT_EQ(rs.gemm.tile().block_n, 64) << rs.to_string();
        EXPECT_EQ(rs.gemm.tile().consumers, 1) << rs.to_string();
      } else {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << p.to_string();
        EXPECT_NE(s.message().find("overrides.block_n = 64"), std::string::npos) << s.message();
      }
      // The staged epilogue, forced, keeps the two-consumer tiles.
      ConfigOverrides staged;
      staged.register_epilogue = 0;
      ASSERT_TRUE(select_gemm_rs_config(p, h100(), staged, &rs).ok()) << p.to_string();
      EXPECT_TRUE(fused_ops_take(rs.gemm.tile())) << p.to_string() << " -> " << rs.to_string();
    }
  }
}

// The plain GEMM weighs 64-row tiles for one band of up to 512 rows: the column-parallel shapes at
// M = 384-512 take them (in fewer splits than 128-row tiles needed) but where they would be 64 x 256
// at M = 512 (128 x 128 instead, OneBandOf512RowsOn128x128); the row-parallel ones at M = 512 keep
// 128-row tiles; the fused ops weigh them up to 256 rows only.
TEST(Config, PlainGemm64RowTilesUpTo512Rows) {
  GemmConfig g;
  for (const int64_t m : {384, 512}) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1024, 6144}, {1280, 8192}, {4096, 6144}}) {
      if (m == 512 && n != 1024) continue;
      ASSERT_TRUE(select_plain_gemm_config(make(m, n, k, 1), h100(), {}, &g).ok());
      EXPECT_EQ(g.tile().block_m, 64) << make(m, n, k, 1).to_string() << " -> " << g.to_string();
    }
  }
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8192, 1024}, {8192, 3584}, {6144, 768}, {6144, 2048}}) {
    ASSERT_TRUE(select_plain_gemm_config(make(512, n, k, 1), h100(), {}, &g).ok());
    EXPECT_EQ(g.tile().block_m, 128) << g.to_string();
  }
  GemmRsConfig rs;
  ASSERT_TRUE(select_gemm_rs_config(make(512, 1024, 6144, 1), h100(), {}, &rs).ok());
  EXPECT_EQ(rs.gemm.tile().block_m, 128) << rs.to_string();
}

// The swap-AB kernel: over at least half the SMs' worth of 64-column tiles, at M <= 16 or (M <= 64)
// K of 48 blocks or more, A's rows rounded up to a WGMMA's N; never past 64 rows; forced tiles or
// splits keep the tiled kernel unless swap_ab is forced too.
TEST(Config, SwapAbRows) {
  for (const auto& [m, rows] :
       {std::pair<int64_t, int>{1, 8}, {8, 8}, {9, 16}, {16, 16}, {24, 32}, {33, 64}, {64, 64}}) {
    EXPECT_EQ(swap_ab_rows(make(m, 8192, 3584, 1), h100(), {}), rows) << "m = " << m << ", 56 K blocks";
  }
  EXPECT_EQ(swap_ab_rows(make(65, 8192, 3584, 1), h100(), {}), 0);
  for (const int64_t k : {768, 1024, 2048}) {
    EXPECT_EQ(swap_ab_rows(make(16, 6144, k, 1), h100(), {}), 16) << "k = " << k;
    EXPECT_EQ(swap_ab_rows(make(17, 6144, k, 1), h100(), {}), 0) << "k = " << k << ": 12-32 K blocks";
    EXPECT_EQ(swap_ab_rows(make(64, 8192, k, 1), h100(), {}), 0) << "k = " << k;
  }
  EXPECT_EQ(swap_ab_rows(make(64, 8192, 3072, 1), h100(), {}), 64) << "48 K blocks";
  EXPECT_EQ(swap_ab_rows(make(8, 4224, 1024, 1), h100(), {}), 8) << "66 tiles: half the SMs";
  EXPECT_EQ(swap_ab_rows(make(8, 4160, 1024, 1), h100(), {}), 0) << "65 tiles";
  ConfigOverrides never, always, tiles, splits;
  never.swap_ab = 0;
  always.swap_ab = 1;
  tiles.block_n = 128;
  splits.split_k = 1;
  EXPECT_EQ(swap_ab_rows(make(8, 8192, 1024, 1), h100(), never), 0);
  EXPECT_EQ(swap_ab_rows(make(8, 264, 1024, 1), h100(), always), 8);
  EXPECT_EQ(swap_ab_rows(make(128, 8192, 1024, 1), h100(), always), 0);
  EXPECT_EQ(swap_ab_rows(make(8, 8192, 1024, 1), h100(), tiles), 0);
  EXPECT_EQ(swap_ab_rows(make(8, 8192, 1024, 1), h100(), splits), 0);
  ConfigOverrides bad;
  bad.swap_ab = 2;
  EXPECT_EQ(validate(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(validate(bad).message().find("overrides.swap_ab = 2"), std::string::npos);
}

// overrides.split_k: 1 never splits, S >= 2 splits in S (where that fits one wave of steps and the K
// blocks), else an error that names it; the reduce-scatter never splits.
TEST(Config, SplitKOverrides) {
  ConfigOverrides never, three, too_many, more_than_k;
  never.split_k = 1;
  three.split_k = 3;
  too_many.split_k = 5;     // 32 tiles x 5 = 160 steps on 132 SMs
  more_than_k.split_k = 3;  // 2 K blocks
  GemmConfig c;
  ASSERT_TRUE(select_plain_gemm_config(make(8, 8192, 1024, 1), h100(), never, &c).ok());
  EXPECT_EQ(c.split_k, 1) << c.to_string();
  ASSERT_TRUE(select_plain_gemm_config(make(8, 8192, 1024, 1), h100(), three, &c).ok());
  EXPECT_EQ(c.split_k, 3) << c.to_string();
  EXPECT_NE(c.to_string().find("split_k 3"), std::string::npos) << c.to_string();
  EXPECT_NE(three.to_string().find("split_k=3"), std::string::npos) << three.to_string();
  // M = 256: the config's own choice is 2 splits.
  ASSERT_TRUE(select_plain_gemm_config(make(256, 8192, 2048, 1), h100(), never, &c).ok());
  EXPECT_EQ(c.split_k, 1);
  for (const auto& [problem, overrides] : {std::pair<Problem, ConfigOverrides>{make(8, 8192, 1024, 1), too_many},
                                           {make(8, 8192, 128, 1), more_than_k}}) {
    const Status s = select_plain_gemm_config(problem, h100(), overrides, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << problem.to_string();
    EXPECT_NE(s.message().find("overrides.split_k = "), std::string::npos) << s.message();
  }
  // The reduce-scatter splits K only where its tiles are shared (8 rows per rank here); tiles of one
  // owner stay whole.
  GemmRsConfig rs;
  ASSERT_TRUE(select_gemm_rs_config(make(64, 8192, 8192, 8), h100(), three, &rs).ok());
  EXPECT_EQ(rs.gemm.split_k, 3) << rs.to_string();
  ASSERT_TRUE(select_gemm_rs_config(make(8192, 8192, 8192, 8), h100(), three, &rs).ok());
  EXPECT_EQ(rs.gemm.split_k, 1) << rs.to_string();
}

}  // namespace
}  // namespace tpfuse
