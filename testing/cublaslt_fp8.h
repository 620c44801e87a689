// cuBLASLt's scaled E4M3 GEMM: the unfused path's per-rank product for E4M3 inputs, shared by the
// tests and the benchmark.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "testing/device_buffer.h"
#include "tpfuse/problem.h"

namespace tpfuse::testing {

// One per device: a cuBLASLt handle and its workspace, on the device current at construction.
class CublasLtFp8 {
 public:
  CublasLtFp8();
  ~CublasLtFp8();
  CublasLtFp8(const CublasLtFp8&) = delete;
  CublasLtFp8& operator=(const CublasLtFp8&) = delete;

  // c (m x n, BF16) = (a @ w^T) scaled as problem.scaling says, accumulated as
  // problem.accumulation says (fast: CUBLASLT_MATMUL_DESC_FAST_ACCUM): a m x k and w n x k E4M3,
  // scales FP32 on the device. Queued on `stream`; a failed cuBLASLt call throws CallFailed.
  void gemm(const Problem& problem, const void* a, const void* w, const InputScales& scales, void* c,
            cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace tpfuse::testing
