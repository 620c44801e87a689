// The per-rank GEMM: one rank's partial product with the mainloop the fused ops are built on.
// Needs only the CUDA runtime's header.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// c = a @ w: BF16 inputs, FP32 accumulation, BF16 output (m x n, row-major). `a` is m x k_per_rank
// row-major; `w` is laid out as problem.weight_layout says. Device pointers, 16-byte aligned.
// problem.world_size is ignored. Asynchronous on `stream`.
Status gemm(const Problem& problem, const void* a, const void* w, void* c, cudaStream_t stream,
            const ConfigOverrides& overrides = {});

}  // namespace tpfuse
