#include "testing/cublaslt_fp8.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "testing/gpu_check.h"

namespace tpfuse::testing {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// out[r * row_stride + c * col_stride] = in[r * cols + c]: a row-major rows x cols matrix of scales
// into another layout (transposed, or its rows spread apart).
__global__ void relayout_scales_kernel(const float* in, int64_t rows, int64_t cols, float* out, int64_t row_stride,
                                       int64_t col_stride) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[r * row_stride + c * col_stride] = in[i];
  }
}

// A copy of `in` (of `shape`) laid out by the strides, in a new buffer of `out_count` zeros.
DeviceBuffer relayout_scales(const float* in, ScaleShape shape, size_t out_count, int64_t row_stride,
                             int64_t col_stride, cudaStream_t stream) {
  int device = 0;
  TESTING_CHECK(cudaGetDevice(&device));
  DeviceBuffer out(device, out_count * sizeof(float));
  TESTING_CHECK(cudaMemsetAsync(out.get(), 0, out.bytes(), stream));
  constexpr int kThreads = 256;
  const int blocks = int(std::clamp<size_t>((shape.count() + kThreads - 1) / kThreads, 1, 1024));
  relayout_scales_kernel<<<blocks, kThreads, 0, stream>>>(in, shape.rows, shape.cols, out.as<float>(), row_stride,
                                                          col_stride);
  TESTING_CHECK(cudaGetLastError());
  return out;
}

// Frees cuBLASLt's descriptors at the end of a call, thrown out of or not.
template <class T, cublasStatus_t (*kDestroy)(T)>
struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value != nullptr) kDestroy(value);
  }
};

}  // namespace

CublasLtScales::CublasLtScales(const Problem& problem, const InputScales& scales, cudaStream_t stream)
    : scales_(scales) {
  if (problem.scaling != Scaling::kBlockwise) return;
  const ScaleShapes shapes = scale_shapes(problem);
  // A's m x L transposed: L rows of m.
  a_ = relayout_scales(scales.a, shapes.a, shapes.a.count(), 1, shapes.a.rows, stream);
  // W's rows of L, each padded to a multiple of 4.
  const int64_t padded = (shapes.w.cols + 3) / 4 * 4;
  w_ = relayout_scales(scales.w, shapes.w, size_t(shapes.w.rows * padded), padded, 1, stream);
  scales_ = {a_.as<const float>(), w_.as<const float>()};
}

CublasLtFp8::CublasLtFp8() {
  int device = 0;
  TESTING_CHECK(cudaGetDevice(&device));
  TESTING_CHECK(cublasLtCreate(&handle_));
  workspace_ = DeviceBuffer(device, kWorkspaceBytes);
}

CublasLtFp8::~CublasLtFp8() { cublasLtDestroy(handle_); }

// Row-major C = A W^T is column-major C^T = W A^T: cuBLASLt's A is our W (transposed), its B our
// A, so its A scale is w's. Rowwise scales are its outer-vector scales; blockwise, W's are its
// 128 x 128 blocks' and A's its 128-element vectors' (in CublasLtScales' layouts).
void CublasLtFp8::gemm(const Problem& p, const void* a, const void* w, const CublasLtScales& cublaslt_scales, void* c,
                       cudaStream_t stream) {
  const bool blockwise = p.scaling == Scaling::kBlockwise;
  if (blockwise && p.accumulation == Accumulation::kFast) {
    throw CallFailed("cuBLASLt takes no fast accumulation with blockwise scales: " + p.to_string());
  }
  if (blockwise && p.m % 4 != 0) {
    throw CallFailed("cuBLASLt's blockwise scales need m a multiple of 4: " + p.to_string());
  }
  const InputScales& scales = cublaslt_scales.get();
  Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  TESTING_CHECK(cublasLtMatmulDescCreate(&desc.value, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    TESTING_CHECK(cublasLtMatmulDescSetAttribute(desc.value, attribute, value, bytes));
  };
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.w, sizeof(scales.w));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.a, sizeof(scales.a));
  if (p.scaling == Scaling::kRowwise) {
    const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer));
  } else if (blockwise) {
    const cublasLtMatmulMatrixScale_t blocks = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t vectors = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blocks, sizeof(blocks));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vectors, sizeof(vectors));
  }
  const int8_t fast = p.accumulation == Accumulation::kFast ? 1 : 0;
  set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
  Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> la, lb, lc;
  TESTING_CHECK(cublasLtMatrixLayoutCreate(&la.value, CUDA_R_8F_E4M3, uint64_t(p.k_per_rank), uint64_t(p.n),
                                           int64_t(p.k_per_rank)));
  TESTING_CHECK(cublasLtMatrixLayoutCreate(&lb.value, CUDA_R_8F_E4M3, uint64_t(p.k_per_rank), uint64_t(p.m),
                                           int64_t(p.k_per_rank)));
  TESTING_CHECK(cublasLtMatrixLayoutCreate(&lc.value, CUDA_R_16BF, uint64_t(p.n), uint64_t(p.m), int64_t(p.n)));
  Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> preference;
  TESTING_CHECK(cublasLtMatmulPreferenceCreate(&preference.value));
  const size_t workspace_bytes = workspace_.bytes();
  TESTING_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  TESTING_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc.value, la.value, lb.value, lc.value, lc.value,
                                               preference.value, 1, &heuristic, &found));
  if (found == 0) throw CallFailed("cuBLASLt has no scaled E4M3 algorithm for " + p.to_string());
  const float alpha = 1, beta = 0;
  TESTING_CHECK(cublasLtMatmul(handle_, desc.value, &alpha, w, la.value, a, lb.value, &beta, c, lc.value, c, lc.value,
                               &heuristic.algo, workspace_.get(), workspace_bytes, stream));
}

void CublasLtFp8::gemm(const Problem& p, const void* a, const void* w, const InputScales& scales, void* c,
                       cudaStream_t stream) {
  const CublasLtScales converted(p, scales, stream);
  gemm(p, a, w, converted, c, stream);
  if (p.scaling == Scaling::kBlockwise) TESTING_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace tpfuse::testing
