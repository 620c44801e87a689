// select_gemm_config: the chosen configs fit the device (shared memory, registers, WGMMA shapes),
// and unsupported devices get an error, not a config.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/config.h"
#include "plan/partial_rounds.h"
#include "tpfuse/problem.h"

namespace tpfuse {
namespace {

Problem make(int64_t m, int64_t n, int64_t k_total, int world_size) {
  Problem p;
  p.m = m;
  p.n = n;
  p.k_per_rank = k_total / world_size;
  p.world_size = world_size;
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

DeviceInfo h100() { return DeviceInfo{}; }  // the defaults: 132 SMs, 227 KiB opt-in shared memory, cc 9.0

// Registers: 65536 per SM for one CTA. With setmaxnreg the producer warpgroup drops to 40 per thread
// and the consumers get the rest, in multiples of 8.
int consumer_register_budget(const GemmConfig& c) {
  const int producer_threads = 128, producer_registers = 40;
  const int per_consumer = (65536 - producer_threads * producer_registers) / (128 * c.consumer_warpgroups);
  return per_consumer / 8 * 8;
}

void expect_fits(const GemmConfig& c, const DeviceInfo& device, const std::string& what) {
  EXPECT_LE(c.smem_bytes(), size_t(device.max_smem_per_block)) << what;
  EXPECT_EQ(c.threads(), 384) << what;
  EXPECT_EQ(c.block_k * 2, 128) << what << ": block_k must be one 128-byte swizzle row of BF16";
  EXPECT_EQ(c.block_m % 64, 0) << what;
  EXPECT_GT(c.block_n, 0) << what;
  EXPECT_LE(c.block_n, 256) << what << ": WGMMA's N is at most 256";
  EXPECT_EQ(c.block_n % 8, 0) << what;
  EXPECT_GE(c.stages, 2) << what;
  EXPECT_GE(c.group_rows, 1) << what;
  EXPECT_GE(c.own_lag, 0) << what;
  EXPECT_EQ(c.num_ctas, device.num_sms) << what << ": one persistent CTA per SM";
  // FP32 accumulators per consumer thread, plus headroom for fragments and addresses.
  const int accumulators = c.block_m * c.block_n / (128 * c.consumer_warpgroups);
  EXPECT_LE(accumulators + 64, consumer_register_budget(c)) << what;
  EXPECT_FALSE(c.to_string().empty()) << what;
}

TEST(Config, SweepShapesFitTheDevice) {
  for (int world_size : {1, 8}) {
    for (const Problem& p : sweep(world_size)) {
      GemmConfig c;
      const Status s = select_gemm_config(p, h100(), &c);
      ASSERT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
      expect_fits(c, h100(), p.to_string() + " -> " + c.to_string());
    }
  }
}

// A single wave of 128 x 256 tiles (M = 512, N = 8192: 128 tiles; at P = 8 its bands of two
// segments too) gets 4 stages, the epilogue staging 2 chunks at a time; with more waves (M = 2048:
// 512 tiles), or narrower tiles (N = 6144), the whole slab and 3 stages stay.
TEST(Config, OneWaveStagesInBatches) {
  GemmConfig c;
  for (const Problem& p : {make(512, 8192, 1024, 1), make(512, 8192, 8192, 8)}) {
    ASSERT_TRUE(select_gemm_config(p, h100(), &c).ok());
    EXPECT_EQ(c.staged_chunks, 2) << p.to_string() << " -> " << c.to_string();
    EXPECT_EQ(c.stages, 4) << p.to_string() << " -> " << c.to_string();
    EXPECT_LE(c.smem_bytes(), size_t(h100().max_smem_per_block)) << c.to_string();
  }
  for (const Problem& p : {make(2048, 8192, 1024, 1), make(32768, 8192, 3584, 1), make(512, 6144, 768, 1)}) {
    ASSERT_TRUE(select_gemm_config(p, h100(), &c).ok());
    EXPECT_EQ(c.staged_chunks, 0) << p.to_string() << " -> " << c.to_string();
  }
  ASSERT_TRUE(select_gemm_config(make(2048, 8192, 1024, 1), h100(), &c).ok());
  EXPECT_EQ(c.stages, 3) << c.to_string();
}

// Segments of 64 rows share 128-row tiles in pairs from P = 4 on; smaller ones, or at P = 2, get
// 64-row tiles; larger ones 128-row tiles of their own.
TEST(Config, SmallSegments) {
  GemmConfig c;
  for (int world_size : {4, 8}) {
    ASSERT_TRUE(select_gemm_config(make(64 * world_size, 8192, 8192, world_size), h100(), &c).ok());
    EXPECT_EQ(c.block_m, 128) << c.to_string();
    EXPECT_EQ(c.segments_per_tile, 2) << c.to_string();
  }
  for (const Problem& p : {make(128, 8192, 8192, 2), make(256, 8192, 8192, 8), make(64, 8192, 8192, 1)}) {
    ASSERT_TRUE(select_gemm_config(p, h100(), &c).ok());
    EXPECT_EQ(c.block_m, 64) << p.to_string() << " -> " << c.to_string();
    EXPECT_EQ(c.segments_per_tile, 1) << p.to_string() << " -> " << c.to_string();
  }
  ASSERT_TRUE(select_gemm_config(make(8192, 8192, 8192, 8), h100(), &c).ok());
  EXPECT_EQ(c.block_m, 128);
  EXPECT_EQ(c.segments_per_tile, 1);
}

// A rank's own tiles come about two waves of steps (2 x 132) behind the peers' tiles of the same
// rows where a band has at least twice as many tiles as that lag and K per rank is at most 4096,
// else last; the raster groups of the P segments a wave works on add up to 32 row tiles.
TEST(Config, ScheduleOfTheFusedOp) {
  for (int world_size : {2, 4, 8}) {
    GemmConfig c;
    ASSERT_TRUE(select_gemm_config(make(8192, 8192, 8192, world_size), h100(), &c).ok());
    EXPECT_EQ(c.own_lag, (2 * 132 + world_size - 1) / world_size) << "P=" << world_size;
    EXPECT_EQ(c.group_rows, 32 / world_size) << "P=" << world_size;
  }
  GemmConfig c;
  // M = 2048 at P = 8: 2 x 32 tiles a segment, under twice the lag of 33 rounds.
  ASSERT_TRUE(select_gemm_config(make(2048, 8192, 8192, 8), h100(), &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  // Deep tiles (K per rank 14336 at P = 2) keep their own tiles last.
  ASSERT_TRUE(select_gemm_config(make(8192, 8192, 28672, 2), h100(), &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  // Bands of two segments (M = 512 at P = 8): 32 tiles a band.
  ASSERT_TRUE(select_gemm_config(make(512, 8192, 8192, 8), h100(), &c).ok());
  EXPECT_EQ(c.own_lag, kOwnTilesLast);
  ASSERT_TRUE(select_gemm_config(make(8192, 8192, 8192, 1), h100(), &c).ok());
  EXPECT_EQ(c.group_rows, 32);
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
           Case{make(8192, 8192, 8192, 1), 0},    // no peers
           Case{make(512, 8192, 8192, 8), 0},     // bands of two segments: the partner pushes after its K loop
           Case{make(2048, 8192, 8192, 2), 0},    // own tiles last at P = 2
           Case{make(2048, 8192, 8192, 8), 6},    // own tiles last at P = 8
           Case{make(8192, 8192, 28672, 2), 0},   // own tiles last (deep tiles)
           Case{make(512, 8192, 4096, 4), 0},     // one wave, the slab staged in batches
       }) {
    GemmConfig c;
    ASSERT_TRUE(select_gemm_config(t.problem, h100(), &c).ok());
    EXPECT_EQ(c.partial_rounds, t.rounds) << t.problem.to_string() << " -> " << c.to_string();
    const int num_k_blocks = int((t.problem.k_per_rank + 63) / 64);
    const int rounds = c.partial_rounds;
    if (rounds > 0) {
      const int consumers = c.consumer_warpgroups;
      EXPECT_EQ(partial_round_k_block(consumers - 1, consumers, rounds - 1, rounds, num_k_blocks), num_k_blocks - 2)
          << c.to_string();
      EXPECT_GE(partial_round_k_block(0, consumers, 0, rounds, num_k_blocks), PartialRounds::kFirstAdd)
          << c.to_string();
      // Each consumer's rounds are spaced out, and the consumers take them at different K blocks.
      for (int r = 0; r < rounds; ++r) {
        const int kb = partial_round_k_block(0, consumers, r, rounds, num_k_blocks);
        EXPECT_LT(kb, partial_round_k_block(1, consumers, r, rounds, num_k_blocks));
        if (r + 1 < rounds) EXPECT_GE(partial_round_k_block(0, consumers, r + 1, rounds, num_k_blocks) - kb, 2);
      }
    }
  }
  static_assert(PartialRounds::kFirstAdd >= 1, "round 0 is asked for after K block 0");
}

TEST(Config, OddShapesGetAConfig) {
  for (const Problem& p : {make(8, 8, 64, 8), make(1000, 1000, 8000, 8), make(520, 264, 1032, 8), make(24, 8, 8, 1)}) {
    GemmConfig c;
    const Status s = select_gemm_config(p, h100(), &c);
    ASSERT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
    expect_fits(c, h100(), p.to_string());
  }
}

TEST(Config, NonHopperIsUnsupported) {
  for (const auto& cc : {std::pair<int, int>{8, 0}, {8, 9}, {10, 0}, {12, 0}}) {
    DeviceInfo device = h100();
    device.cc_major = cc.first;
    device.cc_minor = cc.second;
    GemmConfig c;
    c.block_m = -1;  // must stay untouched
    const Status s = select_gemm_config(make(2048, 8192, 8192, 8), device, &c);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << cc.first << "." << cc.second;
    EXPECT_NE(s.message().find(std::to_string(cc.first) + "." + std::to_string(cc.second)), std::string::npos)
        << s.message();
    EXPECT_EQ(c.block_m, -1);
  }
}

TEST(Config, LessSharedMemoryFewerStagesOrError) {
  DeviceInfo device = h100();
  device.max_smem_per_block = 200 * 1024;
  GemmConfig c;
  ASSERT_TRUE(select_gemm_config(make(8192, 8192, 8192, 8), device, &c).ok());
  expect_fits(c, device, c.to_string());

  device.max_smem_per_block = 64 * 1024;
  const Status s = select_gemm_config(make(8192, 8192, 8192, 8), device, &c);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("shared memory"), std::string::npos) << s.message();
}

TEST(Config, NullOutputIsAnError) {
  EXPECT_EQ(select_gemm_config(make(2048, 8192, 8192, 8), h100(), nullptr).code(), StatusCode::kInvalidArgument);
}

// Tile width follows the waves: 128 x 256 tiles of M=512, N=6144 are 96 tiles on 132 SMs (a third
// idle), 128 x 192 tiles are 128; at N=8192, 128 x 256 tiles already fill one wave.
TEST(Config, NarrowerTilesWhereTheLastWaveWouldIdle) {
  GemmConfig c;
  ASSERT_TRUE(select_gemm_config(make(512, 6144, 768, 1), h100(), &c).ok());
  EXPECT_EQ(c.block_n, 192) << c.to_string();
  ASSERT_TRUE(select_gemm_config(make(512, 8192, 1024, 1), h100(), &c).ok());
  EXPECT_EQ(c.block_n, 256) << c.to_string();
  ASSERT_TRUE(select_gemm_config(make(32768, 8192, 3584, 1), h100(), &c).ok());
  EXPECT_EQ(c.block_n, 256) << c.to_string();
  // 64 rows per rank at P = 8: bands of two segments, 4 x 24 tiles 256 wide, 4 x 32 tiles 192 wide.
  ASSERT_TRUE(select_gemm_config(make(512, 6144, 768 * 8, 8), h100(), &c).ok());
  EXPECT_EQ(c.block_n, 192) << c.to_string();
  ASSERT_TRUE(select_gemm_config(make(512, 8192, 1024 * 8, 8), h100(), &c).ok());
  EXPECT_EQ(c.block_n, 256) << c.to_string();
}

TEST(Config, SmemAccountsForEveryPart) {
  GemmConfig c;
  c.block_m = 128;
  c.block_n = 256;
  c.block_k = 64;
  c.stages = 3;
  c.consumer_warpgroups = 2;
  // 3 stages of (128 + 256) x 64 BF16, the whole 128 x 256 BF16 tile staged for the epilogue, 3 x 3
  // barriers (full, and empty per consumer) and 3 notes of 32 bytes for the stages, 2 hand-offs of
  // 40 bytes, 2 x 2 barriers of partial rounds and 2 more barriers; plus at most 2 KiB for aligning
  // the storage and the dynamic shared memory base to 1024 bytes.
  const size_t parts = size_t(3 * 384 * 64 * 2 + 128 * 256 * 2 + 9 * 8 + 3 * 32 + 2 * 40 + 4 * 8 + 2 * 8);
  EXPECT_GE(c.smem_bytes(), parts);
  EXPECT_LE(c.smem_bytes(), parts + 2048);
  // One stage more costs one stage's bytes.
  GemmConfig deeper = c;
  deeper.stages = 4;
  EXPECT_GE(deeper.smem_bytes(), c.smem_bytes() + size_t(384 * 64 * 2) - 1024);
  const std::string s = c.to_string();
  EXPECT_NE(s.find("128x256x64"), std::string::npos) << s;
  // Staged 2 chunks at a time, each consumer's buffers hold 2 x 64 x 64 BF16 instead of its slab.
  GemmConfig staged = deeper;
  staged.staged_chunks = 2;
  EXPECT_EQ(deeper.smem_bytes() - staged.smem_bytes(), size_t(128 * 256 * 2 - 2 * 2 * 64 * 64 * 2)) << staged.to_string();
}

}  // namespace
}  // namespace tpfuse
