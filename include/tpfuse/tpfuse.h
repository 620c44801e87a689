// tpfuse: fused GEMM + reduce-scatter for tensor-parallel row-parallel linear layers.
//
// Every call returns a Status; the library never exits or aborts.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// The per-rank GEMM: c = a @ w, BF16 inputs, FP32 accumulation, BF16 output (m x n, row-major).
// `a` is m x k_per_rank row-major; `w` is laid out as problem.weight_layout says. All pointers
// are device pointers, 16-byte aligned. world_size is ignored (this is one rank's partial product).
// Asynchronous on `stream`.
Status gemm(const Problem& problem, const void* a, const void* w, void* c, cudaStream_t stream);

}  // namespace tpfuse
