// cuBLASLt's scaled E4M3 GEMM: the unfused path's per-rank product for E4M3 inputs, shared by the
// tests and the benchmark.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "testing/device_buffer.h"
#include "tpfuse/problem.h"

namespace tpfuse::testing {

// A problem's scales (tpfuse/problem.h's layouts) as cuBLASLt reads them. Tensorwise and rowwise:
// the caller's own pointers. Blockwise: copies in cuBLASLt's layouts (its documentation, "128-element
// 1D and 128x128 2D block scaling"), which cuBLASLt's operands swapped (row-major C = A W^T as
// column-major C^T = W A^T) make these:
//   A's (VEC128_32F on cuBLASLt's B): m-major, k_per_rank/128 rows of m (ours: m rows of
//   k_per_rank/128);
//   W's (BLK128x128_32F on cuBLASLt's A): K-major, a row of k_per_rank/128 for each 128 rows of W as
//   ours, but each padded with zeros to a multiple of 4.
// Both 16-byte aligned, as cuBLASLt wants. The copies are queued on `stream` at construction; made
// once per input set, they keep the conversion out of a timed call.
class CublasLtScales {
 public:
  CublasLtScales(const Problem& problem, const InputScales& scales, cudaStream_t stream);
  const InputScales& get() const { return scales_; }

 private:
  DeviceBuffer a_, w_;  // blockwise: the copies
  InputScales scales_;
};

// One per device: a cuBLASLt handle and its workspace, on the device current at construction.
class CublasLtFp8 {
 public:
  CublasLtFp8();
  ~CublasLtFp8();
  CublasLtFp8(const CublasLtFp8&) = delete;
  CublasLtFp8& operator=(const CublasLtFp8&) = delete;

  // c (m x n, BF16) = (a @ w^T) scaled as problem.scaling says, accumulated as
  // problem.accumulation says (fast: CUBLASLT_MATMUL_DESC_FAST_ACCUM): a m x k and w n x k E4M3,
  // scales FP32 on the device. Queued on `stream`; a failed cuBLASLt call throws CallFailed, and so
  // does a problem cuBLASLt does not take: blockwise with fast accumulation (cuBLASLt refuses it, as
  // tpfuse does), or with m not a multiple of 4 (cuBLASLt's M and N must be).
  void gemm(const Problem& problem, const void* a, const void* w, const CublasLtScales& scales, void* c,
            cudaStream_t stream);
  // The same from the problem's own scales, converted on the way (blockwise: the call then waits
  // for `stream`, so that the copies outlive it).
  void gemm(const Problem& problem, const void* a, const void* w, const InputScales& scales, void* c,
            cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace tpfuse::testing
