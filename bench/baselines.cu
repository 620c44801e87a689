#include "baselines.h"

#include <cublas_v2.h>

#include "testing/cuda_errors.h"

namespace tpfuse::bench {

// cuBLAS is column-major. A row-major matrix is its transpose in column-major, so
// C = A @ W (row-major) is C^T = W^T A^T (column-major): cuBLAS's "A" is W, its "B" is A, m and n swap.
//   kKxN: W row-major k x n is column-major n x k, ld = n: no transpose.
//   kNxK: W row-major n x k is column-major k x n, ld = k: transposed.
// A row-major m x k is column-major k x m (ld = k); C row-major m x n is column-major n x m (ld = n).
void cublas_gemm(cublasHandle_t handle, const Problem& problem, const void* a, const void* w, void* c) {
  const int m = int(problem.m), n = int(problem.n), k = int(problem.k_per_rank);
  const bool w_is_nxk = problem.weight_layout == WeightLayout::kNxK;
  const cublasOperation_t op_w = w_is_nxk ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_w = w_is_nxk ? k : n;
  const float alpha = 1.0f, beta = 0.0f;
  TESTING_CHECK(cublasGemmEx(handle, op_w, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, ld_w, a, CUDA_R_16BF, k,
                           &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void nccl_reduce_scatter(ncclComm_t comm, const void* partial, void* out, size_t partial_count, int num_ranks,
                         cudaStream_t stream) {
  TESTING_CHECK(ncclReduceScatter(partial, out, partial_count / size_t(num_ranks), ncclBfloat16, ncclSum, comm, stream));
}

}  // namespace tpfuse::bench
