// Errors in the GPU test support and the benchmark. A failed CUDA, cuBLAS or NCCL call throws
// CallFailed naming the call and file:line; a tpfuse call that returns a bad Status throws
// OpFailed, which a benchmark mode catches to mark that shape wrong and go on with the sweep.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "tpfuse/status.h"

namespace tpfuse::testing {

class CallFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class OpFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string call_site(const char* call, const char* file, int line) {
  return std::string(call) + " (" + file + ":" + std::to_string(line) + ")";
}

inline void check_call(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) {
    throw CallFailed(call_site(call, file, line) + " failed: " + cudaGetErrorName(err) + ": " +
                     cudaGetErrorString(err));
  }
}

inline void check_call(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw CallFailed(call_site(call, file, line) + " failed: " + cublasGetStatusName(status) + ": " +
                     cublasGetStatusString(status));
  }
}

inline void check_call(ncclResult_t result, const char* call, const char* file, int line) {
  if (result != ncclSuccess) {
    throw CallFailed(call_site(call, file, line) + " failed: " + ncclGetErrorString(result) + " (" +
                     ncclGetLastError(nullptr) + ")");
  }
}

// Throws OpFailed with the Status's text if a tpfuse call failed.
inline void check_op(const Status& status) {
  if (!status.ok()) throw OpFailed(status.to_string());
}

}  // namespace tpfuse::testing

// Checks a cudaError_t, cublasStatus_t or ncclResult_t; throws CallFailed on failure.
#define TESTING_CHECK(call) ::tpfuse::testing::check_call((call), #call, __FILE__, __LINE__)
