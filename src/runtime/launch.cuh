// From a chosen config to a running kernel: the compiled variants, the mainloop's tensor maps, and
// the launch. Shared by the plain GEMM and the fused op.
#pragma once

#include <cstdio>

#include "kernels/gemm_mainloop.cuh"
#include "plan/config.h"
#include "runtime/cuda_check.h"
#include "runtime/env_params.h"
#include "runtime/tensor_map.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// Calls fn(MainloopConfig<...>{}) with the compiled variant that matches the config and layout.
template <class Fn>
Status with_mainloop_config(const GemmConfig& c, WeightLayout layout, Fn&& fn) {
  using kernels::MainloopConfig;
  const bool k_major = layout == WeightLayout::kNxK;
  if (c.block_k == 64 && c.consumer_warpgroups == 2) {
    if (c.block_m == 128 && c.block_n == 256 && c.stages == 3) {
      return k_major ? fn(MainloopConfig<128, 256, 3, true>{}) : fn(MainloopConfig<128, 256, 3, false>{});
    }
    if (c.block_m == 128 && c.block_n == 192 && c.stages == 4) {
      return k_major ? fn(MainloopConfig<128, 192, 4, true>{}) : fn(MainloopConfig<128, 192, 4, false>{});
    }
    if (c.block_m == 64 && c.block_n == 256 && c.stages == 4) {
      return k_major ? fn(MainloopConfig<64, 256, 4, true>{}) : fn(MainloopConfig<64, 256, 4, false>{});
    }
  }
  return Status::Internal("no compiled kernel variant for config: " + c.to_string());
}

// The mainloop's operands: A (m x k) and W in its layout, and the tile schedule of `rank`.
template <class Config>
Status make_mainloop_params(const Problem& problem, const GemmConfig& config, int rank, const void* a, const void* w,
                            kernels::MainloopParams* p) {
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(a, m, k, k, Config::kBlockM, Config::kBlockK, &p->a));
  if (Config::kWeightKMajor) {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(w, n, k, k, Config::kBlockN, Config::kBlockK, &p->w));
  } else {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(w, k, n, n, Config::kBlockK, 64, &p->w));
  }
  p->schedule.world_size = problem.world_size;
  p->schedule.rank = rank;
  p->schedule.m = int(m);
  p->schedule.n = int(n);
  p->schedule.block_m = Config::kBlockM;
  p->schedule.block_n = Config::kBlockN;
  p->schedule.group_rows = config.group_rows;
  p->num_k_blocks = int((k + Config::kBlockK - 1) / Config::kBlockK);
  return Status::Ok();
}

template <class Config, class Epilogue>
Status launch_gemm_kernel(const kernels::KernelParams<Epilogue>& params, const GemmConfig& config,
                          cudaStream_t stream) {
  const auto kernel = kernels::gemm_kernel<Config, Epilogue>;
  const size_t smem = sizeof(kernels::SharedStorage<Config>) + 1024;
  if (smem > config.smem_bytes()) {
    return Status::Internal("kernel needs " + std::to_string(smem) + " bytes of shared memory, the config planned " +
                            std::to_string(config.smem_bytes()));
  }
  const int grid = std::min(config.num_ctas, params.mainloop.schedule.num_tiles());
  if (params::debug()) {
    std::fprintf(stderr, "tpfuse: launch grid %d x %d threads, %zu B smem, %d tiles, %d k-blocks\n", grid,
                 Config::kThreads, smem, params.mainloop.schedule.num_tiles(), params.mainloop.num_k_blocks);
  }
  TPFUSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, Config::kThreads, smem, stream>>>(params);
  TPFUSE_CUDA_TRY(cudaGetLastError());
  return Status::Ok();
}

}  // namespace tpfuse
