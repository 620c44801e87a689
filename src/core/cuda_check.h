// CUDA errors as Status values: the library reports, never exits.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "tpfuse/status.h"

namespace tpfuse {

inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(err) + " (" +
                                            file + ":" + std::to_string(line) + ")");
}

}  // namespace tpfuse

#define TPFUSE_CUDA_TRY(call) TPFUSE_RETURN_IF_ERROR(::tpfuse::cuda_status((call), #call, __FILE__, __LINE__))
