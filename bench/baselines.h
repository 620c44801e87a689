// The unfused path tpfuse is measured against: a cuBLAS GEMM per rank, then an NCCL reduce-scatter.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>

#include "tpfuse/problem.h"

namespace tpfuse::bench {

// c = a @ w for one rank: row-major BF16 in and out, FP32 accumulation, on the handle's stream.
// a is m x k_per_rank; w is k_per_rank x n (kKxN) or n x k_per_rank (kNxK); c is m x n.
void cublas_gemm(cublasHandle_t handle, const Problem& problem, const void* a, const void* w, void* c);

// Queues one rank's part of the BF16 sum reduce-scatter of a `partial_count`-element partial: the
// rank receives its partial_count / ranks consecutive elements (its rows). Call between
// ncclGroupStart and ncclGroupEnd when one thread drives several GPUs.
void nccl_reduce_scatter(ncclComm_t comm, const void* partial, void* out, size_t partial_count, int num_ranks,
                         cudaStream_t stream);

}  // namespace tpfuse::bench
