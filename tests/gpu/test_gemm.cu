// The per-rank GEMM against an FP32 reference and against cuBLAS's own error, on odd shapes too.
#include <cublas_v2.h>

#include <tuple>

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

}  // namespace
}  // namespace tpfuse::testing
