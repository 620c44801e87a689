// E4M3 inputs: the plain GEMM, the reduce-scatter and the all-gather on emulated ranks, tensorwise
// and rowwise, promoted and fast, and blockwise (promoted only). The reference is the dequantized
// product (exact FP8 products, FP32 sums, then the scales; blockwise, each 128 of K's FP32 sum scaled,
// summed in FP64); the baseline is cuBLASLt's scaled FP8 GEMM with the same scales and accumulation
// (the unfused path's partials, or its product of the gathered X).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_testing.cuh"
#include "local_ranks.cuh"
#include "ops/sequence_rows.h"
#include "testing/cublaslt_fp8.h"
#include "testing/emulated_ranks.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {
namespace {

using Bytes = DeviceArray<uint8_t>;

// cuBLASLt's scaled E4M3 GEMM on device 0, where every rank of these tests runs.
void cublaslt_scaled_mm(const Problem& p, const uint8_t* a, const uint8_t* w, const InputScales& scales,
                        __nv_bfloat16* c) {
  static CublasLtFp8 cublaslt;
  cublaslt.gemm(p, a, w, scales, c, nullptr);
}

// How a test's scales are drawn. The exact ones are powers of two, so that products of small
// integers stay exact.
enum class ScaleValues {
  kRandom,  // fill_random_scales'
  kPowers,  // each its own, in 2^-3 .. 2^3
  // Blockwise, 2^-20 .. 2^20: A row i's over K block b is 2^(f_i + g_b), W block c's 2^(h_c - g_b),
  // so that each output element's K blocks all take the same product 2^(f_i + h_c), in 2^-6 .. 2^6
  // (its sums then stay as exact as tensorwise ones), while a block paired with another's scale is
  // off by 2^(g_b - g_b').
  kCancelling,
};

// A problem's scales on the device, shaped as its scaling says (scale_shapes).
struct Scales {
  std::unique_ptr<DeviceArray<float>> a, w;

  Scales(const Problem& p, uint64_t seed, ScaleValues values) {
    const ScaleShapes shapes = scale_shapes(p);
    if (values != ScaleValues::kCancelling) {
      a = make(shapes.a.count(), seed, values);
      w = make(shapes.w.count(), seed + 1, values);
      return;
    }
    std::mt19937_64 random(seed);
    const auto power = [&](int bound) { return int(random() % (2 * bound + 1)) - bound; };
    std::vector<int> g;
    for (int64_t b = 0; b < shapes.a.cols; ++b) g.push_back(power(17));
    g[0] = 17;  // both ends of the range reached
    if (g.size() > 1) g[1] = -17;
    std::vector<float> a_host, w_host;
    for (int64_t i = 0; i < shapes.a.rows; ++i) {
      const int f = power(3);
      for (const int gb : g) a_host.push_back(std::ldexp(1.0f, f + gb));
    }
    for (int64_t c = 0; c < shapes.w.rows; ++c) {
      const int h = power(3);
      for (const int gb : g) w_host.push_back(std::ldexp(1.0f, h - gb));
    }
    a = upload(a_host);
    w = upload(w_host);
  }
  InputScales get() const { return {a->ptr, w->ptr}; }

  static std::unique_ptr<DeviceArray<float>> make(size_t count, uint64_t seed, ScaleValues values) {
    if (values == ScaleValues::kRandom) {
      auto device = std::make_unique<DeviceArray<float>>(count);
      fill_random_scales(device->ptr, count, seed, nullptr);
      return device;
    }
    std::mt19937_64 random(seed);
    std::vector<float> host(count);
    for (float& s : host) s = std::ldexp(1.0f, int(random() % 7) - 3);
    return upload(host);
  }
  static std::unique_ptr<DeviceArray<float>> upload(const std::vector<float>& host) {
    auto device = std::make_unique<DeviceArray<float>>(host.size());
    cudaMemcpy(device->ptr, host.data(), device->bytes(), cudaMemcpyHostToDevice);
    return device;
  }
};

ScaleValues exact_or_random(bool exact) { return exact ? ScaleValues::kPowers : ScaleValues::kRandom; }

// Whether every element of `out` still holds the poison (a NaN): nothing was written.
bool unwritten(const DeviceArray<__nv_bfloat16>& out) {
  return error_sums(out.to_host(), std::vector<float>(out.count, 0.0f)).num_nonfinite == out.count;
}

Problem e4m3_problem(int p, int m, int n, int k, Scaling scaling, Accumulation accumulation) {
  Problem problem{m, n, k, p, WeightLayout::kNxK, DType::kE4M3};
  problem.scaling = scaling;
  problem.accumulation = accumulation;
  return problem;
}

struct Fp8Case {
  int p, m, n, k;
  Scaling scaling;
  Accumulation accumulation;
  Problem problem() const { return e4m3_problem(p, m, n, k, scaling, accumulation); }
};

std::string case_name(const ::testing::TestParamInfo<Fp8Case>& info) {
  const Fp8Case& c = info.param;
  return "P" + std::to_string(c.p) + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
         std::to_string(c.k) + "_" + to_string(c.scaling) + "_" + to_string(c.accumulation);
}

// Each shape in both scalings and both accumulations.
std::vector<Fp8Case> cases(std::initializer_list<std::vector<int>> shapes) {
  std::vector<Fp8Case> out;
  for (const auto& s : shapes) {
    for (const Scaling scaling : {Scaling::kTensorwise, Scaling::kRowwise}) {
      for (const Accumulation accumulation : {Accumulation::kPromoted, Accumulation::kFast}) {
        out.push_back({s[0], s[1], s[2], s[3], scaling, accumulation});
      }
    }
  }
  return out;
}

// Each shape blockwise, promoted (its only accumulation).
std::vector<Fp8Case> blockwise_cases(std::initializer_list<std::vector<int>> shapes) {
  std::vector<Fp8Case> out;
  for (const auto& s : shapes) out.push_back({s[0], s[1], s[2], s[3], Scaling::kBlockwise, Accumulation::kPromoted});
  return out;
}

// ---- The plain GEMM -------------------------------------------------------------------------------

class Fp8Gemm : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8Gemm, WithinCublasLtErrorAndDeterministic) {
  const Problem p = GetParam().problem();
  Bytes a(size_t(p.m) * p.k_per_rank), w(size_t(p.n) * p.k_per_rank);
  DeviceArray<__nv_bfloat16> c(size_t(p.m) * p.n), c_cublas(size_t(p.m) * p.n);
  DeviceArray<float> ref(size_t(p.m) * p.n);
  const Scales scales(p, 5, ScaleValues::kRandom);
  fill_random_e4m3(a.ptr, a.count, 11 + p.m, nullptr);
  fill_random_e4m3(w.ptr, w.count, 17 + p.n, nullptr);
  poison(c.ptr, c.count);
  reference_gemm_e4m3(p, a.ptr, w.ptr, scales.get(), ref.ptr, nullptr);
  cublaslt_scaled_mm(p, a.ptr, w.ptr, scales.get(), c_cublas.ptr);
  const Status s = gemm(p, a.ptr, w.ptr, scales.get(), c.ptr, nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto ref_host = ref.to_host();
  const auto first = c.to_host();
  const ErrorSums ours = error_sums(first, ref_host);
  EXPECT_EQ(ours.num_nonfinite, 0u) << "unwritten (poisoned) or non-finite outputs";
  const ErrorStats theirs = error_sums(c_cublas.to_host(), ref_host).stats();
  // BF16 outputs of the dequantized product: both within a few BF16 roundings of it.
  EXPECT_LT(theirs.norm_rel, 1e-2) << "cuBLASLt far from the reference: the reference (or cuBLASLt's scales) is wrong";
  EXPECT_TRUE(within_tolerance(ours.stats(), theirs))
      << "ours " << ours.stats().max_rel << " / " << ours.stats().norm_rel << ", cuBLASLt " << theirs.max_rel << " / "
      << theirs.norm_rel;
  poison(c.ptr, c.count);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, scales.get(), c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto again = c.to_host();
  EXPECT_EQ(0, std::memcmp(again.data(), first.data(), again.size() * 2)) << "not deterministic";
}

// Rows not a multiple of a tile, columns past the last whole tile, one K block and many; small M
// (split K) and the sweep's o_proj shape. Blockwise the same, K a multiple of 128 (and m of 4, as
// cuBLASLt's blockwise scales want).
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Gemm,
                         ::testing::ValuesIn(cases({{1, 200, 1000, 128}, {1, 1000, 2064, 1040}, {1, 64, 8192, 1024},
                                                    {1, 2048, 8192, 1024}, {1, 4096, 6144, 4096}})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Blockwise, Fp8Gemm,
                         ::testing::ValuesIn(blockwise_cases({{1, 200, 1000, 128}, {1, 1000, 2064, 1024},
                                                              {1, 68, 1040, 512}, {1, 64, 8192, 1024},
                                                              {1, 2048, 8192, 1024}, {1, 4096, 6144, 4096}})),
                         case_name);

class Fp8GemmExact : public ::testing::TestWithParam<Fp8Case> {};

// Small integers and power-of-2 scales: every product, sum and scaled value exact, so bit for bit.
TEST_P(Fp8GemmExact, SmallIntegersBitForBit) {
  const Problem p = GetParam().problem();
  Bytes a(size_t(p.m) * p.k_per_rank), w(size_t(p.n) * p.k_per_rank);
  DeviceArray<__nv_bfloat16> c(size_t(p.m) * p.n);
  DeviceArray<float> ref(size_t(p.m) * p.n);
  const Scales scales(p, 9, ScaleValues::kPowers);
  fill_small_ints_e4m3(a.ptr, a.count, 3, nullptr);
  fill_small_ints_e4m3(w.ptr, w.count, 4, nullptr);
  poison(c.ptr, c.count);
  reference_gemm_e4m3(p, a.ptr, w.ptr, scales.get(), ref.ptr, nullptr);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, scales.get(), c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
  EXPECT_EQ(bad, -1) << "first mismatch at " << element_at(bad, p.n);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8GemmExact, ::testing::ValuesIn(cases({{1, 1000, 784, 256}, {1, 24, 4096, 256}})),
                         case_name);

// Missing scales, or scales with BF16 inputs: named, and nothing runs.
TEST(Fp8GemmErrors, ScalesAreChecked) {
  const Problem p = e4m3_problem(1, 256, 256, 128, Scaling::kRowwise, Accumulation::kPromoted);
  Bytes a(size_t(p.m) * p.k_per_rank), w(size_t(p.n) * p.k_per_rank);
  DeviceArray<__nv_bfloat16> c(size_t(p.m) * p.n);
  const Scales scales(p, 1, ScaleValues::kPowers);
  poison(c.ptr, c.count);
  const Status missing = gemm(p, a.ptr, w.ptr, InputScales{scales.a->ptr, nullptr}, c.ptr, nullptr);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("w_scale must not be null"), std::string::npos) << missing.message();
  Problem bf16{256, 256, 128, 1, WeightLayout::kNxK};
  const Status scaled_bf16 = gemm(bf16, a.ptr, w.ptr, scales.get(), c.ptr, nullptr);
  EXPECT_EQ(scaled_bf16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(scaled_bf16.message().find("scales are for E4M3 inputs"), std::string::npos) << scaled_bf16.message();
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(unwritten(c)) << "an output was written";
}

// After a call of the op on `ranks` with random inputs: every rank's output (`outputs`) within 1.1x of
// the unfused path's error against the FP32 reference (reference(r); the unfused path's FP32 values
// unfused(r), rounded once to BF16), and the same bits from a second call.
template <class Ranks, class Outputs, class Reference, class Unfused>
void expect_within_unfused_and_deterministic(Ranks& ranks, const Outputs& outputs, Reference&& reference,
                                             Unfused&& unfused) {
  ErrorSums fused_sums, unfused_sums;
  std::vector<std::vector<__nv_bfloat16>> first;
  for (int r = 0; r < ranks.problem.world_size; ++r) {
    const std::vector<float> ref = reference(r);
    first.push_back(outputs[r]->to_host());
    fused_sums.merge(error_sums(first.back(), ref));
    std::vector<__nv_bfloat16> rounded;
    for (const float v : unfused(r)) rounded.push_back(__float2bfloat16(v));
    unfused_sums.merge(error_sums(rounded, ref));
  }
  EXPECT_EQ(fused_sums.num_nonfinite, 0u) << "unwritten or non-finite outputs";
  EXPECT_LT(unfused_sums.stats().norm_rel, 1e-2)
      << "the unfused path far from the reference: the reference (or cuBLASLt's scales) is wrong";
  EXPECT_TRUE(within_tolerance(fused_sums.stats(), unfused_sums.stats()))
      << "fused " << fused_sums.stats().max_rel << " / " << fused_sums.stats().norm_rel << ", unfused "
      << unfused_sums.stats().max_rel << " / " << unfused_sums.stats().norm_rel;
  ranks.on_each_rank([&](int r) { poison(outputs[r]->ptr, outputs[r]->count); });
  ASSERT_TRUE(ranks.run().ok());
  ASSERT_CUDA(ranks.synchronize());
  for (int r = 0; r < ranks.problem.world_size; ++r) {
    const auto again = outputs[r]->to_host();
    EXPECT_EQ(0, std::memcmp(again.data(), first[r].data(), again.size() * 2)) << "rank " << r << " not deterministic";
  }
}

// ---- The reduce-scatter on emulated ranks ----------------------------------------------------------

struct Fp8Ranks : LocalRanks<Problem> {
  std::vector<std::unique_ptr<Bytes>> a, w;
  std::vector<std::unique_ptr<Scales>> scales;
  RankArrays out;
  ConfigOverrides overrides;  // run's

  explicit Fp8Ranks(const Problem& p) : LocalRanks(p, 0, {}), out(ranks_arrays(size_t(p.rows_per_rank()) * p.n)) {
    on_each_rank([&](int) {
      a.emplace_back(new Bytes(size_t(p.m) * p.k_per_rank));
      w.emplace_back(new Bytes(size_t(p.n) * p.k_per_rank));
    });
  }

  // Small integers with exact scales, or random inputs.
  void fill(ScaleValues values, uint64_t seed) {
    const bool exact = values != ScaleValues::kRandom;
    scales.clear();
    on_each_rank([&](int r) {
      (exact ? fill_small_ints_e4m3 : fill_random_e4m3)(a[r]->ptr, a[r]->count, seed * 1000 + 3 * r, nullptr);
      (exact ? fill_small_ints_e4m3 : fill_random_e4m3)(w[r]->ptr, w[r]->count, seed * 1000 + 3 * r + 1, nullptr);
      scales.emplace_back(new Scales(problem, seed * 1000 + 3 * r + 2, values));
      poison(out[r]->ptr, out[r]->count);
    });
  }

  Status run() {
    const auto ap = pointers<const void*>(a, problem.world_size), wp = pointers<const void*>(w, problem.world_size);
    const auto op = pointers<void*>(out, problem.world_size);
    std::vector<InputScales> sp;
    for (const auto& s : scales) sp.push_back(s->get());
    return launch_gemm_rs(comm, problem, first_ranks(problem.world_size), ap.data(), wp.data(), nullptr, op.data(),
                          streams.data(), overrides, nullptr, sp.data());
  }

  // Every rank's dequantized partial (m x n, FP32), and cuBLASLt's BF16 one as FP32 (the unfused path's).
  std::vector<std::vector<float>> partials(bool cublas) {
    std::vector<std::vector<float>> result;
    on_each_rank([&](int r) {
      if (cublas) {
        DeviceArray<__nv_bfloat16> c(size_t(problem.m) * problem.n);
        cublaslt_scaled_mm(problem, a[r]->ptr, w[r]->ptr, scales[r]->get(), c.ptr);
        std::vector<float> values;
        for (const __nv_bfloat16 v : c.to_host()) values.push_back(__bfloat162float(v));
        result.push_back(values);
      } else {
        DeviceArray<float> ref(size_t(problem.m) * problem.n);
        reference_gemm_e4m3(problem, a[r]->ptr, w[r]->ptr, scales[r]->get(), ref.ptr, nullptr);
        result.push_back(ref.to_host());
      }
    });
    return result;
  }

  // Rank d's rows (m/P from d * m/P) of the partials' sum in FP32.
  std::vector<float> rows_of_sum(const std::vector<std::vector<float>>& partials, int d) const {
    const int64_t rows = problem.rows_per_rank(), n = problem.n;
    std::vector<float> sum(size_t(rows) * n, 0.0f);
    for (const auto& partial : partials) {
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += partial[size_t(d * rows) * n + i];
    }
    return sum;
  }
};

class Fp8ReduceScatter : public ::testing::TestWithParam<Fp8Case> {};
class Fp8ReduceScatterRandom : public ::testing::TestWithParam<Fp8Case> {};

// After the exact fill (and whatever a test changed of it): one call, every rank's rows bit for bit
// against the exact sum.
void expect_reduce_scatter_bit_for_bit(Fp8Ranks& ranks) {
  const Status s = ranks.run();
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(ranks.synchronize());
  const auto partials = ranks.partials(false);
  for (int d = 0; d < ranks.problem.world_size; ++d) {
    const auto out = ranks.out[d]->to_host();
    const auto ref = ranks.rows_of_sum(partials, d);
    const int64_t bad = first_mismatch(out, ref);
    EXPECT_EQ(bad, -1) << "rank " << d << ": first mismatch at " << mismatch_at(out, ref, bad, ranks.problem.n);
  }
}

// Small integers and power-of-2 scales (K/P small enough that every partial is exact in BF16):
// bit for bit against the exact sum.
TEST_P(Fp8ReduceScatter, SmallIntegersBitForBit) {
  Fp8Ranks ranks(GetParam().problem());
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(ScaleValues::kPowers, 1);
  expect_reduce_scatter_bit_for_bit(ranks);
}

// Random inputs: within 1.1x of the unfused path's error (cuBLASLt's BF16 partials summed in FP32,
// rounded once), and the same bits on a second call.
TEST_P(Fp8ReduceScatterRandom, WithinUnfusedErrorAndDeterministic) {
  Fp8Ranks ranks(GetParam().problem());
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(ScaleValues::kRandom, 7);
  ASSERT_TRUE(ranks.run().ok());
  ASSERT_CUDA(ranks.synchronize());
  const auto exact = ranks.partials(false), unfused = ranks.partials(true);
  expect_within_unfused_and_deterministic(
      ranks, ranks.out, [&](int d) { return ranks.rows_of_sum(exact, d); },
      [&](int d) { return ranks.rows_of_sum(unfused, d); });
}

// P = 2, 4, 8; a band of several owners (decode-sized M: shared tiles), rows not a multiple of a
// tile, and the sweep's o_proj shape at P = 8. In the exact mode K/P = 256 / P keeps every partial
// exact; the random mode takes the sweep's depths.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8ReduceScatter,
                         ::testing::ValuesIn(cases({{2, 1000, 1040, 128}, {4, 512, 6144, 64}, {8, 2048, 8192, 32},
                                                    {8, 64, 8192, 32}})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8ReduceScatterRandom,
                         ::testing::ValuesIn(cases({{2, 1000, 1040, 1024}, {4, 512, 6144, 768}, {8, 2048, 8192, 1024},
                                                    {8, 64, 8192, 1024}, {8, 8192, 4096, 512}})),
                         case_name);
// Blockwise the same, and 17 rows a rank.
INSTANTIATE_TEST_SUITE_P(Blockwise, Fp8ReduceScatterRandom,
                         ::testing::ValuesIn(blockwise_cases({{2, 1000, 1040, 1024}, {4, 512, 6144, 768},
                                                              {4, 68, 1040, 512}, {8, 2048, 8192, 1024},
                                                              {8, 64, 8192, 1024}, {8, 8192, 4096, 512}})),
                         case_name);

// ---- The all-gather on emulated ranks ------------------------------------------------------------

AllGatherProblem e4m3_all_gather(int p, int m, int n_per_rank, int k, Scaling scaling, Accumulation accumulation) {
  AllGatherProblem problem{m, n_per_rank, k, p, WeightLayout::kNxK, DType::kE4M3};
  problem.scaling = scaling;
  problem.accumulation = accumulation;
  return problem;
}

// Shapes read as {P, m, n_per_rank, k}.
struct Fp8AllGatherCase : Fp8Case {
  AllGatherProblem problem() const { return e4m3_all_gather(p, m, n, k, scaling, accumulation); }
};

std::vector<Fp8AllGatherCase> as_all_gather_cases(const std::vector<Fp8Case>& cases) {
  std::vector<Fp8AllGatherCase> out;
  for (const Fp8Case& c : cases) out.push_back({c});
  return out;
}

std::string all_gather_case_name(const ::testing::TestParamInfo<Fp8AllGatherCase>& info) {
  return case_name(::testing::TestParamInfo<Fp8Case>(info.param, info.index));
}

// The all-gather's ranks: X_r, W_r, their scales, bias_r, Y_r and every rank's gathered X, and their
// call (with the bias where `with_bias`, under `overrides`).
struct Fp8AllGatherRanks : LocalRanks<AllGatherProblem> {
  std::vector<std::unique_ptr<Bytes>> x, w, gathered;
  std::vector<std::unique_ptr<DeviceArray<float>>> x_scales, w_scales;
  RankArrays y, bias;
  bool with_bias = false;
  ConfigOverrides overrides;

  explicit Fp8AllGatherRanks(const AllGatherProblem& p)
      : LocalRanks(p, 0, {}), y(ranks_arrays(size_t(p.m) * p.n_per_rank)), bias(ranks_arrays(size_t(p.n_per_rank))) {
    on_each_rank([&](int) {
      x.emplace_back(new Bytes(size_t(p.rows_per_rank()) * p.k));
      w.emplace_back(new Bytes(size_t(p.n_per_rank) * p.k));
      gathered.emplace_back(new Bytes(size_t(p.m) * p.k));
    });
  }

  // A rank's scales are shaped as those of its own product, X_r (m/P x k) times W_r; rowwise and
  // blockwise, X_r's rows' are gathered with them.
  ScaleShapes rank_scale_shapes() const {
    return scale_shapes(e4m3_problem(1, int(problem.rows_per_rank()), int(problem.n_per_rank), int(problem.k),
                                     problem.scaling, problem.accumulation));
  }
  bool gathers_scales() const { return problem.scaling != Scaling::kTensorwise; }

  // Small integers with power-of-2 scales (blockwise: x_block_powers and w_block_powers), or random
  // inputs.
  void fill(bool exact, uint64_t seed) {
    x_scales.clear();
    w_scales.clear();
    const ScaleShapes shapes = rank_scale_shapes();
    const bool block_powers = exact && problem.scaling == Scaling::kBlockwise;
    on_each_rank([&](int r) {
      (exact ? fill_small_ints_e4m3 : fill_random_e4m3)(x[r]->ptr, x[r]->count, seed * 1000 + 4 * r, nullptr);
      (exact ? fill_small_ints_e4m3 : fill_random_e4m3)(w[r]->ptr, w[r]->count, seed * 1000 + 4 * r + 1, nullptr);
      (exact ? fill_small_ints_bf16 : fill_random_bf16)(bias[r]->ptr, bias[r]->count, seed * 1000 + 500 + r, nullptr);
      x_scales.push_back(block_powers ? Scales::upload(x_block_powers(r, 0))
                                      : Scales::make(shapes.a.count(), seed * 1000 + 4 * r + 2, exact_or_random(exact)));
      w_scales.push_back(block_powers ? Scales::upload(w_block_powers(r))
                                      : Scales::make(shapes.w.count(), seed * 1000 + 4 * r + 3, exact_or_random(exact)));
    });
    poison_outputs();
  }

  void poison_outputs() {
    on_each_rank([&](int r) {
      poison(y[r]->ptr, y[r]->count);
      cudaMemset(gathered[r]->ptr, 0xFF, gathered[r]->bytes());
    });
  }

  // Exact blockwise scales that tell the gathered rows and the K blocks apart: X's row g of the
  // gathered rows ([source][row]) over K block b takes 2^((5g + 2b + shift) mod 9 - 4), so that the
  // same row of another source (rows a rank not a multiple of 3), a row up to 8 away, or a K block up
  // to 8 away takes another scale, and another shift changes every scale; W_r's block c over K block
  // b takes 2^((c + 2b + r) mod 3 - 1). A block's two scales multiply to 2^-5 .. 2^5, so with small
  // integers every block's scaled sum and their total are exact in FP32 up to K = 8192.
  std::vector<float> x_block_powers(int r, int shift) const {
    const ScaleShape shape = rank_scale_shapes().a;
    std::vector<float> scales;
    for (int64_t row = 0; row < shape.rows; ++row) {
      const int64_t g = r * shape.rows + row;
      for (int64_t b = 0; b < shape.cols; ++b) scales.push_back(std::ldexp(1.0f, int((5 * g + 2 * b + shift) % 9) - 4));
    }
    return scales;
  }
  std::vector<float> w_block_powers(int r) const {
    const ScaleShape shape = rank_scale_shapes().w;
    std::vector<float> scales;
    for (int64_t c = 0; c < shape.rows; ++c) {
      for (int64_t b = 0; b < shape.cols; ++b) scales.push_back(std::ldexp(1.0f, int((c + 2 * b + r) % 3) - 1));
    }
    return scales;
  }
  // X's blockwise scales of shift `shift` (x_block_powers) in place of the ones there, and the outputs
  // poisoned.
  void set_x_block_powers(int shift) {
    on_each_rank([&](int r) {
      const std::vector<float> scales = x_block_powers(r, shift);
      cudaMemcpy(x_scales[r]->ptr, scales.data(), x_scales[r]->bytes(), cudaMemcpyHostToDevice);
    });
    poison_outputs();
  }

  Status run() {
    const auto xp = pointers<const void*>(x, problem.world_size), wp = pointers<const void*>(w, problem.world_size);
    const auto bp = pointers<const void*>(bias, problem.world_size);
    const auto yp = pointers<void*>(y, problem.world_size), gp = pointers<void*>(gathered, problem.world_size);
    std::vector<InputScales> sp;
    for (int r = 0; r < problem.world_size; ++r) sp.push_back({x_scales[r]->ptr, w_scales[r]->ptr});
    return launch_all_gather(comm, problem, first_ranks(problem.world_size), xp.data(), wp.data(),
                             with_bias ? bp.data() : nullptr, yp.data(), gp.data(), streams.data(), overrides,
                             sp.data());
  }

  // Every rank's rows of `per_rank` (`per_row` values a row) in the gathered X's order: the ranks'
  // rows in rank order, or with several sequences each rank's shard of each sequence in rank order
  // (ops/sequence_rows.h).
  template <class T>
  std::vector<T> in_gathered_order(const std::vector<std::vector<T>>& per_rank, size_t per_row) const {
    const SequenceRows sequences(problem.batch, problem.rows_per_rank(), problem.world_size);
    std::vector<T> all(size_t(problem.m) * per_row);
    for (int r = 0; r < problem.world_size; ++r) {
      for (int row = 0; row < int(problem.rows_per_rank()); ++row) {
        std::copy_n(per_rank[r].begin() + size_t(row) * per_row, per_row,
                    all.begin() + size_t(sequences.row_of(r, row)) * per_row);
      }
    }
    return all;
  }
  // The gathered X, and (rowwise and blockwise) its rows' scales in the same order.
  std::vector<uint8_t> expected_gathered() {
    std::vector<std::vector<uint8_t>> blocks;
    on_each_rank([&](int r) { blocks.push_back(x[r]->to_host()); });
    return in_gathered_order(blocks, size_t(problem.k));
  }
  std::vector<float> gathered_scales() {
    std::vector<std::vector<float>> scales;
    on_each_rank([&](int r) { scales.push_back(x_scales[r]->to_host()); });
    return in_gathered_order(scales, size_t(rank_scale_shapes().a.cols));
  }

  // Rank r's Y as the unfused path computes it: the gathered X (and its scales; tensorwise rank r's
  // one scale) times W_r, as the FP32 reference (cublas = false) or cuBLASLt's BF16 GEMM as FP32,
  // plus rank r's bias where the calls add one.
  std::vector<float> y_of(int r, bool cublas) {
    const Problem gemm = e4m3_problem(1, int(problem.m), int(problem.n_per_rank), int(problem.k), problem.scaling,
                                      problem.accumulation);
    Bytes all(size_t(problem.m) * problem.k);
    const auto host = expected_gathered();
    cudaMemcpy(all.ptr, host.data(), host.size(), cudaMemcpyHostToDevice);
    DeviceArray<float> row_scales(gathers_scales() ? scale_shapes(gemm).a.count() : 1);
    if (gathers_scales()) {
      const auto scales = gathered_scales();
      cudaMemcpy(row_scales.ptr, scales.data(), row_scales.bytes(), cudaMemcpyHostToDevice);
    }
    const InputScales scales{gathers_scales() ? row_scales.ptr : x_scales[r]->ptr, w_scales[r]->ptr};
    std::vector<float> values;
    if (cublas) {
      DeviceArray<__nv_bfloat16> c(size_t(problem.m) * problem.n_per_rank);
      cublaslt_scaled_mm(gemm, all.ptr, w[r]->ptr, scales, c.ptr);
      for (const __nv_bfloat16 v : c.to_host()) values.push_back(__bfloat162float(v));
    } else {
      DeviceArray<float> ref(size_t(problem.m) * problem.n_per_rank);
      reference_gemm_e4m3(gemm, all.ptr, w[r]->ptr, scales, ref.ptr, nullptr);
      values = ref.to_host();
    }
    if (with_bias) {
      const auto b = bias[r]->to_host();
      for (size_t i = 0; i < values.size(); ++i) values[i] += __bfloat162float(b[i % b.size()]);
    }
    return values;
  }
};

// One call after the exact fill (and whatever a test changed of it): every rank's Y bit for bit
// against the exact product, and its gathered X byte for byte.
void expect_all_gather_bit_for_bit(Fp8AllGatherRanks& ranks) {
  const Status s = ranks.run();
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_CUDA(ranks.synchronize());
  ASSERT_TRUE(communicator_status(ranks.comm).ok()) << communicator_status(ranks.comm).to_string();
  const auto expected = ranks.expected_gathered();
  for (int r = 0; r < ranks.problem.world_size; ++r) {
    const auto y = ranks.y[r]->to_host();
    const auto ref = ranks.y_of(r, false);
    const int64_t bad = first_mismatch(y, ref);
    EXPECT_EQ(bad, -1) << "rank " << r << ": first mismatch at " << mismatch_at(y, ref, bad, ranks.problem.n_per_rank);
    EXPECT_EQ(0, std::memcmp(ranks.gathered[r]->to_host().data(), expected.data(), expected.size()))
        << "rank " << r << "'s gathered X";
  }
}

class Fp8AllGather : public ::testing::TestWithParam<Fp8AllGatherCase> {};
class Fp8AllGatherRandom : public ::testing::TestWithParam<Fp8AllGatherCase> {};

// Small integers and power-of-2 scales: Y bit for bit against the exact product, and the gathered X
// byte for byte.
TEST_P(Fp8AllGather, SmallIntegersBitForBit) {
  Fp8AllGatherRanks ranks(GetParam().problem());
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 1);
  expect_all_gather_bit_for_bit(ranks);
}

// Random inputs: within 1.1x of the unfused path's error (cuBLASLt on the gathered X, the same
// accumulation), and the same bits on a second call.
TEST_P(Fp8AllGatherRandom, WithinUnfusedErrorAndDeterministic) {
  Fp8AllGatherRanks ranks(GetParam().problem());
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/false, 7);
  ASSERT_TRUE(ranks.run().ok());
  ASSERT_CUDA(ranks.synchronize());
  expect_within_unfused_and_deterministic(
      ranks, ranks.y, [&](int r) { return ranks.y_of(r, false); }, [&](int r) { return ranks.y_of(r, true); });
}

// P = 1, 2, 4, 8: rows per rank not a multiple of 64 (1000 / 2), of 64 at P = 4 (bands of two
// blocks), of 8 at P = 8 (one band of every block), and the sweep's column-parallel depths.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8AllGather,
                         ::testing::ValuesIn(as_all_gather_cases(cases({{1, 256, 512, 256}, {2, 1000, 1040, 128},
                                                                        {4, 256, 1000, 128}, {8, 64, 264, 256},
                                                                        {8, 2048, 1024, 512}}))),
                         all_gather_case_name);
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8AllGatherRandom,
                         ::testing::ValuesIn(as_all_gather_cases(cases({{2, 1000, 1040, 1024}, {4, 512, 1536, 4096},
                                                                        {8, 2048, 1024, 4096}, {8, 64, 3584, 4096}}))),
                         all_gather_case_name);
// Blockwise the same, and 17 rows a rank (a band of every block); 2048 x 4096 on the config's
// 128 x 192 tiles.
INSTANTIATE_TEST_SUITE_P(Blockwise, Fp8AllGatherRandom,
                         ::testing::ValuesIn(as_all_gather_cases(blockwise_cases(
                             {{2, 1000, 1040, 1024}, {4, 512, 1536, 4096}, {8, 2048, 1024, 4096},
                              {8, 64, 3584, 4096}, {8, 136, 1024, 2048}, {8, 2048, 4096, 2048}}))),
                         all_gather_case_name);

// Missing scales and a K x N weight: named errors, and nothing runs.
TEST(Fp8AllGatherErrors, ScalesAndLayoutAreChecked) {
  Fp8AllGatherRanks ranks(e4m3_all_gather(2, 256, 256, 128, Scaling::kRowwise, Accumulation::kPromoted));
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 1);
  const auto xp = pointers<const void*>(ranks.x, 2), wp = pointers<const void*>(ranks.w, 2);
  const auto yp = pointers<void*>(ranks.y, 2);
  const InputScales missing[2] = {{ranks.x_scales[0]->ptr, ranks.w_scales[0]->ptr}, {nullptr, ranks.w_scales[1]->ptr}};
  const Status s = launch_all_gather(ranks.comm, ranks.problem, first_ranks(2), xp.data(), wp.data(), nullptr,
                                     yp.data(), nullptr, ranks.streams.data(), {}, missing);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must not be null"), std::string::npos) << s.message();
  AllGatherProblem kxn = ranks.problem;
  kxn.weight_layout = WeightLayout::kKxN;
  EXPECT_EQ(validate(kxn).code(), StatusCode::kUnsupported) << validate(kxn).message();
  ASSERT_CUDA(ranks.synchronize());
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(unwritten(*ranks.y[r])) << "rank " << r << "'s output was written";
}

// ---- Blockwise scales: each op exact, and the errors ------------------------------------------

// A blockwise case of small integers: its shape ({P, m, n, k}), its scales' values, a forced split of
// K (0: the config's), whether some blocks are zeros (zero_some_blocks), and a forced tile width
// (0: the config's).
struct BlockwiseCase {
  int p, m, n, k;
  ScaleValues values = ScaleValues::kPowers;
  int split_k = 0;
  bool zero_blocks = false;
  int block_n = 0;

  Problem problem() const { return e4m3_problem(p, m, n, k, Scaling::kBlockwise, Accumulation::kPromoted); }
  ConfigOverrides overrides() const {
    ConfigOverrides o;
    o.split_k = split_k;
    o.block_n = block_n;
    return o;
  }
};

std::string blockwise_case_name(const ::testing::TestParamInfo<BlockwiseCase>& info) {
  const BlockwiseCase& c = info.param;
  return "P" + std::to_string(c.p) + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
         std::to_string(c.k) + (c.values == ScaleValues::kCancelling ? "_cancelling" : "_powers") +
         (c.split_k > 0 ? "_split" + std::to_string(c.split_k) : "") + (c.zero_blocks ? "_zero_blocks" : "") +
         (c.block_n > 0 ? "_wide" + std::to_string(c.block_n) : "");
}

// Zeros in a problem's blocks (m > 5, n > 128, k >= 256): A's scale of row 3 over K block 1, W's
// of columns 128 .. 255 over K block 0, W's values of columns 0 .. 127 over K block 1, and A's of
// row 5 over K block 0.
void zero_some_blocks(const Problem& p, uint8_t* a, uint8_t* w, const Scales& scales) {
  const int64_t k_blocks = p.k_per_rank / kScaleBlock;
  cudaMemset(scales.a->ptr + 3 * k_blocks + 1, 0, sizeof(float));
  cudaMemset(scales.w->ptr + 1 * k_blocks + 0, 0, sizeof(float));
  cudaMemset2D(w + kScaleBlock, size_t(p.k_per_rank), 0, kScaleBlock, size_t(std::min<int64_t>(p.n, kScaleBlock)));
  cudaMemset(a + 5 * p.k_per_rank, 0, kScaleBlock);
}

class Fp8BlockwiseGemmExact : public ::testing::TestWithParam<BlockwiseCase> {};

// Small integers and exact scales: every block's sum, its scaled value and the sums of those exact
// in FP32 (powers: at most 2^24 of 2^-6 up to K = 4096), so bit for bit; twice, the same bits.
TEST_P(Fp8BlockwiseGemmExact, SmallIntegersBitForBit) {
  const BlockwiseCase& bc = GetParam();
  const Problem p = bc.problem();
  Bytes a(size_t(p.m) * p.k_per_rank), w(size_t(p.n) * p.k_per_rank);
  DeviceArray<__nv_bfloat16> c(size_t(p.m) * p.n);
  DeviceArray<float> ref(size_t(p.m) * p.n);
  const Scales scales(p, 9, bc.values);
  fill_small_ints_e4m3(a.ptr, a.count, 3, nullptr);
  fill_small_ints_e4m3(w.ptr, w.count, 4, nullptr);
  if (bc.zero_blocks) zero_some_blocks(p, a.ptr, w.ptr, scales);
  reference_gemm_e4m3(p, a.ptr, w.ptr, scales.get(), ref.ptr, nullptr);
  const auto ref_host = ref.to_host();
  std::vector<__nv_bfloat16> first;
  for (int run = 0; run < 2; ++run) {
    poison(c.ptr, c.count);
    const Status s = gemm(p, a.ptr, w.ptr, scales.get(), c.ptr, nullptr, bc.overrides());
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    const auto out = c.to_host();
    const int64_t bad = first_mismatch(out, ref_host);
    EXPECT_EQ(bad, -1) << "run " << run << ": first mismatch at " << mismatch_at(out, ref_host, bad, p.n);
    if (run == 0) first = out;
    EXPECT_EQ(0, std::memcmp(out.data(), first.data(), out.size() * 2)) << "not deterministic";
  }
}

// One row and 17 (columns past the last whole scale block), M not a multiple of 128; scales of
// 2^-20 .. 2^20; zero blocks; K split as the config splits it (M = 64, in 3: tests/cpu's config
// test), not at all, and in 2 and 4.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8BlockwiseGemmExact,
    ::testing::Values(BlockwiseCase{1, 1000, 784, 256}, BlockwiseCase{1, 1, 256, 128}, BlockwiseCase{1, 17, 520, 384},
                      BlockwiseCase{1, 24, 4096, 1024}, BlockwiseCase{1, 256, 1024, 1024, ScaleValues::kCancelling},
                      BlockwiseCase{1, 1000, 784, 512, ScaleValues::kCancelling},
                      BlockwiseCase{1, 200, 1000, 512, ScaleValues::kPowers, 0, true},
                      BlockwiseCase{1, 200, 1000, 512, ScaleValues::kCancelling, 0, true},
                      BlockwiseCase{1, 64, 2048, 4096}, BlockwiseCase{1, 64, 2048, 4096, ScaleValues::kPowers, 1},
                      BlockwiseCase{1, 64, 2048, 4096, ScaleValues::kPowers, 2},
                      BlockwiseCase{1, 64, 2048, 4096, ScaleValues::kPowers, 4},
                      BlockwiseCase{1, 128, 1024, 1024, ScaleValues::kCancelling, 3},
                      // 192 wide: slabs from 0 and 64 columns into a block of W's scales, and the
                      // last one's second block past N (784, 248).
                      BlockwiseCase{1, 1000, 784, 256, ScaleValues::kPowers, 0, false, 192},
                      BlockwiseCase{1, 17, 248, 384, ScaleValues::kPowers, 0, false, 192},
                      BlockwiseCase{1, 300, 1536, 1024, ScaleValues::kCancelling, 0, false, 192},
                      BlockwiseCase{1, 200, 1000, 512, ScaleValues::kCancelling, 0, true, 192},
                      BlockwiseCase{1, 64, 2048, 4096, ScaleValues::kPowers, 2, false, 192}),
    blockwise_case_name);

class Fp8BlockwiseReduceScatter : public ::testing::TestWithParam<BlockwiseCase> {};

// Small integers and exact scales (every partial exact in BF16: one K block of powers, or up to
// 256 of K under cancelling scales): bit for bit against the exact sum.
TEST_P(Fp8BlockwiseReduceScatter, SmallIntegersBitForBit) {
  const BlockwiseCase& bc = GetParam();
  Fp8Ranks ranks(bc.problem());
  ASSERT_NE(ranks.comm, nullptr);
  ranks.overrides = bc.overrides();
  ranks.fill(bc.values, 1);
  if (bc.zero_blocks) {
    ranks.on_each_rank(
        [&](int r) { zero_some_blocks(ranks.problem, ranks.a[r]->ptr, ranks.w[r]->ptr, *ranks.scales[r]); });
  }
  expect_reduce_scatter_bit_for_bit(ranks);
}

// P = 1, 2, 4, 8; 17 rows a rank, 8 (a band of several owners, K whole and split in two) and one
// (a band of every owner, from registers); rows a rank not a multiple of a tile; zero blocks; and
// 128 x 192 tiles forced (slabs from 0 and 64 columns into a block of W's scales, the last tile's
// second block past N), with bands of two ranks' rows (64 a rank at P = 8), 250 rows a rank and zero
// blocks among them.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8BlockwiseReduceScatter,
    ::testing::Values(BlockwiseCase{1, 256, 512, 256, ScaleValues::kCancelling}, BlockwiseCase{2, 1000, 1040, 128},
                      BlockwiseCase{2, 34, 520, 256, ScaleValues::kCancelling}, BlockwiseCase{4, 512, 6144, 128},
                      BlockwiseCase{4, 68, 1040, 256, ScaleValues::kCancelling},
                      BlockwiseCase{4, 32, 1040, 256, ScaleValues::kCancelling},
                      BlockwiseCase{4, 32, 1040, 256, ScaleValues::kCancelling, 2},
                      BlockwiseCase{8, 8, 1024, 256, ScaleValues::kCancelling}, BlockwiseCase{8, 64, 8192, 128},
                      BlockwiseCase{8, 2048, 8192, 128}, BlockwiseCase{8, 2000, 1000, 256, ScaleValues::kCancelling},
                      BlockwiseCase{1, 512, 1024, 256, ScaleValues::kCancelling, 0, true},
                      BlockwiseCase{2, 512, 1024, 256, ScaleValues::kCancelling},
                      BlockwiseCase{2, 512, 1024, 256, ScaleValues::kCancelling, 0, true},
                      BlockwiseCase{4, 512, 1024, 512, ScaleValues::kCancelling, 0, true},
                      BlockwiseCase{8, 2000, 1000, 256, ScaleValues::kCancelling, 0, true},
                      BlockwiseCase{2, 1000, 1040, 256, ScaleValues::kCancelling, 0, false, 192},
                      BlockwiseCase{8, 2048, 8192, 128, ScaleValues::kPowers, 0, false, 192},
                      BlockwiseCase{8, 512, 6144, 128, ScaleValues::kPowers, 0, false, 192},
                      BlockwiseCase{8, 2000, 1000, 256, ScaleValues::kCancelling, 0, false, 192},
                      BlockwiseCase{4, 512, 1000, 256, ScaleValues::kCancelling, 0, true, 192}),
    blockwise_case_name);

// The problems blockwise scales refuse (fast accumulation, K not a multiple of 128) and missing
// scales: named, and nothing runs, in the GEMM and in the reduce-scatter.
TEST(Fp8BlockwiseErrors, GemmAndReduceScatterCheckTheirInputs) {
  const Problem good = e4m3_problem(2, 256, 256, 256, Scaling::kBlockwise, Accumulation::kPromoted);
  Problem fast = good, k192 = good;
  fast.accumulation = Accumulation::kFast;
  k192.k_per_rank = 192;
  const std::pair<Problem, std::string> refused[] = {{fast, "problem.accumulation = fast with blockwise"},
                                                     {k192, "problem.k_per_rank = 192 is not a multiple of 128"}};

  Bytes a(size_t(good.m) * good.k_per_rank), w(size_t(good.n) * good.k_per_rank);
  DeviceArray<__nv_bfloat16> c(size_t(good.m) * good.n);
  const Scales scales(good, 1, ScaleValues::kPowers);
  poison(c.ptr, c.count);
  for (const auto& [problem, message] : refused) {
    const Status s = gemm(problem, a.ptr, w.ptr, scales.get(), c.ptr, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
  const Status no_a = gemm(good, a.ptr, w.ptr, InputScales{nullptr, scales.w->ptr}, c.ptr, nullptr);
  EXPECT_EQ(no_a.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_a.message().find("a_scale must not be null"), std::string::npos) << no_a.message();
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(unwritten(c)) << "the GEMM wrote an output";

  Fp8Ranks ranks(good);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(ScaleValues::kPowers, 1);
  for (const auto& [problem, message] : refused) {
    ranks.problem = problem;
    const Status s = ranks.run();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
  ranks.problem = good;
  const auto ap = pointers<const void*>(ranks.a, 2), wp = pointers<const void*>(ranks.w, 2);
  const auto op = pointers<void*>(ranks.out, 2);
  const InputScales missing[2] = {ranks.scales[0]->get(), {ranks.scales[1]->a->ptr, nullptr}};
  const Status no_w = launch_gemm_rs(ranks.comm, good, first_ranks(2), ap.data(), wp.data(), nullptr, op.data(),
                                     ranks.streams.data(), {}, nullptr, missing);
  EXPECT_EQ(no_w.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_w.message().find("w_scale must not be null"), std::string::npos) << no_w.message();
  ASSERT_CUDA(ranks.synchronize());
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(unwritten(*ranks.out[r])) << "rank " << r << "'s output was written";
}

// A blockwise all-gather case of small integers: its shape ({P, m, n_per_rank, k}), forced splits of
// K and bands (ConfigOverrides' split_k and shared_tiles; 0 and -1: the config's), its sequences,
// whether the ranks add a bias, and a forced tile width (0: the config's).
struct BlockwiseAllGatherCase {
  int p, m, n, k;
  int split_k = 0;
  int shared_tiles = -1;
  int batch = 1;
  bool bias = false;
  int block_n = 0;

  AllGatherProblem problem() const {
    AllGatherProblem problem = e4m3_all_gather(p, m, n, k, Scaling::kBlockwise, Accumulation::kPromoted);
    problem.batch = batch;
    return problem;
  }
  ConfigOverrides overrides() const {
    ConfigOverrides o;
    o.split_k = split_k;
    o.shared_tiles = shared_tiles;
    o.block_n = block_n;
    return o;
  }
};

std::string blockwise_all_gather_case_name(const ::testing::TestParamInfo<BlockwiseAllGatherCase>& info) {
  const BlockwiseAllGatherCase& c = info.param;
  return "P" + std::to_string(c.p) + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" +
         std::to_string(c.k) + (c.split_k > 0 ? "_split" + std::to_string(c.split_k) : "") +
         (c.shared_tiles == 0 ? "_separate" : c.shared_tiles == 1 ? "_shared" : "") +
         (c.batch > 1 ? "_batch" + std::to_string(c.batch) : "") + (c.bias ? "_bias" : "") +
         (c.block_n > 0 ? "_wide" + std::to_string(c.block_n) : "");
}

class Fp8BlockwiseAllGather : public ::testing::TestWithParam<BlockwiseAllGatherCase> {};

// Small integers and scales that tell the gathered rows and K blocks apart (x_block_powers): Y bit for
// bit against the exact product and the gathered X byte for byte; then again with every scale of X
// changed, which this call finds in the other parity half of the gathered scales.
TEST_P(Fp8BlockwiseAllGather, SmallIntegersBitForBit) {
  const BlockwiseAllGatherCase& c = GetParam();
  Fp8AllGatherRanks ranks(c.problem());
  ASSERT_NE(ranks.comm, nullptr);
  ASSERT_NE(ranks.problem.rows_per_rank() % 3, 0) << "two sources' rows would take the same scales";
  ranks.with_bias = c.bias;
  ranks.overrides = c.overrides();
  ranks.fill(/*exact=*/true, 1);
  expect_all_gather_bit_for_bit(ranks);
  ranks.set_x_block_powers(/*shift=*/1);
  expect_all_gather_bit_for_bit(ranks);
}

// P = 1, 2, 4, 8. One row a rank and 17 (a band of every block; 17 also in bands of one block, most
// of a tile's rows past its band), 64 (bands of two blocks, a tile's halves from their blocks, as the
// config takes them at N = 4096), 128 and 500; K split as the config splits it (3, at K = 4096 and few
// tiles) and forced in 2; sequences (shards of 128 and 64 rows); a bias; and 128 x 192 tiles forced
// (a slab over two blocks of W's scales; bands of several ranks' rows keep 128 x 128), on partial
// tiles of N, 125 rows a rank, K split, sequences with a bias among them.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8BlockwiseAllGather,
    ::testing::Values(BlockwiseAllGatherCase{1, 256, 512, 512}, BlockwiseAllGatherCase{2, 1000, 1040, 256},
                      BlockwiseAllGatherCase{2, 2, 264, 256}, BlockwiseAllGatherCase{2, 34, 520, 4096},
                      BlockwiseAllGatherCase{4, 512, 1000, 512}, BlockwiseAllGatherCase{4, 68, 264, 256, 0, 0},
                      BlockwiseAllGatherCase{8, 8, 256, 4096, 0, -1, 1, true}, BlockwiseAllGatherCase{8, 136, 520, 256},
                      BlockwiseAllGatherCase{8, 512, 4096, 256, 0, -1, 1, true},
                      BlockwiseAllGatherCase{2, 256, 520, 1024, 2},
                      BlockwiseAllGatherCase{2, 512, 776, 256, 0, -1, 2, true},
                      BlockwiseAllGatherCase{4, 1024, 1000, 256, 0, -1, 4, true},
                      BlockwiseAllGatherCase{8, 1024, 520, 128, 0, -1, 2},
                      BlockwiseAllGatherCase{2, 1000, 1040, 256, 0, -1, 1, false, 192},
                      BlockwiseAllGatherCase{8, 1024, 264, 256, 0, -1, 1, false, 192},
                      BlockwiseAllGatherCase{4, 500, 776, 512, 0, -1, 1, false, 192},
                      BlockwiseAllGatherCase{2, 256, 520, 1024, 2, -1, 1, false, 192},
                      BlockwiseAllGatherCase{4, 1024, 1000, 256, 0, -1, 4, true, 192}),
    blockwise_all_gather_case_name);

// The problems blockwise scales refuse (fast accumulation, K not a multiple of 128) and missing
// scales, in the all-gather: named, and nothing written (Y nor the gathered X).
TEST(Fp8BlockwiseErrors, AllGatherChecksItsInputs) {
  const AllGatherProblem good = e4m3_all_gather(2, 256, 256, 256, Scaling::kBlockwise, Accumulation::kPromoted);
  AllGatherProblem fast = good, k192 = good;
  fast.accumulation = Accumulation::kFast;
  k192.k = 192;
  Fp8AllGatherRanks ranks(good);
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 1);
  for (const auto& [problem, message] : {std::pair{fast, std::string("problem.accumulation = fast with blockwise")},
                                         std::pair{k192, std::string("problem.k = 192 is not a multiple of 128")}}) {
    ranks.problem = problem;
    const Status s = ranks.run();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
  ranks.problem = good;
  // Rank 0 without W_0's scales, then rank 1 without X_1's.
  const auto xp = pointers<const void*>(ranks.x, 2), wp = pointers<const void*>(ranks.w, 2);
  const auto yp = pointers<void*>(ranks.y, 2), gp = pointers<void*>(ranks.gathered, 2);
  for (const int without : {0, 1}) {
    InputScales scales[2] = {{ranks.x_scales[0]->ptr, ranks.w_scales[0]->ptr},
                             {ranks.x_scales[1]->ptr, ranks.w_scales[1]->ptr}};
    (without == 0 ? scales[0].w : scales[1].a) = nullptr;
    const Status s = launch_all_gather(ranks.comm, good, first_ranks(2), xp.data(), wp.data(), nullptr, yp.data(),
                                       gp.data(), ranks.streams.data(), {}, scales);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(without == 0 ? "w_scale must not be null" : "a_scale must not be null"),
              std::string::npos)
        << s.message();
  }
  ASSERT_CUDA(ranks.synchronize());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(unwritten(*ranks.y[r])) << "rank " << r << "'s Y was written";
    const auto gathered = ranks.gathered[r]->to_host();
    EXPECT_TRUE(std::all_of(gathered.begin(), gathered.end(), [](uint8_t b) { return b == 0xFF; }))
        << "rank " << r << "'s gathered X was written";
  }
}

}  // namespace
}  // namespace tpfuse::testing
