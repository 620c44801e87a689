// The fused all-gather + GEMM with P ranks emulated on one GPU (real cross-rank stores and flags,
// all ranks' CTAs resident in one cooperative launch), and with one rank per GPU where there are
// several: the gathered X bit for bit, Y against tpfuse::gemm and cuBLAS on the gathered X.
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "local_ranks.cuh"
#include "core/device_info.h"
#include "ops/ag_gemm/config.h"
#include "ops/sequence_rows.h"
#include "testing/emulated_ranks.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {
namespace {

using Array = DeviceArray<__nv_bfloat16>;

// The all-gather's ranks: X_r, W_r, bias_r, Y_r and the gathered X of every rank, and its calls (with
// the bias where `with_bias`).
struct AllGatherRanks : LocalRanks<AllGatherProblem> {
  RankArrays x, w, bias, y, gathered;
  bool with_bias = false;

  explicit AllGatherRanks(const AllGatherProblem& p, double timeout_s = 0, std::vector<int> rank_devices = {})
      : LocalRanks(p, timeout_s, std::move(rank_devices)),
        x(ranks_arrays(size_t(p.rows_per_rank()) * p.k)),
        w(ranks_arrays(size_t(p.k) * p.n_per_rank)),
        bias(ranks_arrays(size_t(p.n_per_rank))),
        y(ranks_arrays(size_t(p.m) * p.n_per_rank)),
        gathered(ranks_arrays(size_t(p.m) * p.k)) {}

  void fill(bool exact, uint64_t seed) {
    on_each_rank([&](int r) {
      (exact ? fill_small_ints : fill_random)(x[r]->ptr, x[r]->count, seed * 1000 + 3 * r);
      (exact ? fill_small_ints : fill_random)(w[r]->ptr, w[r]->count, seed * 1000 + 3 * r + 1);
      (exact ? fill_small_ints : fill_random)(bias[r]->ptr, bias[r]->count, seed * 1000 + 3 * r + 2);
    });
    poison_outputs();
  }

  void poison_outputs() {
    on_each_rank([&](int r) {
      poison(y[r]->ptr, y[r]->count);
      poison(gathered[r]->ptr, gathered[r]->count);
    });
  }

  // Every rank, emulated where they share a device (testing/emulated_ranks.h).
  Status run(const AllGatherProblem& p, bool want_gathered = true, const ConfigOverrides& overrides = {}) {
    const auto xp = pointers<const void*>(x, p.world_size), wp = pointers<const void*>(w, p.world_size);
    const auto bp = pointers<const void*>(bias, p.world_size);
    const auto yp = pointers<void*>(y, p.world_size);
    std::vector<void*> gp = pointers<void*>(gathered, p.world_size);
    if (!want_gathered) gp.assign(gp.size(), nullptr);
    return launch_all_gather(comm, p, first_ranks(p.world_size), xp.data(), wp.data(),
                             with_bias ? bp.data() : nullptr, yp.data(), gp.data(), streams.data(), overrides);
  }

  // The gathered X of problem `p` (m x k) on the host: every rank's rows in rank order, or with
  // several sequences every rank's shard of each sequence in rank order (ops/sequence_rows.h).
  std::vector<__nv_bfloat16> expected_gathered(const AllGatherProblem& p) {
    std::vector<__nv_bfloat16> all(size_t(p.m) * p.k);
    const SequenceRows sequences(p.batch, p.rows_per_rank(), p.world_size);
    on_each_rank([&](int r) {
      const std::vector<__nv_bfloat16> part = x[r]->to_host();
      for (int64_t row = 0; row < p.rows_per_rank(); ++row) {
        std::copy_n(part.begin() + row * p.k, p.k, all.begin() + int64_t(sequences.row_of(r, int(row))) * p.k);
      }
    });
    return all;
  }

  // Rank r's bias as FP32, or none without `with_bias`.
  std::vector<float> bias_of(int r) {
    std::vector<float> values;
    if (!with_bias) return values;
    cudaSetDevice(devices[r]);
    for (const __nv_bfloat16 b : bias[r]->to_host()) values.push_back(__bfloat162float(b));
    cudaSetDevice(0);
    return values;
  }
};

// Rank r's problem as a plain GEMM: the gathered X (m x k) times W_r.
Problem gemm_of(const AllGatherProblem& p) {
  return Problem{p.m, p.n_per_rank, p.k, 1, p.weight_layout};
}

// The gathered X uploaded to rank r's device and the FP32 reference of Y_r = gathered @ W_r (+ its
// bias, where the ranks add one).
std::vector<float> reference_y(AllGatherRanks& ranks, const AllGatherProblem& p, int r,
                               const std::vector<__nv_bfloat16>& gathered_host, Array* gathered_device) {
  cudaSetDevice(ranks.devices[r]);
  cudaMemcpy(gathered_device->ptr, gathered_host.data(), gathered_host.size() * 2, cudaMemcpyHostToDevice);
  DeviceArray<float> ref(size_t(p.m) * p.n_per_rank);
  reference_gemm(gemm_of(p), gathered_device->ptr, ranks.w[r]->ptr, ref.ptr);
  std::vector<float> host = ref.to_host();
  cudaSetDevice(0);
  const std::vector<float> bias = ranks.bias_of(r);
  for (size_t i = 0; i < host.size() && !bias.empty(); ++i) host[i] += bias[i % p.n_per_rank];
  return host;
}

void expect_gathered_bit_for_bit(AllGatherRanks& ranks, const AllGatherProblem& p,
                                 const std::vector<__nv_bfloat16>& expected) {
  for (int r = 0; r < p.world_size; ++r) {
    cudaSetDevice(ranks.devices[r]);
    std::vector<__nv_bfloat16> got = ranks.gathered[r]->to_host();
    got.resize(expected.size());
    EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), expected.size() * 2)) << "rank " << r << "'s gathered X";
  }
  cudaSetDevice(0);
}

struct AllGatherCase {
  int p, m, n, k;
  WeightLayout layout;
  int split_k = 0;        // forced splits of K (0: the config's)
  int shared_tiles = -1;  // 0: bands of one block also where blocks have 64 rows or fewer; 1: of two at 64
  int idle_copiers = -1;  // 0: every CTA copies beside its tiles, also where some have none
  int batch = 1;          // sequences the rows hold (ops/sequence_rows.h)
  bool bias = false;
  AllGatherProblem problem() const {
    AllGatherProblem problem{m, n, k, p, layout};
    problem.batch = batch;
    return problem;
  }
  ConfigOverrides overrides() const {
    ConfigOverrides o;
    o.split_k = split_k;
    o.shared_tiles = shared_tiles;
    o.idle_copiers = idle_copiers;
    return o;
  }
};

std::string case_name(const ::testing::TestParamInfo<AllGatherCase>& info) {
  const AllGatherCase& c = info.param;
  return "P" + std::to_string(c.p) + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
         std::to_string(c.k) + "_" + to_string(c.layout) + (c.split_k > 0 ? "_split" + std::to_string(c.split_k) : "") +
         (c.shared_tiles == 0 ? "_separate" : c.shared_tiles == 1 ? "_shared" : "") +
         (c.idle_copiers == 0 ? "_allcopy" : c.idle_copiers == 1 ? "_idlecopy" : "") +
         (c.batch > 1 ? "_batch" + std::to_string(c.batch) : "") + (c.bias ? "_bias" : "");
}

// Exact mode (small integers, k <= 256: every sum exact in BF16): Y and the gathered X bit for bit.
void expect_exact(AllGatherRanks& ranks, const AllGatherProblem& p, const ConfigOverrides& overrides = {}) {
  ranks.fill(/*exact=*/true, 1);
  const Status s = ranks.run(p, /*want_gathered=*/true, overrides);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(ranks.synchronize());
  ASSERT_TRUE(communicator_status(ranks.comm).ok());
  const std::vector<__nv_bfloat16> gathered = ranks.expected_gathered(p);
  expect_gathered_bit_for_bit(ranks, p, gathered);
  Array scratch(size_t(p.m) * p.k);
  for (int r = 0; r < p.world_size; ++r) {
    const std::vector<float> ref = reference_y(ranks, p, r, gathered, &scratch);
    cudaSetDevice(ranks.devices[r]);
    const int64_t bad = first_mismatch(ranks.y[r]->to_host(), ref);
    EXPECT_EQ(bad, -1) << "rank " << r << ": first mismatch at " << element_at(bad, p.n_per_rank);
  }
  cudaSetDevice(0);
}

class AllGatherExact : public ::testing::TestWithParam<AllGatherCase> {};

TEST_P(AllGatherExact, BitForBit) {
  const AllGatherProblem p = GetParam().problem();
  AllGatherRanks ranks(p);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.with_bias = GetParam().bias;
  expect_exact(ranks, p, GetParam().overrides());
}

INSTANTIATE_TEST_SUITE_P(Shapes, AllGatherExact,
                         ::testing::Values(AllGatherCase{1, 256, 512, 256, WeightLayout::kNxK},
                                           AllGatherCase{2, 512, 776, 256, WeightLayout::kKxN},
                                           AllGatherCase{4, 1000, 1024, 256, WeightLayout::kNxK},
                                           AllGatherCase{8, 512, 1280, 256, WeightLayout::kKxN},
                                           AllGatherCase{8, 512, 1280, 256, WeightLayout::kNxK, 0, 1},  // bands of two
                                           AllGatherCase{8, 512, 1280, 256, WeightLayout::kNxK, 0, 0},
                                           // Every CTA copying beside its tiles where some have none (the
                                           // config leaves the copy to those here):
                                           AllGatherCase{2, 512, 776, 256, WeightLayout::kNxK, 0, -1, 0},
                                           AllGatherCase{4, 256, 1000, 128, WeightLayout::kKxN, 0, -1, 0},
                                           AllGatherCase{8, 2048, 1000, 248, WeightLayout::kNxK},
                                           AllGatherCase{8, 64, 264, 256, WeightLayout::kKxN},  // one band of all
                                           AllGatherCase{4, 96, 136, 256, WeightLayout::kNxK},  // 24 rows a block
                                           AllGatherCase{2, 96, 264, 256, WeightLayout::kKxN},  // 48 rows, P = 2
                                           AllGatherCase{4, 256, 1000, 128, WeightLayout::kNxK, 0, 1},  // P = 4
                                           AllGatherCase{3, 999, 136, 200, WeightLayout::kKxN},
                                           // Split K: 128-row and 64-row tiles.
                                           AllGatherCase{2, 256, 520, 256, WeightLayout::kNxK, 2},
                                           AllGatherCase{4, 256, 264, 128, WeightLayout::kKxN, 2},
                                           // Sequences: shards of 128, 64 and 192 rows; one rank.
                                           AllGatherCase{2, 1024, 776, 256, WeightLayout::kKxN, 0, -1, -1, 4},
                                           AllGatherCase{4, 1024, 1000, 256, WeightLayout::kNxK, 0, -1, -1, 4},
                                           AllGatherCase{8, 3072, 1000, 248, WeightLayout::kNxK, 0, -1, -1, 2},
                                           AllGatherCase{1, 384, 512, 256, WeightLayout::kNxK, 0, -1, -1, 3},
                                           // A bias: bands of one and two blocks, one band of all, split K,
                                           // sequences.
                                           AllGatherCase{4, 1000, 1024, 256, WeightLayout::kNxK, 0, -1, -1, 1, true},
                                           AllGatherCase{8, 512, 1280, 256, WeightLayout::kNxK, 0, 1, -1, 1, true},
                                           AllGatherCase{8, 64, 264, 256, WeightLayout::kKxN, 0, -1, -1, 1, true},
                                           AllGatherCase{2, 256, 520, 256, WeightLayout::kNxK, 2, -1, -1, 1, true},
                                           AllGatherCase{4, 1024, 1000, 256, WeightLayout::kKxN, 0, -1, -1, 4, true}),
                         case_name);

// Random mode: Y bit-identical to tpfuse::gemm on the gathered X (the same mainloop and, with
// whole 128-row tiles in every band and the same splits of K, the same tiles and sums; not with a
// split tail, the last bands' tiles, where the GEMM's is its last raster tiles), within 1.1x of
// cuBLAS's error, and bit-identical when run again (the other parity of the buffers).
class AllGatherRandom : public ::testing::TestWithParam<AllGatherCase> {};

TEST_P(AllGatherRandom, MatchesGemmOnTheGatheredX) {
  const AllGatherProblem p = GetParam().problem();
  AllGatherRanks ranks(p);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.with_bias = GetParam().bias;
  const ConfigOverrides overrides = GetParam().overrides();
  // Whole 128-row tiles where the bands' rows are a multiple of 128 (a band: one block, or two).
  DeviceInfo device;
  ASSERT_TRUE(current_device_info(&device).ok());
  AllGatherConfig config;
  ASSERT_TRUE(select_all_gather_config(p, device, overrides, &config).ok());
  const int64_t band_rows = p.rows_per_rank() * config.sources_per_band;
  ranks.fill(/*exact=*/false, 7);
  ASSERT_TRUE(ranks.run(p, /*want_gathered=*/true, overrides).ok());
  ASSERT_CUDA(ranks.synchronize());
  const std::vector<__nv_bfloat16> gathered = ranks.expected_gathered(p);
  expect_gathered_bit_for_bit(ranks, p, gathered);
  cublasHandle_t cublas;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  Array g(size_t(p.m) * p.k), plain(size_t(p.m) * p.n_per_rank), theirs(size_t(p.m) * p.n_per_rank);
  std::vector<std::vector<__nv_bfloat16>> first;
  for (int r = 0; r < p.world_size; ++r) {
    const std::vector<float> ref = reference_y(ranks, p, r, gathered, &g);
    // The same splits as the all-gather's: the forced ones (the cases' steps fit in an emulated
    // rank's CTAs), else none (emulated ranks have too few CTAs for the config's own splits at these
    // shapes).
    ConfigOverrides same_splits;
    same_splits.split_k = overrides.split_k > 0 ? overrides.split_k : 1;
    ASSERT_TRUE(gemm(gemm_of(p), g.ptr, ranks.w[r]->ptr, plain.ptr, nullptr, same_splits).ok());
    const float alpha = 1, beta = 0;
    const bool k_major = p.weight_layout == WeightLayout::kNxK;
    ASSERT_EQ(cublasGemmEx(cublas, k_major ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(p.n_per_rank), int(p.m),
                           int(p.k), &alpha, ranks.w[r]->ptr, CUDA_R_16BF, int(k_major ? p.k : p.n_per_rank), g.ptr,
                           CUDA_R_16BF, int(p.k), &beta, theirs.ptr, CUDA_R_16BF, int(p.n_per_rank),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_CUDA(cudaDeviceSynchronize());
    first.push_back(ranks.y[r]->to_host());
    const ErrorSums ours = error_sums(first.back(), ref);
    EXPECT_EQ(ours.num_nonfinite, 0u) << "rank " << r << ": unwritten or non-finite outputs";
    EXPECT_TRUE(within_tolerance(ours.stats(), error_sums(theirs.to_host(), ref).stats())) << "rank " << r;
    // A split tail has other tiles than the GEMM's; so do sequences (a band's rows are not Y's
    // consecutive rows), and the GEMM adds no bias.
    if (band_rows % 128 == 0 && config.gemm.whole_tiles == 0 && p.batch == 1 && !ranks.with_bias) {
      const std::vector<__nv_bfloat16> expected = plain.to_host();
      EXPECT_EQ(0, std::memcmp(first.back().data(), expected.data(), expected.size() * 2))
          << "rank " << r << ": Y differs from tpfuse::gemm on the gathered X";
    }
  }
  cublasDestroy(cublas);
  ranks.poison_outputs();
  ASSERT_TRUE(ranks.run(p, /*want_gathered=*/false, overrides).ok());
  ASSERT_CUDA(ranks.synchronize());
  for (int r = 0; r < p.world_size; ++r) {
    const std::vector<__nv_bfloat16> again = ranks.y[r]->to_host();
    EXPECT_EQ(0, std::memcmp(again.data(), first[r].data(), again.size() * 2)) << "rank " << r << " not deterministic";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AllGatherRandom,
                         ::testing::Values(AllGatherCase{8, 2048, 1280, 1024, WeightLayout::kNxK},
                                           AllGatherCase{2, 1024, 1280, 1024, WeightLayout::kNxK, 0, -1, 1},
                                           AllGatherCase{2, 1024, 1280, 1024, WeightLayout::kNxK, 0, -1, 0},
                                           AllGatherCase{8, 1024, 1024, 6144, WeightLayout::kKxN},
                                           AllGatherCase{4, 1000, 2056, 520, WeightLayout::kKxN},
                                           AllGatherCase{2, 4096, 1024, 2048, WeightLayout::kNxK},
                                           AllGatherCase{8, 512, 4096, 8192, WeightLayout::kNxK, 0, 1},  // bands of two
                                           AllGatherCase{8, 512, 4096, 1024, WeightLayout::kKxN, 0, 0},
                                           AllGatherCase{2, 1024, 256, 2048, WeightLayout::kNxK, 3},
                                           AllGatherCase{2, 1024, 512, 2048, WeightLayout::kKxN, 2},
                                           // One wave of one-row bands: the steps go down the bands.
                                           AllGatherCase{4, 512, 1280, 1024, WeightLayout::kNxK},
                                           AllGatherCase{2, 128, 1280, 2048, WeightLayout::kKxN},
                                           // A split tail: 136 tiles, 4 past a wave (of 132 and of 66).
                                           AllGatherCase{2, 4352, 1024, 5120, WeightLayout::kNxK},
                                           // 128 x 128 tiles (mixtral qkv at P = 8, M = 2048).
                                           AllGatherCase{8, 2048, 1024, 6144, WeightLayout::kNxK},
                                           // Sequences and a bias (shards of 512 and 192 rows).
                                           AllGatherCase{8, 8192, 1280, 1024, WeightLayout::kNxK, 0, -1, -1, 2},
                                           AllGatherCase{8, 6144, 1024, 1024, WeightLayout::kKxN, 0, -1, -1, 4, true},
                                           AllGatherCase{8, 2048, 1280, 1024, WeightLayout::kNxK, 0, -1, -1, 1, true}),
                         case_name);

// Rows in sequences against one sequence of the same ranks' rows: the same bands, tiles and sums,
// so Y's rows are bit-identical, only placed by sequence (ops/sequence_rows.h), on random inputs.
TEST(AllGatherSequences, BitIdenticalToOneSequenceOfTheSameRows) {
  for (const auto& [world_size, sequences_of_rows, shard] :
       {std::tuple{2, 4, 128}, std::tuple{4, 2, 64}, std::tuple{8, 3, 192}}) {
    const int p = world_size, batch = sequences_of_rows;  // captured by the lambdas below
    AllGatherProblem problem{int64_t(batch) * p * shard, 1000, 512, p, WeightLayout::kNxK};
    problem.batch = batch;
    AllGatherRanks ranks(problem);
    ASSERT_NE(ranks.comm, nullptr);
    ranks.fill(/*exact=*/false, 29);
    ASSERT_TRUE(ranks.run(problem).ok());
    ASSERT_CUDA(ranks.synchronize());
    std::vector<std::vector<__nv_bfloat16>> batched;
    ranks.on_each_rank([&](int r) { batched.push_back(ranks.y[r]->to_host()); });
    ranks.poison_outputs();
    AllGatherProblem one = problem;
    one.batch = 1;
    ASSERT_TRUE(ranks.run(one).ok());
    ASSERT_CUDA(ranks.synchronize());
    ASSERT_TRUE(communicator_status(ranks.comm).ok());
    // One sequence's row s * rows_per_rank + t is row t of source s's block: in sequences, row_of(s, t).
    const SequenceRows sequences(batch, problem.rows_per_rank(), p);
    const size_t n = size_t(problem.n_per_rank);
    ranks.on_each_rank([&](int r) {
      const std::vector<__nv_bfloat16> plain = ranks.y[r]->to_host();
      int64_t differing = 0;
      for (int s = 0; s < p; ++s) {
        for (int64_t t = 0; t < problem.rows_per_rank(); ++t) {
          differing += std::memcmp(&plain[(s * problem.rows_per_rank() + t) * n],
                                   &batched[r][size_t(sequences.row_of(s, int(t))) * n], n * 2) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << "P " << p << ", batch " << batch << ", rank " << r << ": rows differ";
    });
  }
}

// Back-to-back calls with random m (exact inputs), no host synchronization between them; every
// 50th is checked, Y and the gathered X.
TEST(AllGatherStress, ThousandCallsBackToBack) {
  const AllGatherProblem max_problem{2048, 512, 64, 8, WeightLayout::kNxK};
  AllGatherRanks ranks(max_problem);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 3);
  std::mt19937 rng(42);
  Array scratch(size_t(max_problem.m) * max_problem.k);
  for (int call = 0; call < 1000; ++call) {
    const int m = 8 * int(1 + rng() % (max_problem.m / 8));
    const AllGatherProblem p{m, max_problem.n_per_rank, max_problem.k, 8, max_problem.weight_layout};
    const bool check = call % 50 == 49;
    if (check) ranks.poison_outputs();
    ASSERT_TRUE(ranks.run(p, check).ok()) << "call " << call;
    if (!check) continue;
    ASSERT_CUDA(ranks.synchronize());
    ASSERT_TRUE(communicator_status(ranks.comm).ok());
    const std::vector<__nv_bfloat16> gathered = ranks.expected_gathered(p);
    expect_gathered_bit_for_bit(ranks, p, gathered);
    for (int r = 0; r < 8; ++r) {
      const std::vector<float> ref = reference_y(ranks, p, r, gathered, &scratch);
      std::vector<__nv_bfloat16> y = ranks.y[r]->to_host();
      y.resize(ref.size());
      const int64_t bad = first_mismatch(y, ref);
      ASSERT_EQ(bad, -1) << "call " << call << " (m = " << m << "), rank " << r << ": first mismatch at "
                         << element_at(bad, p.n_per_rank);
    }
  }
}

// Calls captured once in a CUDA graph and replayed: the epoch, and so the parity, live on the device.
TEST(AllGatherGraph, ReplaysStayCorrect) {
  const AllGatherProblem p{1024, 512, 128, 4, WeightLayout::kKxN};
  AllGatherRanks ranks(p);
  ASSERT_NE(ranks.comm, nullptr);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ranks.streams.assign(p.world_size, stream);
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status s = ranks.run(p);
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(s.ok()) << s.to_string();
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  Array scratch(size_t(p.m) * p.k);
  for (int replay = 0; replay < 5; ++replay) {
    ranks.fill(/*exact=*/true, 100 + replay);
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    const std::vector<__nv_bfloat16> gathered = ranks.expected_gathered(p);
    expect_gathered_bit_for_bit(ranks, p, gathered);
    for (int r = 0; r < p.world_size; ++r) {
      EXPECT_EQ(first_mismatch(ranks.y[r]->to_host(), reference_y(ranks, p, r, gathered, &scratch)), -1)
          << "replay " << replay << ", rank " << r;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Launches ranks 0 .. P-2 of `p` only (the last never arrives).
Status launch_all_but_the_last(AllGatherRanks& ranks, const AllGatherProblem& p, const ConfigOverrides& overrides = {}) {
  const int count = p.world_size - 1;
  const auto x = pointers<const void*>(ranks.x, count), w = pointers<const void*>(ranks.w, count);
  const auto y = pointers<void*>(ranks.y, count);
  return launch_all_gather(ranks.comm, p, first_ranks(count), x.data(), w.data(), nullptr, y.data(), nullptr,
                           ranks.streams.data(), overrides);
}

// A rank that never launches: its peers must fail with kPeerTimeout within the timeout, not hang.
TEST(AllGatherMissingPeer, TimesOut) {
  const AllGatherProblem p{1024, 512, 256, 4, WeightLayout::kNxK};
  AllGatherRanks ranks(p, /*timeout_s=*/0.2);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(false, 5);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(launch_all_but_the_last(ranks, p).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Status s = communicator_status(ranks.comm);
  EXPECT_EQ(s.code(), StatusCode::kPeerTimeout) << s.to_string();
  EXPECT_NE(s.message().find("for rank 3"), std::string::npos) << s.message();
  EXPECT_LT(seconds, 5.0) << "the timeout is 0.2 s";
  EXPECT_EQ(ranks.run(p).code(), StatusCode::kPeerTimeout) << "later calls report the failure instead of running";
}

// The same where bands hold two blocks: the band of the missing rank's block, and after it the
// other, wait for it.
TEST(AllGatherMissingPeer, TimesOutInABandOfTwo) {
  const AllGatherProblem p{256, 512, 256, 4, WeightLayout::kKxN};  // 64 rows a block
  AllGatherRanks ranks(p, /*timeout_s=*/0.2);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(false, 6);
  ConfigOverrides pairs;
  pairs.shared_tiles = 1;
  ASSERT_TRUE(launch_all_but_the_last(ranks, p, pairs).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const Status s = communicator_status(ranks.comm);
  EXPECT_EQ(s.code(), StatusCode::kPeerTimeout) << s.to_string();
  EXPECT_NE(s.message().find("for rank 3"), std::string::npos) << s.message();
}

TEST(AllGatherErrors, BadCallsAreReported) {
  const AllGatherProblem p{512, 512, 64, 4, WeightLayout::kNxK};
  AllGatherRanks ranks(p);
  ASSERT_NE(ranks.comm, nullptr);
  AllGatherProblem wrong = p;
  wrong.k = 128;
  Status s = ranks.run(wrong);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_k 64"), std::string::npos) << s.message();
  wrong = p;
  wrong.world_size = 2;
  s = ranks.run(wrong);
  EXPECT_NE(s.message().find("differs from the communicator's 4 ranks"), std::string::npos) << s.message();
  wrong = p;
  wrong.n_per_rank = 500;
  s = ranks.run(wrong);
  EXPECT_NE(s.message().find("problem.n_per_rank = 500"), std::string::npos) << s.message();
  std::vector<const void*> x(4, nullptr), w(4, ranks.w[0]->ptr);
  std::vector<void*> y(4, ranks.y[0]->ptr);
  s = all_gather_gemm_local(ranks.comm, p, x.data(), w.data(), nullptr, y.data(), nullptr, ranks.streams.data());
  EXPECT_NE(s.message().find("x must not be null"), std::string::npos) << s.message();
  s = all_gather_gemm(ranks.comm, p, ranks.x[0]->ptr, ranks.w[0]->ptr, nullptr, ranks.y[0]->ptr, nullptr, nullptr);
  EXPECT_NE(s.message().find("use all_gather_gemm_local"), std::string::npos) << s.message();
  // A communicator made without max_k serves no all-gather call.
  CommunicatorOptions options;
  options.max_m = 512;
  options.max_n = 512;
  Communicator* rs_only = nullptr;
  const int devices[4] = {0, 0, 0, 0};
  ASSERT_TRUE(communicator_create_local(devices, 4, options, &rs_only).ok());
  std::vector<const void*> xs, ws;
  std::vector<void*> ys;
  for (int r = 0; r < 4; ++r) {
    xs.push_back(ranks.x[r]->ptr);
    ws.push_back(ranks.w[r]->ptr);
    ys.push_back(ranks.y[r]->ptr);
  }
  s = all_gather_gemm_local(rs_only, p, xs.data(), ws.data(), nullptr, ys.data(), nullptr, ranks.streams.data());
  EXPECT_NE(s.message().find("max_k 0"), std::string::npos) << s.message();
  EXPECT_TRUE(communicator_destroy(rs_only).ok());
}

// The library runs one rank per device: its call refuses ranks that share one, which only the
// testing library emulates.
TEST(AllGatherErrors, LibraryRefusesRanksSharingADevice) {
  AllGatherRanks ranks(AllGatherProblem{512, 512, 64, 2, WeightLayout::kNxK});
  expect_only_testing_emulates(ranks, [&] {
    const auto x = pointers<const void*>(ranks.x, 2), w = pointers<const void*>(ranks.w, 2);
    const auto y = pointers<void*>(ranks.y, 2);
    return all_gather_gemm_local(ranks.comm, ranks.problem, x.data(), w.data(), nullptr, y.data(), nullptr,
                                 ranks.streams.data());
  });
}

// One rank per GPU (the largest power of two of the visible GPUs, at most 8).
TEST(AllGatherAcrossGpus, BitForBit) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  int p = 1;
  while (p * 2 <= count && p * 2 <= 8) p *= 2;
  if (p < 2) GTEST_SKIP() << "one rank per GPU needs 2 or more GPUs (" << count << " visible)";
  std::vector<int> devices;
  for (int d = 0; d < p; ++d) devices.push_back(d);
  const AllGatherProblem problem{512 * p, 776, 256, p, WeightLayout::kKxN};
  AllGatherRanks ranks(problem, 0, devices);
  ASSERT_NE(ranks.comm, nullptr);
  expect_exact(ranks, problem);
}

}  // namespace
}  // namespace tpfuse::testing
