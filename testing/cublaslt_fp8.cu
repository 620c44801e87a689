#include "testing/cublaslt_fp8.h"

#include <cstdint>

namespace tpfuse::testing {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// Frees cuBLASLt's descriptors at the end of a call, thrown out of or not.
template <class T, cublasStatus_t (*kDestroy)(T)>
struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value != nullptr) kDestroy(value);
  }
};

}  // namespace

CublasLtFp8::CublasLtFp8() {
  int device = 0;
  TESTING_CHECK(cudaGetDevice(&device));
  TESTING_CHECK(cublasLtCreate(&handle_));
  workspace_ = DeviceBuffer(device, kWorkspaceBytes);
}

CublasLtFp8::~CublasLtFp8() { cublasLtDestroy(handle_); }

// Row-major C = A W^T is column-major C^T = W A^T: cuBLASLt's A is our W (transposed), its B our
// A, so its A scale is w's. Rowwise scales are its outer-vector scales.
void CublasLtFp8::gemm(const Problem& p, const void* a, const void* w, const InputScales& scales, void* c,
                       cudaStream_t stream) {
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

}  // namespace tpfuse::testing
