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

class GemmShapes : public ::testing::TestWithParam<std::tuple<int, int, int, WeightLayout>> {};

TEST_P(GemmShapes, MatchesReferenceWithinCublasError) {
  const auto [m, n, k, layout] = GetParam();
  const Problem p{m, n, k, 1, layout};
  DeviceBuffer<__nv_bfloat16> a(size_t(m) * k), w(size_t(k) * n), c(size_t(m) * n), c_cublas(size_t(m) * n);
  DeviceBuffer<float> ref(size_t(m) * n);
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
    const Errors ours = compare(c.to_host(), ref_host);
    const Errors theirs = compare(c_cublas.to_host(), ref_host);
    EXPECT_EQ(ours.non_finite, 0u) << "unwritten (poisoned) or non-finite outputs";
    EXPECT_LE(ours.max_rel, 1.1 * theirs.max_rel + 1e-7) << "cuBLAS max_rel " << theirs.max_rel;
    EXPECT_LE(ours.norm_rel, 1.1 * theirs.norm_rel + 1e-7) << "cuBLAS norm_rel " << theirs.norm_rel;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmShapes,
    ::testing::Combine(::testing::Values(8, 64, 200, 512), ::testing::Values(8, 264, 1000, 8192),
                       ::testing::Values(8, 72, 1024), ::testing::Values(WeightLayout::kKxN, WeightLayout::kNxK)));

class GemmExact : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(GemmExact, SmallIntegersBitForBit) {
  const Problem p{1000, 776, 256, 1, GetParam()};
  DeviceBuffer<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n), c(size_t(p.m) * p.n);
  DeviceBuffer<float> ref(size_t(p.m) * p.n);
  fill_small_ints(a.ptr, a.count, 3);
  fill_small_ints(w.ptr, w.count, 4);
  poison(c.ptr, c.count);
  reference_gemm(p, a.ptr, w.ptr, ref.ptr);
  ASSERT_TRUE(gemm(p, a.ptr, w.ptr, c.ptr, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const int64_t bad = first_mismatch(c.to_host(), ref.to_host());
  EXPECT_EQ(bad, -1) << "first mismatch at row " << bad / p.n << ", column " << bad % p.n;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GemmExact, ::testing::Values(WeightLayout::kKxN, WeightLayout::kNxK));

TEST(GemmErrors, BadArgumentsAreReportedNotRun) {
  DeviceBuffer<__nv_bfloat16> buf(1 << 16);
  const Problem good{64, 64, 64};
  Status s = gemm(good, nullptr, buf.ptr, buf.ptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a"), std::string::npos) << s.message();
  s = gemm(good, buf.ptr, buf.ptr + 1, buf.ptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "misaligned w";
  s = gemm(Problem{64, 60, 64}, buf.ptr, buf.ptr, buf.ptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "n not a multiple of 8";
  EXPECT_NE(s.message().find("n"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpfuse::testing
