// The fused GEMM + reduce-scatter with P ranks emulated on one GPU (real cross-rank stores and
// flags, all ranks' CTAs resident in one cooperative launch), and with one rank per GPU where there
// are several, all driven by this process.
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <utility>

#include "local_ranks.cuh"
#include "core/device_info.h"
#include "ops/gemm_rs/config.h"
#include "ops/sequence_rows.h"
#include "testing/emulated_ranks.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {
namespace {

// The reduce-scatter's ranks: A_r, W_r, bias_r and out_r of every rank, its calls, and the
// references computed from them. Leaves device 0 current. The bias goes into the calls where
// `with_bias` (each rank's own: a rank adds it to the rows it keeps).
struct ReduceScatterRanks : LocalRanks<Problem> {
  RankArrays a, w, bias, out;
  bool with_bias = false;

  explicit ReduceScatterRanks(const Problem& p, double timeout_s = 0, std::vector<int> rank_devices = {})
      : LocalRanks(p, timeout_s, std::move(rank_devices)),
        a(ranks_arrays(size_t(p.m) * p.k_per_rank)),
        w(ranks_arrays(size_t(p.k_per_rank) * p.n)),
        bias(ranks_arrays(size_t(p.n))),
        out(ranks_arrays(size_t(p.rows_per_rank()) * p.n)) {}

  void fill(bool exact, uint64_t seed) {
    on_each_rank([&](int r) {
      (exact ? fill_small_ints : fill_random)(a[r]->ptr, a[r]->count, seed * 1000 + 3 * r);
      (exact ? fill_small_ints : fill_random)(w[r]->ptr, w[r]->count, seed * 1000 + 3 * r + 1);
      (exact ? fill_small_ints : fill_random)(bias[r]->ptr, bias[r]->count, seed * 1000 + 3 * r + 2);
      poison(out[r]->ptr, out[r]->count);
    });
  }

  void poison_outputs() {
    on_each_rank([&](int r) { poison(out[r]->ptr, out[r]->count); });
  }

  // Every rank, emulated where they share a device (testing/emulated_ranks.h).
  Status run(const Problem& p, const ConfigOverrides& overrides = {}) { return run_first(p.world_size, p, overrides); }

  // Launches ranks 0 .. count-1 only: the others never run (a missing peer).
  Status run_first(int count, const Problem& p, const ConfigOverrides& overrides = {}) {
    const auto ap = pointers<const void*>(a, count), wp = pointers<const void*>(w, count);
    const auto bp = pointers<const void*>(bias, count);
    const auto op = pointers<void*>(out, count);
    return launch_gemm_rs(comm, p, first_ranks(count), ap.data(), wp.data(), with_bias ? bp.data() : nullptr,
                          op.data(), streams.data(), overrides);
  }

  // Rank d's bias as FP32, or none without `with_bias`.
  std::vector<float> bias_of(int d) {
    std::vector<float> values;
    if (!with_bias) return values;
    cudaSetDevice(devices[d]);
    for (const __nv_bfloat16 b : bias[d]->to_host()) values.push_back(__bfloat162float(b));
    cudaSetDevice(0);
    return values;
  }

  // Every rank's FP32 partial (m x n), computed on its device.
  std::vector<std::vector<float>> partials(const Problem& p) {
    std::vector<std::vector<float>> result;
    on_each_rank([&](int r) {
      DeviceArray<float> ref(size_t(p.m) * p.n);
      reference_gemm(p, a[r]->ptr, w[r]->ptr, ref.ptr);
      result.push_back(ref.to_host());
    });
    return result;
  }
};

// Rank d's rows (ops/sequence_rows.h: its shard of every sequence) of the sum of the partials, each
// partial first rounded to BF16 when `round` (the unfused path on one GPU: cuBLAS's BF16 partials
// summed in FP32), exact FP32 products otherwise; plus `bias` (n entries) where not empty.
std::vector<float> reduce_rows(const std::vector<std::vector<float>>& partials, const Problem& p, int d, bool round,
                               const std::vector<float>& bias = {}) {
  const int64_t rows = p.rows_per_rank();
  const SequenceRows sequences(p.batch, rows, p.world_size);
  std::vector<float> sum(size_t(rows) * p.n, 0.0f);
  for (const auto& partial : partials) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* from = partial.data() + size_t(sequences.row_of(d, int(row))) * p.n;
      for (int64_t col = 0; col < p.n; ++col) {
        const float v = from[col];
        sum[size_t(row) * p.n + col] += round ? __bfloat162float(__float2bfloat16(v)) : v;
      }
    }
  }
  for (size_t i = 0; i < sum.size() && !bias.empty(); ++i) sum[i] += bias[i % p.n];
  return sum;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

// The unfused path's rank d rows: the BF16 partials reduced and rounded (as NCCL's BF16
// reduce-scatter would hold them), then the bias added to that BF16 sum and rounded again.
std::vector<__nv_bfloat16> unfused_rows(const std::vector<std::vector<float>>& partials, const Problem& p, int d,
                                        const std::vector<float>& bias) {
  std::vector<float> sum = reduce_rows(partials, p, d, /*round=*/true);
  if (bias.empty()) return to_bf16(sum);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = __bfloat162float(__float2bfloat16(sum[i])) + bias[i % p.n];
  return to_bf16(sum);
}

// Exact mode (small integers: every partial and total exact in BF16): bit for bit.
void expect_bit_for_bit(ReduceScatterRanks& ranks, const Problem& problem, const ConfigOverrides& overrides = {}) {
  ranks.fill(/*exact=*/true, 1);
  const Status s = ranks.run(problem, overrides);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(ranks.synchronize());
  ASSERT_TRUE(communicator_status(ranks.comm).ok());
  const auto partials = ranks.partials(problem);
  for (int d = 0; d < problem.world_size; ++d) {
    const int64_t bad =
        first_mismatch(ranks.out[d]->to_host(), reduce_rows(partials, problem, d, false, ranks.bias_of(d)));
    EXPECT_EQ(bad, -1) << "rank " << d << ": first mismatch at " << element_at(bad, problem.n);
  }
}

// One shape of the emulated-rank tests, with the own tiles' lag (-1: the config's; 0: own tiles
// inside the rounds from the first ones, which the tests' small shapes never get by themselves),
// the sequences its rows hold, and whether the call adds a bias.
struct FusedCase {
  int p, m, n, k;
  WeightLayout layout;
  int own_lag = -1;
  int split_k = 0;  // splits of K with shared tiles; 0: the config's
  int batch = 1;
  bool bias = false;

  Problem problem() const {
    Problem problem{m, n, k, p, layout};
    problem.batch = batch;
    return problem;
  }
  ConfigOverrides overrides() const {
    ConfigOverrides o;
    o.own_lag = own_lag;
    o.split_k = split_k;
    return o;
  }
};

std::string case_name(const ::testing::TestParamInfo<FusedCase>& info) {
  const FusedCase& c = info.param;
  return "P" + std::to_string(c.p) + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
         std::to_string(c.k) + "_" + to_string(c.layout) + (c.own_lag >= 0 ? "_lag" + std::to_string(c.own_lag) : "") +
         (c.split_k > 0 ? "_split" + std::to_string(c.split_k) : "") +
         (c.batch > 1 ? "_batch" + std::to_string(c.batch) : "") + (c.bias ? "_bias" : "");
}

class FusedExact : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedExact, BitForBit) {
  const Problem problem = GetParam().problem();
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.with_bias = GetParam().bias;
  expect_bit_for_bit(ranks, problem, GetParam().overrides());
}

// K per rank 256 / P: |partial| <= K and |sum| <= P K = 256, exact in BF16.
INSTANTIATE_TEST_SUITE_P(Shapes, FusedExact,
                         ::testing::Values(FusedCase{1, 256, 512, 256, WeightLayout::kNxK},
                                           FusedCase{2, 512, 776, 128, WeightLayout::kKxN},
                                           FusedCase{2, 512, 776, 128, WeightLayout::kKxN, 0},
                                           FusedCase{4, 1000, 1024, 64, WeightLayout::kNxK},
                                           FusedCase{4, 1000, 1024, 64, WeightLayout::kNxK, 0},
                                           // One wave of 128 x 256 tiles (4 stages, slabs staged in halves).
                                           FusedCase{8, 512, 8192, 32, WeightLayout::kKxN},
                                           FusedCase{8, 512, 8192, 32, WeightLayout::kNxK},
                                           FusedCase{8, 2048, 1000, 32, WeightLayout::kNxK},
                                           FusedCase{8, 2048, 1000, 32, WeightLayout::kNxK, 0},
                                           // Segments shorter than a slab: one band, tiles of several owners'
                                           // rows (1, 2, 4, 8 rows per rank from registers, 32 staged; 24, 25
                                           // and 63 rows, which do not divide a slab, keep tiles of their own).
                                           FusedCase{8, 64, 264, 32, WeightLayout::kKxN},
                                           FusedCase{8, 8, 512, 32, WeightLayout::kNxK},
                                           FusedCase{4, 8, 264, 64, WeightLayout::kKxN},
                                           FusedCase{2, 8, 520, 128, WeightLayout::kNxK},
                                           FusedCase{8, 64, 8192, 32, WeightLayout::kNxK},
                                           FusedCase{2, 64, 520, 128, WeightLayout::kNxK},
                                           FusedCase{4, 128, 1000, 64, WeightLayout::kKxN},
                                           FusedCase{8, 256, 8192, 32, WeightLayout::kKxN},
                                           // ... and K split over two CTAs (K blocks 0 and 1), staged and from
                                           // registers.
                                           FusedCase{4, 128, 520, 128, WeightLayout::kKxN, -1, 2},
                                           FusedCase{2, 64, 520, 128, WeightLayout::kKxN, -1, 2},
                                           FusedCase{4, 32, 520, 128, WeightLayout::kKxN, -1, 2},
                                           FusedCase{8, 192, 1000, 32, WeightLayout::kKxN},
                                           FusedCase{4, 100, 776, 64, WeightLayout::kNxK},
                                           FusedCase{2, 126, 520, 128, WeightLayout::kKxN},
                                           // 64 rows per rank: 128-row tiles over two ranks' rows
                                           FusedCase{4, 256, 1000, 64, WeightLayout::kKxN},
                                           FusedCase{4, 256, 1000, 64, WeightLayout::kKxN, 0},
                                           // M = 256 at P = 2: bands of 128 rows on 128 x 128 tiles
                                           FusedCase{2, 256, 1000, 128, WeightLayout::kNxK},
                                           // Sequences (ops/sequence_rows.h): shards of 128 rows; of 64 and
                                           // 192, on 64-row tiles (a tile inside one shard); own tiles in
                                           // the rounds.
                                           FusedCase{2, 1024, 776, 128, WeightLayout::kKxN, -1, 0, 4},
                                           FusedCase{4, 1024, 1000, 64, WeightLayout::kNxK, -1, 0, 4},
                                           FusedCase{4, 1024, 1000, 64, WeightLayout::kNxK, 0, 0, 4},
                                           FusedCase{8, 3072, 1000, 32, WeightLayout::kKxN, -1, 0, 2},
                                           FusedCase{8, 3072, 1000, 32, WeightLayout::kNxK, 0, 0, 2},
                                           FusedCase{1, 384, 512, 256, WeightLayout::kNxK, -1, 0, 3},
                                           // A bias, on every epilogue: tiles of one owner, bands of two,
                                           // shared tiles staged (32 rows a rank) and from registers (8, 1),
                                           // split K, one rank, sequences.
                                           FusedCase{4, 1000, 1024, 64, WeightLayout::kNxK, -1, 0, 1, true},
                                           FusedCase{2, 512, 776, 128, WeightLayout::kKxN, 0, 0, 1, true},
                                           FusedCase{4, 256, 1000, 64, WeightLayout::kKxN, -1, 0, 1, true},
                                           FusedCase{8, 256, 8192, 32, WeightLayout::kKxN, -1, 0, 1, true},
                                           FusedCase{8, 64, 264, 32, WeightLayout::kKxN, -1, 0, 1, true},
                                           FusedCase{8, 8, 512, 32, WeightLayout::kNxK, -1, 0, 1, true},
                                           FusedCase{4, 128, 520, 128, WeightLayout::kKxN, -1, 2, 1, true},
                                           FusedCase{2, 64, 520, 128, WeightLayout::kKxN, -1, 2, 1, true},
                                           FusedCase{1, 256, 512, 256, WeightLayout::kNxK, -1, 0, 1, true},
                                           FusedCase{4, 1024, 1000, 64, WeightLayout::kNxK, -1, 0, 4, true}),
                         case_name);

// Random mode: within 1.1x of the unfused path's error (BF16 partials summed in FP32), deterministic.
void expect_within_unfused_error_and_deterministic(ReduceScatterRanks& ranks, const Problem& problem,
                                                   const ConfigOverrides& overrides = {}) {
  const int p = problem.world_size;
  ranks.fill(/*exact=*/false, 7);
  ASSERT_TRUE(ranks.run(problem, overrides).ok());
  ASSERT_CUDA(ranks.synchronize());
  const auto partials = ranks.partials(problem);
  // docs/SPEC.md's errors are over the whole output: every rank's rows together.
  std::vector<std::vector<__nv_bfloat16>> first;
  ErrorSums fused, unfused;
  for (int d = 0; d < p; ++d) {
    first.push_back(ranks.out[d]->to_host());
    const std::vector<float> bias = ranks.bias_of(d);
    const auto ref = reduce_rows(partials, problem, d, false, bias);
    fused.merge(error_sums(first.back(), ref));
    unfused.merge(error_sums(unfused_rows(partials, problem, d, bias), ref));
  }
  EXPECT_EQ(fused.num_nonfinite, 0u) << "unwritten or non-finite outputs";
  EXPECT_TRUE(within_tolerance(fused.stats(), unfused.stats()))
      << "fused " << fused.stats().max_rel << " / " << fused.stats().norm_rel << ", unfused "
      << unfused.stats().max_rel << " / " << unfused.stats().norm_rel;
  // The same inputs again (the other parity of the buffers): bit-identical outputs.
  ranks.poison_outputs();
  ASSERT_TRUE(ranks.run(problem, overrides).ok());
  ASSERT_CUDA(ranks.synchronize());
  for (int d = 0; d < p; ++d) {
    const auto again = ranks.out[d]->to_host();
    EXPECT_EQ(0, std::memcmp(again.data(), first[d].data(), again.size() * 2)) << "rank " << d << " not deterministic";
  }
}

class FusedRandom : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedRandom, WithinUnfusedErrorAndDeterministic) {
  const Problem problem = GetParam().problem();
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.with_bias = GetParam().bias;
  expect_within_unfused_error_and_deterministic(ranks, problem, GetParam().overrides());
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedRandom,
                         ::testing::Values(FusedCase{8, 2048, 8192, 1024, WeightLayout::kKxN},
                                           FusedCase{8, 512, 6144, 768, WeightLayout::kNxK},
                                           FusedCase{4, 1000, 2056, 520, WeightLayout::kKxN},
                                           FusedCase{2, 4096, 1024, 2048, WeightLayout::kNxK},
                                           // Own tiles interleaved: 2 of the 7 peers' partials in
                                           // rounds during the K loop (ops/gemm_rs/partial_rounds.h).
                                           FusedCase{8, 8192, 4096, 512, WeightLayout::kNxK},
                                           // Small, for the sanitizers: own tiles in the rounds, one round.
                                           FusedCase{2, 512, 512, 320, WeightLayout::kKxN, 0},
                                           // Decode-sized M: tiles of several owners' rows, K whole or split
                                           // (the config's own splits at 2048, forced ones: 4 do not fit the
                                           // 16 CTAs of an emulated rank and fall back to whole K; 8 rows of
                                           // a 64-row tile, the last column tile clipped).
                                           FusedCase{8, 64, 8192, 1024, WeightLayout::kNxK},
                                           FusedCase{4, 96, 6144, 768, WeightLayout::kKxN},
                                           FusedCase{4, 32, 1000, 2048, WeightLayout::kKxN},
                                           FusedCase{8, 64, 8192, 1024, WeightLayout::kNxK, -1, 4},
                                           FusedCase{8, 8, 1000, 640, WeightLayout::kKxN, -1, 3},
                                           // Sequences, with and without a bias (shards of 512 and 192 rows).
                                           FusedCase{8, 8192, 4096, 512, WeightLayout::kNxK, -1, 0, 2},
                                           FusedCase{8, 6144, 4096, 512, WeightLayout::kNxK, -1, 0, 4, true},
                                           FusedCase{8, 2048, 8192, 1024, WeightLayout::kKxN, -1, 0, 1, true},
                                           FusedCase{8, 64, 8192, 1024, WeightLayout::kNxK, -1, 0, 1, true}),
                         case_name);

// Rows in sequences against the same rows split as one sequence: A's rows permuted so that rank
// d's shards come together (what a movedim would make) give the same segments, tiles and sums, so
// every rank's rows are bit-identical, on random inputs (shards of whole 128-row tiles: the same
// config; other shards take 64-row tiles, checked by FusedExact and FusedRandom).
TEST(FusedSequences, BitIdenticalToOneSequenceOfTheSameRows) {
  for (const auto& [world_size, sequences_of_rows, shard] :
       {std::tuple{2, 4, 128}, std::tuple{8, 2, 256}, std::tuple{4, 3, 128}}) {
    const int p = world_size, batch = sequences_of_rows;  // captured by the lambdas below
    Problem problem{int64_t(batch) * p * shard, 1000, 256, p, WeightLayout::kNxK};
    problem.batch = batch;
    ReduceScatterRanks ranks(problem);
    ASSERT_NE(ranks.comm, nullptr);
    ranks.fill(/*exact=*/false, 23);
    ASSERT_TRUE(ranks.run(problem).ok());
    ASSERT_CUDA(ranks.synchronize());
    std::vector<std::vector<__nv_bfloat16>> batched;
    for (int d = 0; d < p; ++d) batched.push_back(ranks.out[d]->to_host());
    // Owner d's segment of the batched rows is rows [d * rows_per_rank, ...) of the permuted A.
    const SequenceRows sequences(batch, problem.rows_per_rank(), p);
    ranks.on_each_rank([&](int r) {
      const std::vector<__nv_bfloat16> a = ranks.a[r]->to_host();
      std::vector<__nv_bfloat16> permuted(a.size());
      const size_t k = size_t(problem.k_per_rank);
      for (int d = 0; d < p; ++d) {
        for (int64_t row = 0; row < problem.rows_per_rank(); ++row) {
          std::memcpy(&permuted[(d * problem.rows_per_rank() + row) * k], &a[sequences.row_of(d, int(row)) * k], k * 2);
        }
      }
      ASSERT_CUDA(cudaMemcpy(ranks.a[r]->ptr, permuted.data(), permuted.size() * 2, cudaMemcpyHostToDevice));
    });
    ranks.poison_outputs();
    Problem one = problem;
    one.batch = 1;
    ASSERT_TRUE(ranks.run(one).ok());
    ASSERT_CUDA(ranks.synchronize());
    ASSERT_TRUE(communicator_status(ranks.comm).ok());
    for (int d = 0; d < p; ++d) {
      const auto plain = ranks.out[d]->to_host();
      EXPECT_EQ(0, std::memcmp(plain.data(), batched[d].data(), plain.size() * 2))
          << "P " << p << ", batch " << batch << ", rank " << d;
    }
  }
}

// Shards that are not whole slabs: refused, naming the shard, before anything runs.
TEST(FusedSequences, ShardsOfPartialSlabsAreRefused) {
  Problem problem{2 * 4 * 96, 512, 64, 4, WeightLayout::kNxK};
  problem.batch = 2;
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  const Status s = ranks.run(problem);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("is 96 rows"), std::string::npos) << s.message();
}

// Tiles of several owners' rows against tiles of one (the same 64 x 256 tiles either way, and no
// partials added during the K loop, so every element takes the same products and the same
// additions): bit-identical on random inputs.
TEST(FusedSharedTiles, BitIdenticalToTilesOfOneOwner) {
  for (int p : {2, 4, 8}) {
    const Problem problem{8 * p, 2048, 512, p, WeightLayout::kNxK};
    ReduceScatterRanks ranks(problem);
    ASSERT_NE(ranks.comm, nullptr);
    ranks.fill(/*exact=*/false, 11);
    ConfigOverrides separate;
    separate.shared_tiles = 0;
    separate.partial_rounds = 0;
    ASSERT_TRUE(ranks.run(problem, separate).ok());
    ASSERT_CUDA(ranks.synchronize());
    std::vector<std::vector<__nv_bfloat16>> expected;
    for (int d = 0; d < p; ++d) expected.push_back(ranks.out[d]->to_host());
    ranks.poison_outputs();
    ConfigOverrides whole_k;
    whole_k.split_k = 1;
    ASSERT_TRUE(ranks.run(problem, whole_k).ok());
    ASSERT_CUDA(ranks.synchronize());
    ASSERT_TRUE(communicator_status(ranks.comm).ok());
    for (int d = 0; d < p; ++d) {
      const auto shared = ranks.out[d]->to_host();
      EXPECT_EQ(0, std::memcmp(shared.data(), expected[d].data(), shared.size() * 2)) << "P " << p << ", rank " << d;
    }
  }
}

// The two epilogues of shared tiles, staged and from registers, each forced at 1 to 32 rows a
// rank (the register epilogue spreads 1, 2 and 4 rows over a warp's lanes, adds 8 and 32 where
// they are held), with K whole and split: bit-identical on random inputs (the same partials, added
// in the same order). With K whole each takes its config's tiles (the register epilogue's one-consumer
// tiles are another width); split, both take 64 x 128 tiles, whose splits fit the emulated ranks'
// CTAs alike (where they do not, a launch splits less).
TEST(FusedSharedTiles, RegisterEpilogueBitIdenticalToStaged) {
  for (int p : {2, 4, 8}) {
    for (int rows : {1, 2, 4, 8, 32}) {
      for (int split_k : {1, 2}) {
        const Problem problem{rows * p, 1000, 256, p, WeightLayout::kKxN};
        ReduceScatterRanks ranks(problem);
        ASSERT_NE(ranks.comm, nullptr);
        ranks.fill(/*exact=*/false, 19);
        std::vector<std::vector<__nv_bfloat16>> outputs[2];
        for (int registers : {0, 1}) {
          ConfigOverrides o;
          o.split_k = split_k;
          if (split_k > 1) o.block_n = 128;
          o.register_epilogue = registers;
          // The override reaches the config: the two runs take different epilogues.
          DeviceInfo device;
          ASSERT_TRUE(current_device_info(&device).ok());
          GemmRsConfig config;
          ASSERT_TRUE(select_gemm_rs_config(problem, device, o, &config).ok());
          ASSERT_TRUE(config.shared_tiles) << config.to_string();
          ASSERT_EQ(config.register_epilogue, registers == 1) << config.to_string();
          ranks.poison_outputs();
          ASSERT_TRUE(ranks.run(problem, o).ok());
          ASSERT_CUDA(ranks.synchronize());
          ASSERT_TRUE(communicator_status(ranks.comm).ok());
          for (int d = 0; d < p; ++d) {
            outputs[registers].push_back(ranks.out[d]->to_host());
            // Every element written (the poison is a NaN; random inputs make none).
            const auto& out = outputs[registers].back();
            const size_t unwritten = size_t(std::count_if(out.begin(), out.end(), [](__nv_bfloat16 x) {
              return std::isnan(__bfloat162float(x));
            }));
            EXPECT_EQ(unwritten, 0u) << "P " << p << ", rank " << d << ", registers " << registers;
          }
        }
        for (int d = 0; d < p; ++d) {
          EXPECT_EQ(0, std::memcmp(outputs[0][d].data(), outputs[1][d].data(), outputs[0][d].size() * 2))
              << "P " << p << ", " << rows << " rows a rank, split " << split_k << ", rank " << d;
        }
      }
    }
  }
}

// Back-to-back calls with random m (exact inputs), no host synchronization between them; every
// 50th is checked.
void expect_back_to_back_correct(ReduceScatterRanks& ranks, const Problem& max_problem, int calls) {
  const int p = max_problem.world_size;
  ranks.fill(/*exact=*/true, 3);
  std::mt19937 rng(42);
  for (int call = 0; call < calls; ++call) {
    const int m = p * int(1 + rng() % (max_problem.m / p));
    const Problem problem{m, max_problem.n, max_problem.k_per_rank, p, max_problem.weight_layout};
    const bool check = call % 50 == 49;
    if (check) ranks.poison_outputs();
    ASSERT_TRUE(ranks.run(problem).ok()) << "call " << call;
    if (!check) continue;
    ASSERT_CUDA(ranks.synchronize());
    ASSERT_TRUE(communicator_status(ranks.comm).ok());
    const auto partials = ranks.partials(problem);
    for (int d = 0; d < p; ++d) {
      auto out = ranks.out[d]->to_host();
      out.resize(size_t(problem.rows_per_rank()) * problem.n);
      const int64_t bad = first_mismatch(out, reduce_rows(partials, problem, d, false));
      ASSERT_EQ(bad, -1) << "call " << call << " (m = " << m << "), rank " << d << ": first mismatch at row "
                         << bad / problem.n << ", column " << bad % problem.n;
    }
  }
}

// Split K's counters go back to 0 at the end of every call: 200 calls back to back (both parities,
// no host synchronization), the last one checked bit for bit.
// Both shared-tile epilogues: 32 rows a rank (staged) and 8 (from registers).
TEST(FusedSharedTiles, SplitKBackToBack) {
  for (int m : {64, 16}) {
    const Problem problem{m, 520, 128, 2, WeightLayout::kNxK};
    ReduceScatterRanks ranks(problem);
    ASSERT_NE(ranks.comm, nullptr);
    ConfigOverrides split;
    split.split_k = 2;
    ranks.fill(/*exact=*/true, 13);
    for (int call = 0; call < 199; ++call) ASSERT_TRUE(ranks.run(problem, split).ok()) << "M " << m << ", call " << call;
    expect_bit_for_bit(ranks, problem, split);
  }
}

TEST(FusedStress, ThousandCallsBackToBack) {
  const Problem max_problem{2048, 1024, 32, 8, WeightLayout::kNxK};
  ReduceScatterRanks ranks(max_problem);
  ASSERT_NE(ranks.comm, nullptr);
  expect_back_to_back_correct(ranks, max_problem, 1000);
}

// One rank per GPU (the largest power of two of the visible GPUs, at most 8), one process driving
// them all: the checks above across real peers.
class FusedAcrossGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    ASSERT_CUDA(cudaGetDeviceCount(&count));
    int p = 1;
    while (p * 2 <= count && p * 2 <= 8) p *= 2;
    if (p < 2) GTEST_SKIP() << "one rank per GPU needs 2 or more GPUs (" << count << " visible)";
    for (int d = 0; d < p; ++d) devices_.push_back(d);
  }
  std::vector<int> devices_;
};

TEST_F(FusedAcrossGpus, BitForBit) {
  const int p = int(devices_.size());
  const Problem problem{512 * p, 776, 256 / p, p, WeightLayout::kKxN};
  ReduceScatterRanks ranks(problem, 0, devices_);
  ASSERT_NE(ranks.comm, nullptr);
  expect_bit_for_bit(ranks, problem);
}

TEST_F(FusedAcrossGpus, WithinUnfusedErrorAndDeterministic) {
  const int p = int(devices_.size());
  const Problem problem{2048, 8192, 1024, p, WeightLayout::kNxK};
  ReduceScatterRanks ranks(problem, 0, devices_);
  ASSERT_NE(ranks.comm, nullptr);
  expect_within_unfused_error_and_deterministic(ranks, problem);
}

TEST_F(FusedAcrossGpus, BackToBack) {
  const int p = int(devices_.size());
  const Problem max_problem{2048, 1024, 32, p, WeightLayout::kKxN};
  ReduceScatterRanks ranks(max_problem, 0, devices_);
  ASSERT_NE(ranks.comm, nullptr);
  expect_back_to_back_correct(ranks, max_problem, 1000);
}

// Calls captured once in a CUDA graph and replayed: the epoch lives on the device, not in the graph.
TEST(FusedGraph, ReplaysStayCorrect) {
  const Problem problem{1024, 512, 32, 4, WeightLayout::kKxN};
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ranks.streams.assign(problem.world_size, stream);
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status s = ranks.run(problem);
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(s.ok()) << s.to_string();
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 5; ++replay) {
    ranks.fill(/*exact=*/true, 100 + replay);
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    const auto partials = ranks.partials(problem);
    for (int d = 0; d < problem.world_size; ++d) {
      EXPECT_EQ(first_mismatch(ranks.out[d]->to_host(), reduce_rows(partials, problem, d, false)), -1)
          << "replay " << replay << ", rank " << d;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A rank that never launches: its peers must fail with kPeerTimeout within the timeout, not hang.
// With 64 rows per rank the missing rank 3 is also rank 2's partner in 128-row tiles; with 8 every
// tile holds rows of all four.
class FusedMissingPeer : public ::testing::TestWithParam<int> {};

TEST_P(FusedMissingPeer, TimesOut) {
  const Problem problem{GetParam(), 1024, 64, 4, WeightLayout::kNxK};
  ReduceScatterRanks ranks(problem, /*timeout_s=*/0.2);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(false, 5);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(ranks.run_first(3, problem).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Status s = communicator_status(ranks.comm);
  EXPECT_EQ(s.code(), StatusCode::kPeerTimeout) << s.to_string();
  EXPECT_NE(s.message().find("for rank 3"), std::string::npos) << s.message();
  EXPECT_LT(seconds, 5.0) << "the timeout is 0.2 s";
  // Later calls report the failure instead of running.
  EXPECT_EQ(ranks.run(problem).code(), StatusCode::kPeerTimeout);
}

// With split K, a call that times out still leaves the split workspace's counters at 0: the plain
// GEMM that splits next on the same stream (the same workspace) is bit for bit right.
TEST(FusedSplitK, MissingPeerLeavesTheCountersAtZero) {
  const Problem problem{32, 1024, 128, 4, WeightLayout::kNxK};
  ReduceScatterRanks ranks(problem, /*timeout_s=*/0.2);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 17);
  ConfigOverrides split;
  split.split_k = 2;
  ASSERT_TRUE(ranks.run_first(3, problem, split).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(communicator_status(ranks.comm).code(), StatusCode::kPeerTimeout);
  const Problem plain{problem.m, problem.n, problem.k_per_rank, 1, problem.weight_layout};
  DeviceArray<__nv_bfloat16> c(size_t(plain.m) * plain.n);
  poison(c.ptr, c.count);
  const Status s = gemm(plain, ranks.a[0]->ptr, ranks.w[0]->ptr, c.ptr, ranks.streams[0], split);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(cudaDeviceSynchronize());
  DeviceArray<float> ref(size_t(plain.m) * plain.n);
  reference_gemm(plain, ranks.a[0]->ptr, ranks.w[0]->ptr, ref.ptr);
  const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
  EXPECT_EQ(bad, -1) << "first mismatch at " << element_at(bad, plain.n);
}

// Tiles of one owner's rows, bands of two, shared tiles staged (32 rows a rank) and from registers (8).
INSTANTIATE_TEST_SUITE_P(RowsPerRank, FusedMissingPeer, ::testing::Values(1024, 256, 128, 32),
                         [](const auto& info) { return "M" + std::to_string(info.param); });

TEST(FusedErrors, BadCallsAreReported) {
  const Problem problem{512, 512, 64, 4, WeightLayout::kNxK};
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  Problem wrong = problem;
  wrong.world_size = 2;
  const Status other_size = ranks.run(wrong);
  EXPECT_EQ(other_size.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other_size.message().find("differs from the communicator's 4 ranks"), std::string::npos)
      << other_size.message();
  wrong = problem;
  wrong.m = 1024;
  const Status too_big = ranks.run(wrong);
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("max_m"), std::string::npos) << too_big.message();
  std::vector<const void*> a(4, nullptr), w(4, ranks.w[0]->ptr);
  std::vector<void*> out(4, ranks.out[0]->ptr);
  const Status null_a =
      gemm_reduce_scatter_local(ranks.comm, problem, a.data(), w.data(), nullptr, out.data(), ranks.streams.data());
  EXPECT_EQ(null_a.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_a.message().find("a must not be null"), std::string::npos) << null_a.message();
  ConfigOverrides bad_lag;
  bad_lag.own_lag = -3;
  const Status bad_override = ranks.run(problem, bad_lag);
  EXPECT_EQ(bad_override.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_override.message().find("overrides.own_lag = -3"), std::string::npos) << bad_override.message();
  EXPECT_EQ(
      gemm_reduce_scatter(ranks.comm, problem, ranks.a[0]->ptr, ranks.w[0]->ptr, nullptr, ranks.out[0]->ptr, nullptr)
          .code(),
      StatusCode::kInvalidArgument)
      << "a local communicator of 4 ranks needs gemm_reduce_scatter_local";
}

// The push timeline (ops/gemm_rs/push_timeline.h) is recorded by kernels of the testing library's
// own: a recorded call at P = 1 stores the same output, bit for bit, as the library's kernel, and
// records every store of its rows into that output (whole 64-column boxes here) between the call's
// start and end. Emulated ranks are not compiled to record: refused by name.
TEST(FusedPushTimeline, RecordsTheCallWithTheSameOutput) {
  const Problem problem{512, 1024, 256, 1, WeightLayout::kNxK};
  ReduceScatterRanks ranks(problem);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/false, 17);
  ASSERT_TRUE(ranks.run(problem).ok());
  ASSERT_CUDA(ranks.synchronize());
  const std::vector<__nv_bfloat16> expected = ranks.out[0]->to_host();
  ranks.poison_outputs();

  constexpr unsigned int kCapacity = 4096;
  DeviceArray<PushEvent> events(kCapacity);
  DeviceArray<PushTimeline> header(1);
  PushTimeline timeline{~0ull, 0, 0, kCapacity, events.ptr};
  ASSERT_CUDA(cudaMemcpy(header.ptr, &timeline, sizeof(timeline), cudaMemcpyHostToDevice));
  const void* a = ranks.a[0]->ptr;
  const void* w = ranks.w[0]->ptr;
  void* out = ranks.out[0]->ptr;
  ASSERT_TRUE(launch_gemm_rs(ranks.comm, problem, {0}, &a, &w, nullptr, &out, ranks.streams.data(), {}, header.ptr)
                  .ok());
  ASSERT_CUDA(ranks.synchronize());
  const std::vector<__nv_bfloat16> recorded_out = ranks.out[0]->to_host();
  EXPECT_EQ(0, std::memcmp(recorded_out.data(), expected.data(), expected.size() * 2));

  timeline = header.to_host()[0];
  ASSERT_GT(timeline.count, 0u);
  ASSERT_LE(timeline.count, kCapacity);
  EXPECT_LT(timeline.start_ns, timeline.end_ns);
  const std::vector<PushEvent> recorded = events.to_host();
  uint64_t bytes = 0;
  for (unsigned int i = 0; i < timeline.count; ++i) {
    EXPECT_EQ(recorded[i].owner, 0) << "event " << i;
    EXPECT_GE(recorded[i].issue_ns, timeline.start_ns) << "event " << i;
    EXPECT_LE(recorded[i].issue_ns, timeline.end_ns) << "event " << i;
    bytes += recorded[i].bytes;
  }
  EXPECT_EQ(bytes, uint64_t(problem.m) * problem.n * 2);

  ReduceScatterRanks emulated(Problem{512, 512, 64, 2, WeightLayout::kNxK});
  ASSERT_NE(emulated.comm, nullptr);
  const auto ap = pointers<const void*>(emulated.a, 2), wp = pointers<const void*>(emulated.w, 2);
  const auto op = pointers<void*>(emulated.out, 2);
  const Status refused = launch_gemm_rs(emulated.comm, emulated.problem, first_ranks(2), ap.data(), wp.data(), nullptr,
                                        op.data(), emulated.streams.data(), {}, header.ptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("devices of their own"), std::string::npos) << refused.message();
}

// The library runs one rank per device: its call refuses ranks that share one, which only the
// testing library emulates.
TEST(FusedErrors, LibraryRefusesRanksSharingADevice) {
  ReduceScatterRanks ranks(Problem{512, 512, 64, 2, WeightLayout::kNxK});
  expect_only_testing_emulates(ranks, [&] {
    const auto a = pointers<const void*>(ranks.a, 2), w = pointers<const void*>(ranks.w, 2);
    const auto out = pointers<void*>(ranks.out, 2);
    return gemm_reduce_scatter_local(ranks.comm, ranks.problem, a.data(), w.data(), nullptr, out.data(),
                                     ranks.streams.data());
  });
}

// One rank through NCCL (a communicator of one GPU): the symmetric-memory path end to end.
TEST(FusedNccl, SingleRankMatchesGemm) {
  ncclComm_t nccl;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&nccl, 1, &device), ncclSuccess);
  const Problem problem{512, 1024, 256, 1, WeightLayout::kNxK};
  CommunicatorOptions options;
  options.max_m = problem.m;
  options.max_n = problem.n;
  Communicator* comm = nullptr;
  const Status created = communicator_create(nccl, options, &comm);
  ASSERT_TRUE(created.ok()) << created.to_string();
  DeviceArray<__nv_bfloat16> a(size_t(problem.m) * problem.k_per_rank), w(size_t(problem.k_per_rank) * problem.n),
      out(size_t(problem.m) * problem.n), c(size_t(problem.m) * problem.n);
  fill_random(a.ptr, a.count, 11);
  fill_random(w.ptr, w.count, 12);
  poison(out.ptr, out.count);
  ASSERT_TRUE(gemm_reduce_scatter(comm, problem, a.ptr, w.ptr, nullptr, out.ptr, nullptr).ok());
  ASSERT_TRUE(gemm(problem, a.ptr, w.ptr, c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto fused = out.to_host(), plain = c.to_host();
  EXPECT_EQ(0, std::memcmp(fused.data(), plain.data(), fused.size() * 2)) << "P = 1: the fused op is the GEMM";
  EXPECT_TRUE(communicator_destroy(comm).ok());
  ncclCommDestroy(nccl);
}

}  // namespace
}  // namespace tpfuse::testing
