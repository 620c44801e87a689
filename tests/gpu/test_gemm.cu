// The per-rank GEMM against an FP32 reference and against cuBLAS's own error, on odd shapes too.
#include <cublas_v2.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/device_info.h"
#include "gemm/config.h"
#include "gpu_testing.cuh"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {
namespace {

void cublas_gemm(const Problem& p, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c) {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    cublasCreate(&h);
    return h;
  }();
  const float alpha = 1, beta = 0;
  // Row-major C = A @ W is column-major C^T = W^T A^T.
  const bool k_major = p.weight_layout == WeightLayout::kNxK;
  ASSERT_EQ(cublasGemmEx(handle, k_major ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(p.n), int(p.m),
                         int(p.k_per_rank), &alpha, w, CUDA_R_16BF, int(k_major ? p.k_per_rank : p.n), a, CUDA_R_16BF,
                         int(p.k_per_rank), &beta, c, CUDA_R_16BF, int(p.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
}

using GemmShape = std::tuple<int, int, int, WeightLayout>;  // m, n, k, layout

std::string shape_name(const ::testing::TestParamInfo<GemmShape>& info) {
  return "M" + std::to_string(std::get<0>(info.param)) + "_N" + std::to_string(std::get<1>(info.param)) + "_K" +
         std::to_string(std::get<2>(info.param)) + "_" + to_string(std::get<3>(info.param));
}

class GemmShapes : public ::testing::TestWithParam<GemmShape> {};

TEST_P(GemmShapes, MatchesReferenceWithinCublasError) {
  const auto [m, n, k, layout] = GetParam();
  const Problem p{m, n, k, 1, layout};
  DeviceArray<__nv_bfloat16> a(size_t(m) * k), w(size_t(k) * n), c(size_t(m) * n), c_cublas(size_t(m) * n);
  DeviceArray<float> ref(size_t(m) * n);
  for (uint64_t seed : {1, 2}) {
    fill_random(a.ptr, a.count, seed * 7 + m);
    fill_random(w.ptr, w.count, seed * 13 + n);
    poison(c.ptr, c.count);
    reference_gemm(p, a.ptr, w.ptr, ref.ptr);
    cublas_gemm(p, a.ptr, w.ptr, c_cublas.ptr);
    const Status s = gemm(p, a.ptr, w.ptr, c.ptr, nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    const auto ref_host = ref.to_host();
    const ErrorSums ours_sums = error_sums(c.to_host(), ref_host);
    EXPECT_EQ(ours_sums.num_nonfinite, 0u) << "unwritten (poisoned) or non-finite outputs";
    const ErrorStats ours = ours_sums.stats(), theirs = error_sums(c_cublas.to_host(), ref_host).stats();
    // A little absolute slack: on tiny K both can be exact.
    EXPECT_LE(ours.max_rel, kErrorFactor * theirs.max_rel + 1e-7) << "cuBLAS max_rel " << theirs.max_rel;
    EXPECT_LE(ours.norm_rel, kErrorFactor * theirs.norm_rel + 1e-7) << "cuBLAS norm_rel " << theirs.norm_rel;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmShapes,
    ::testing::Combine(::testing::Values(8, 64, 200, 512), ::testing::Values(8, 264, 1000, 8192),
                       ::testing::Values(8, 72, 1024), ::testing::Values(WeightLayout::kKxN, WeightLayout::kNxK)),
    shape_name);

class GemmExact : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(GemmExact, SmallIntegersBitForBit) {
  const Problem p{1000, 776, 256, 1, GetParam()};
  DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n), c(size_t(p.m) * p.n);
  DeviceArray<float> ref(size_t(p.m) * p.n);
  fill_small_ints(a.ptr, a.count, 3);
  fill_small_ints(w.ptr, w.count, 4);
  poison(c.ptr, c.count);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
  EXPECT_EQ(bad, -1) << "first mismatch at " << element_at(bad, p.n);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GemmExact, ::testing::Values(WeightLayout::kKxN, WeightLayout::kNxK),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Each bad argument is reported, naming itself, and nothing runs: the poisoned output stays so.
TEST(GemmErrors, BadArgumentsAreReportedNotRun) {
  DeviceArray<__nv_bfloat16> buf(1 << 16), c(64 * 64);
  poison(c.ptr, c.count);
  const Problem good{64, 64, 64};
  struct Case {
    Status status;
    const char* message;
  };
  ConfigOverrides bad_block_n;
  bad_block_n.block_n = 100;
  const Case cases[] = {
      {gemm(good, nullptr, buf.ptr, c.ptr, nullptr), "a must not be null"},
      {gemm(good, buf.ptr, buf.ptr + 1, c.ptr, nullptr), "is not 16-byte aligned"},
      {gemm(good, buf.ptr, buf.ptr, nullptr, nullptr), "c must not be null"},
      {gemm(Problem{64, 60, 64}, buf.ptr, buf.ptr, c.ptr, nullptr), "problem.n = 60 is not a multiple of 8"},
      {gemm(Problem{0, 64, 64}, buf.ptr, buf.ptr, c.ptr, nullptr), "problem.m = 0 must be positive"},
      {gemm(good, buf.ptr, buf.ptr, c.ptr, nullptr, bad_block_n), "overrides.block_n = 100"},
  };
  for (const Case& t : cases) {
    EXPECT_EQ(t.status.code(), StatusCode::kInvalidArgument) << t.message;
    EXPECT_NE(t.status.message().find(t.message), std::string::npos) << t.status.message();
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(error_sums(c.to_host(), std::vector<float>(c.count, 0.0f)).num_nonfinite, c.count) << "a bad call wrote c";
}

// The overrides reach the launch: a 192-wide tile on a shape whose own choice is 256 wide, and
// other raster groups, compute the same product (bit for bit on small integers).
TEST(GemmOverrides, VariantsComputeTheSameProduct) {
  const Problem p{1000, 776, 256, 1, WeightLayout::kNxK};
  DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n), c(size_t(p.m) * p.n);
  DeviceArray<float> ref(size_t(p.m) * p.n);
  fill_small_ints(a.ptr, a.count, 5);
  fill_small_ints(w.ptr, w.count, 6);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  ConfigOverrides narrow;
  narrow.block_n = 192;
  narrow.group_rows = 3;
  for (const ConfigOverrides& o : {ConfigOverrides{}, narrow}) {
    poison(c.ptr, c.count);
    ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr, o).ok()) << o.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
    EXPECT_EQ(bad, -1) << o.to_string() << ": first mismatch at " << element_at(bad, p.n);
  }
}

// ---- Small M: split K (gemm/split_k.h) ----------------------------------------------------------

// The config this device gives `p` under `o`, so that a test knows whether (and how) it splits.
GemmConfig config_of(const Problem& p, const ConfigOverrides& o = {}) {
  DeviceInfo device;
  GemmConfig c;
  EXPECT_TRUE(current_device_info(&device).ok());
  const Status s = select_plain_gemm_config(p, device, o, &c);
  EXPECT_TRUE(s.ok()) << p.to_string() << ": " << s.to_string();
  return c;
}

// The swap-AB kernel with more 64-column tiles than CTAs (each CTA walks several, its ring going on
// across them), N and K not multiples of its tile and K block, A's rows padded (5 of 8): bit for bit.
TEST(GemmSwapAb, SeveralTilesPerCtaBitForBit) {
  for (const WeightLayout layout : {WeightLayout::kKxN, WeightLayout::kNxK}) {
    const Problem p{5, 20000, 136, 1, layout};
    DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n), c(size_t(p.m) * p.n);
    DeviceArray<float> ref(size_t(p.m) * p.n);
    fill_small_ints(a.ptr, a.count, 7);
    fill_small_ints(w.ptr, w.count, 8);
    reference_gemm(p, a.ptr, w.ptr, ref.ptr);
    poison(c.ptr, c.count);
    ConfigOverrides o;
    o.swap_ab = 1;
    ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr, o).ok()) << p.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
    EXPECT_EQ(bad, -1) << p.to_string() << ": first mismatch at " << element_at(bad, p.n);
  }
}

// What a call runs: the swap-AB kernel's rows, or the tiled kernel's config.
std::string kernel_of(const Problem& p, const ConfigOverrides& o) {
  DeviceInfo device;
  EXPECT_TRUE(current_device_info(&device).ok());
  const int rows = swap_ab_rows(p, device, o);
  return rows != 0 ? "swap_ab rows " + std::to_string(rows) : config_of(p, o).to_string();
}

ConfigOverrides split_in(int splits) {
  ConfigOverrides o;
  o.split_k = splits;
  return o;
}

// "" when a and b (BF16, row-major, `cols` columns) are bit-identical, else where they first differ
// and how many elements do.
std::string difference(const std::vector<bf16>& a, const std::vector<bf16>& b, int64_t cols) {
  int64_t first = -1, count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (*reinterpret_cast<const uint16_t*>(&a[i]) != *reinterpret_cast<const uint16_t*>(&b[i])) {
      if (first < 0) first = int64_t(i);
      ++count;
    }
  }
  if (first < 0) return "";
  return std::to_string(count) + " of " + std::to_string(a.size()) + " elements differ, the first at " +
         element_at(first, cols) + ": " + std::to_string(__bfloat162float(a[first])) + " against " +
         std::to_string(__bfloat162float(b[first]));
}

// The overrides a split test runs: the config's own split, and forced splits in 2 and 3 where they
// fit the shape (one wave of steps, a K block a split); at M <= 64 the same on tiles 64 and 128
// wide (one consumer and two), at M <= 256 on 128 wide (128 x 128 tiles where they tie with 64 x 128)
// and 192 wide (64 x 192 on one consumer where its tiles make one wave); at M <= 64 also the
// swap-AB kernel and, where the config takes that, the tiled kernel's own choice.
std::vector<ConfigOverrides> split_overrides(const Problem& p) {
  std::vector<ConfigOverrides> out = {ConfigOverrides{}};
  DeviceInfo device;
  if (!current_device_info(&device).ok()) return out;
  if (p.m <= 64) {
    for (int swap_ab : {0, 1}) {
      ConfigOverrides o;
      o.swap_ab = swap_ab;
      out.push_back(o);
    }
  }
  for (int block_n : {0, 64, 128, 192}) {
    if ((block_n == 64 && p.m > 64) || ((block_n == 128 || block_n == 192) && p.m > 256)) continue;
    for (int splits : {0, 2, 3}) {
      ConfigOverrides o = split_in(splits);
      o.block_n = block_n;
      GemmConfig c;
      if ((block_n != 0 || splits != 0) && select_plain_gemm_config(p, device, o, &c).ok()) out.push_back(o);
    }
  }
  return out;
}

// Three calls of `p` with overrides `o` into the poisoned `c`: the first within 1.1x cuBLAS's error
// (`theirs`) against the FP32 reference, every output written; the others bit-identical to it.
void expect_within_cublas_error_run_to_run(const Problem& p, const DeviceArray<__nv_bfloat16>& a,
                                           const DeviceArray<__nv_bfloat16>& w, DeviceArray<__nv_bfloat16>& c,
                                           const std::vector<float>& ref_host, const ErrorStats& theirs,
                                           const ConfigOverrides& o, const std::string& what) {
  std::vector<bf16> first_run;
  for (int run = 0; run < 3; ++run) {
    poison(c.ptr, c.count);
    const Status s = gemm(p, a.ptr, w.ptr, c.ptr, nullptr, o);
    ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<bf16> out = c.to_host();
    if (run > 0) {
      EXPECT_EQ(difference(out, first_run, p.n), "") << what << ": run " << run << " against run 0";
      continue;
    }
    first_run = out;
    const ErrorSums ours_sums = error_sums(out, ref_host);
    EXPECT_EQ(ours_sums.num_nonfinite, 0u) << what << ": unwritten (poisoned) or non-finite outputs";
    const ErrorStats ours = ours_sums.stats();
    EXPECT_LE(ours.max_rel, kErrorFactor * theirs.max_rel + 1e-7) << what << ": cuBLAS max_rel " << theirs.max_rel;
    EXPECT_LE(ours.norm_rel, kErrorFactor * theirs.norm_rel + 1e-7) << what << ": cuBLAS norm_rel " << theirs.norm_rel;
  }
}

class GemmSplitK : public ::testing::TestWithParam<GemmShape> {};

// Random inputs: every split within 1.1x cuBLAS's error, and bit-identical run to run.
TEST_P(GemmSplitK, WithinCublasErrorRunToRun) {
  const auto [m, n, k, layout] = GetParam();
  const Problem p{m, n, k, 1, layout};
  const std::vector<ConfigOverrides> overrides = split_overrides(p);
  // Besides the swap-AB kernel's two: the config's own call and at least one forced split or width.
  const auto tiled = [](const ConfigOverrides& o) { return o.swap_ab == -1; };
  ASSERT_GT(std::count_if(overrides.begin(), overrides.end(), tiled), 1)
      << p.to_string() << " was meant to split, at least when forced";
  DeviceArray<__nv_bfloat16> a(size_t(m) * k), w(size_t(k) * n), c(size_t(m) * n), c_cublas(size_t(m) * n);
  DeviceArray<float> ref(size_t(m) * n);
  fill_random(a.ptr, a.count, 11 + m);
  fill_random(w.ptr, w.count, 17 + n);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  cublas_gemm(p, a.ptr, w.ptr, c_cublas.ptr);
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto ref_host = ref.to_host();
  const ErrorStats theirs = error_sums(c_cublas.to_host(), ref_host).stats();
  for (const ConfigOverrides& o : overrides) {
    expect_within_cublas_error_run_to_run(p, a, w, c, ref_host, theirs, o, p.to_string() + ", " + kernel_of(p, o));
  }
}

// Small integers: every partial and every sum is exact, so every split gives the unsplit GEMM's
// output (and the reference's) bit for bit.
TEST_P(GemmSplitK, SmallIntegersBitIdenticalToUnsplit) {
  const auto [m, n, k, layout] = GetParam();
  const Problem p{m, n, k, 1, layout};
  DeviceArray<__nv_bfloat16> a(size_t(m) * k), w(size_t(k) * n), c(size_t(m) * n);
  DeviceArray<float> ref(size_t(m) * n);
  fill_small_ints(a.ptr, a.count, 21 + m);
  fill_small_ints(w.ptr, w.count, 23 + n);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  poison(c.ptr, c.count);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr, split_in(1)).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<bf16> unsplit = c.to_host();
  const int64_t bad = first_mismatch(unsplit, ref.to_host());
  ASSERT_EQ(bad, -1) << p.to_string() << " unsplit: first mismatch with the reference at " << element_at(bad, n);
  for (const ConfigOverrides& o : split_overrides(p)) {
    poison(c.ptr, c.count);
    ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr, o).ok());
    ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(difference(c.to_host(), unsplit, n), "") << p.to_string() << ", " << kernel_of(p, o);
  }
}

// M = 1 .. 64 (64-row tiles, rows past M never stored), 128 and 200 (128-row tiles, a clipped slab),
// N and K whole tiles and K blocks or not.
INSTANTIATE_TEST_SUITE_P(
    SmallM, GemmSplitK,
    ::testing::Combine(::testing::Values(1, 8, 24, 64, 128, 200),
                       ::testing::Values(8192, 1000, 264), ::testing::Values(1024, 1000, 2056),
                       ::testing::Values(WeightLayout::kKxN, WeightLayout::kNxK)),
    shape_name);

// A split tail (the tiles past the last full wave, gemm/split_k.h): the config splits it on these
// shapes (272 tiles of 128 x 128, the last row and column clipped or not, 8 past two waves of 132,
// K in 80 or 79 K blocks; 180 of 128 x 192, K in 20). Random inputs: within 1.1x cuBLAS's error
// and bit-identical run to run; small integers: bit-identical to the unsplit GEMM.
class GemmSplitTail : public ::testing::TestWithParam<GemmShape> {};

TEST_P(GemmSplitTail, WithinCublasErrorAndExactAsUnsplit) {
  const auto [m, n, k, layout] = GetParam();
  const Problem p{m, n, k, 1, layout};
  DeviceInfo device;
  ASSERT_TRUE(current_device_info(&device).ok());
  GemmConfig config;
  ASSERT_TRUE(select_plain_gemm_config(p, device, {}, &config).ok());
  if (device.num_sms != 132) GTEST_SKIP() << "the shapes are sized for 132 SMs; this GPU has " << device.num_sms;
  ASSERT_GT(config.whole_tiles, 0) << p.to_string() << " -> " << config.to_string() << ": meant to split its tail";
  DeviceArray<__nv_bfloat16> a(size_t(m) * k), w(size_t(k) * n), c(size_t(m) * n), c_cublas(size_t(m) * n);
  DeviceArray<float> ref(size_t(m) * n);
  fill_random(a.ptr, a.count, 31 + m);
  fill_random(w.ptr, w.count, 37 + n);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  cublas_gemm(p, a.ptr, w.ptr, c_cublas.ptr);
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto ref_host = ref.to_host();
  const ErrorStats theirs = error_sums(c_cublas.to_host(), ref_host).stats();
  const std::string what = p.to_string() + " -> " + config.to_string();
  expect_within_cublas_error_run_to_run(p, a, w, c, ref_host, theirs, {}, what);
  fill_small_ints(a.ptr, a.count, 41 + m);
  fill_small_ints(w.ptr, w.count, 43 + n);
  poison(c.ptr, c.count);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr, split_in(1)).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<bf16> unsplit = c.to_host();
  poison(c.ptr, c.count);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(difference(c.to_host(), unsplit, n), "") << what << ": small integers against the unsplit GEMM";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmSplitTail,
                         ::testing::Values(GemmShape{4352, 1024, 5120, WeightLayout::kKxN},
                                           GemmShape{4300, 1000, 5056, WeightLayout::kNxK},
                                           // A small one for the sanitizers: 180 tiles of 128 x 192, K 20 blocks.
                                           GemmShape{5760, 768, 1280, WeightLayout::kKxN}),
                         shape_name);

// The calls of a split test sequence: shapes whose splits differ (and one unsplit), both layouts.
struct SplitCall {
  Problem problem;
  ConfigOverrides overrides;
};

std::vector<SplitCall> split_calls() {
  return {{Problem{8, 8192, 1024, 1, WeightLayout::kNxK}, split_in(4)},    // 32 tiles of 64 x 256 x 4
          {Problem{64, 6144, 2048, 1, WeightLayout::kKxN}, split_in(5)},   // 24 tiles of 64 x 256 x 5
          {Problem{1, 1000, 1000, 1, WeightLayout::kNxK}, split_in(2)},    // 16 tiles of 64 x 64 x 2
          {Problem{256, 8192, 1024, 1, WeightLayout::kKxN}, split_in(2)},  // 64 tiles of 128 x 256 x 2
          {Problem{24, 264, 2056, 1, WeightLayout::kNxK}, split_in(1)},    // unsplit
          {Problem{24, 264, 2056, 1, WeightLayout::kKxN}, {}},             // the config's: 5 tiles of 64 x 64 x 3
          {Problem{128, 6144, 768, 1, WeightLayout::kNxK}, split_in(4)}};  // 32 tiles of 128 x 192 x 4
}

// Each call's operands (small integers) and its expected output: the unsplit GEMM's.
struct SplitCallData {
  DeviceArray<__nv_bfloat16> a, w, c;
  std::vector<bf16> expected;
  explicit SplitCallData(const Problem& p)
      : a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n), c(size_t(p.m) * p.n) {}
};

std::vector<std::unique_ptr<SplitCallData>> prepare(const std::vector<SplitCall>& calls) {
  std::vector<std::unique_ptr<SplitCallData>> data;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Problem& p = calls[i].problem;
    data.push_back(std::make_unique<SplitCallData>(p));
    fill_small_ints(data[i]->a.ptr, data[i]->a.count, 31 + i);
    fill_small_ints(data[i]->w.ptr, data[i]->w.count, 37 + i);
    EXPECT_TRUE(gemm(p, data[i]->a.ptr, data[i]->w.ptr, data[i]->c.ptr, nullptr, split_in(1)).ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    data[i]->expected = data[i]->c.to_host();
  }
  return data;
}

// Back to back on one stream, no synchronization between: the counters every call leaves at 0
// serve the next one, whatever its tiles and splits. Twice round, so that each shape follows another.
TEST(GemmSplitKCalls, BackToBackOnOneStream) {
  const std::vector<SplitCall> calls = split_calls();
  auto data = prepare(calls);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < calls.size(); ++i) {
      poison_bf16(data[i]->c.ptr, data[i]->c.count, stream);
      const Status s = gemm(calls[i].problem, data[i]->a.ptr, data[i]->w.ptr, data[i]->c.ptr, stream, calls[i].overrides);
      ASSERT_TRUE(s.ok()) << calls[i].problem.to_string() << ": " << s.to_string();
    }
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(difference(data[i]->c.to_host(), data[i]->expected, calls[i].problem.n), "")
          << "round " << round << ", " << calls[i].problem.to_string() << ", "
          << config_of(calls[i].problem, calls[i].overrides).to_string();
    }
  }
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

// Calls on two streams at once: each stream has a workspace of its own.
TEST(GemmSplitKCalls, TwoStreamsOverlap) {
  const std::vector<SplitCall> calls = split_calls();
  auto data = prepare(calls);
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (size_t i = 0; i < calls.size(); ++i) {
      cudaStream_t stream = streams[i % 2];
      poison_bf16(data[i]->c.ptr, data[i]->c.count, stream);
      ASSERT_TRUE(gemm(calls[i].problem, data[i]->a.ptr, data[i]->w.ptr, data[i]->c.ptr, stream, calls[i].overrides).ok());
    }
    ASSERT_CUDA(cudaDeviceSynchronize());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(difference(data[i]->c.to_host(), data[i]->expected, calls[i].problem.n), "")
          << "repeat " << repeat << ", stream " << i % 2 << ", " << calls[i].problem.to_string();
    }
  }
  for (cudaStream_t s : streams) ASSERT_CUDA(cudaStreamDestroy(s));
}

// The calls captured in a CUDA graph (on a stream that never ran a split call, so its workspace is
// allocated during the capture) and replayed: every replay gives the expected outputs, with no reset
// of the counters between replays.
TEST(GemmSplitKCalls, CudaGraphReplays) {
  const std::vector<SplitCall> calls = split_calls();
  auto data = prepare(calls);
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (size_t i = 0; i < calls.size(); ++i) {
    const Status s = gemm(calls[i].problem, data[i]->a.ptr, data[i]->w.ptr, data[i]->c.ptr, stream, calls[i].overrides);
    EXPECT_TRUE(s.ok()) << "captured " << calls[i].problem.to_string() << ": " << s.to_string();
  }
  ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    for (size_t i = 0; i < calls.size(); ++i) poison_bf16(data[i]->c.ptr, data[i]->c.count, stream);
    ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(difference(data[i]->c.to_host(), data[i]->expected, calls[i].problem.n), "")
          << "replay " << replay << ", " << calls[i].problem.to_string();
    }
  }
  // A direct call on the same stream after the replays still finds its counters at 0.
  poison_bf16(data[0]->c.ptr, data[0]->c.count, stream);
  ASSERT_TRUE(gemm(calls[0].problem, data[0]->a.ptr, data[0]->w.ptr, data[0]->c.ptr, stream, calls[0].overrides).ok());
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(difference(data[0]->c.to_host(), data[0]->expected, calls[0].problem.n), "") << "direct after replays";
  ASSERT_CUDA(cudaGraphExecDestroy(exec));
  ASSERT_CUDA(cudaGraphDestroy(graph));
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tpfuse::testing
