// From a chosen config to a running kernel: the compiled variants, the mainloop's tensor maps, and
// the launch. Shared by the plain GEMM and the fused op.
#pragma once

#include <cstdio>

#include "kernels/gemm_mainloop.cuh"
#include "plan/config.h"
#include "runtime/cuda_check.h"
#include "runtime/device_info.h"
#include "runtime/env_params.h"
#include "runtime/tensor_map.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// Calls fn(MainloopConfig<...>{}) with the compiled variant that matches the config and layout.
template <int kCluster, class Fn>
Status with_tile_config(const GemmConfig& c, bool k_major, Fn&& fn) {
  using kernels::MainloopConfig;
  if (c.block_k == 64 && c.consumer_warpgroups == 2 && c.staged_chunks == 2) {
    if (c.block_m == 128 && c.block_n == 256 && c.stages == 4) {
      return k_major ? fn(MainloopConfig<128, 256, 4, true, kCluster, 2>{})
                     : fn(MainloopConfig<128, 256, 4, false, kCluster, 2>{});
    }
  }
  if (c.block_k == 64 && c.consumer_warpgroups == 2 && c.staged_chunks == 0) {
    if (c.block_m == 128 && c.block_n == 256 && c.stages == 3) {
      return k_major ? fn(MainloopConfig<128, 256, 3, true, kCluster>{}) : fn(MainloopConfig<128, 256, 3, false, kCluster>{});
    }
    if (c.block_m == 128 && c.block_n == 192 && c.stages == 4) {
      return k_major ? fn(MainloopConfig<128, 192, 4, true, kCluster>{}) : fn(MainloopConfig<128, 192, 4, false, kCluster>{});
    }
    if (c.block_m == 64 && c.block_n == 256 && c.stages == 4) {
      return k_major ? fn(MainloopConfig<64, 256, 4, true, kCluster>{}) : fn(MainloopConfig<64, 256, 4, false, kCluster>{});
    }
  }
  return Status::Internal("no compiled kernel variant for config: " + c.to_string());
}

template <class Fn>
Status with_mainloop_config(const GemmConfig& c, WeightLayout layout, Fn&& fn) {
  const bool k_major = layout == WeightLayout::kNxK;
  if (c.cluster_size == 2) return with_tile_config<2>(c, k_major, fn);
  if (c.cluster_size == 1) return with_tile_config<1>(c, k_major, fn);
  return Status::Internal("no compiled kernel variant for config: " + c.to_string());
}

// The config's tunables overridden from the environment (TPFUSE_CLUSTER_SIZE, TPFUSE_GROUP_ROWS,
// TPFUSE_OWN_LAG, TPFUSE_BLOCK_N, TPFUSE_PARTIAL_ROUNDS).
inline Status apply_overrides(const Problem& problem, const DeviceInfo& device, GemmConfig* config) {
  if (params::block_n() != 0 && config->block_m == 128) {
    if (params::block_n() != 192 && params::block_n() != 256) {
      return Status::InvalidArgument("TPFUSE_BLOCK_N = " + std::to_string(params::block_n()) +
                                     " must be 192 or 256 (or 0: the config's choice)");
    }
    config->block_n = int(params::block_n());
    config->staged_chunks = 0;
    TPFUSE_RETURN_IF_ERROR(fit_stages(device, config));
  }
  if (params::own_lag() < -1 || params::own_lag() > kOwnTilesLast) {
    return Status::InvalidArgument("TPFUSE_OWN_LAG = " + std::to_string(params::own_lag()) +
                                   " must be a number of rounds >= 0 (or -1: the config's choice)");
  }
  if (params::own_lag() >= 0) config->own_lag = int(params::own_lag());
  if (params::group_rows() < 0) {
    return Status::InvalidArgument("TPFUSE_GROUP_ROWS = " + std::to_string(params::group_rows()) +
                                   " must be positive (or 0: the config's choice)");
  }
  if (params::group_rows() > 0) config->group_rows = int(params::group_rows());
  if (params::cluster_size() != 0) {
    if (params::cluster_size() != 1 && params::cluster_size() != 2) {
      return Status::InvalidArgument("TPFUSE_CLUSTER_SIZE = " + std::to_string(params::cluster_size()) +
                                     " must be 1 or 2 (or 0: the config's choice)");
    }
    config->cluster_size = int(params::cluster_size());
  }
  if (params::partial_rounds() < -1) {
    return Status::InvalidArgument("TPFUSE_PARTIAL_ROUNDS = " + std::to_string(params::partial_rounds()) +
                                   " must be a number of rounds >= 0 (or -1: the config's choice)");
  }
  if (params::spread_reduction() == 0) config->spread_reduction = 0;
  // The tile width may have changed the chunk buffers; the override only lowers the rounds.
  config->partial_rounds = partial_rounds_of(problem, *config);
  if (params::partial_rounds() >= 0) {
    config->partial_rounds = std::min(config->partial_rounds, int(params::partial_rounds()));
  }
  return Status::Ok();
}

// The config for `problem` on the current device: the pure choice, then the environment's overrides;
// logged with TPFUSE_DEBUG=1 under the name `op`.
inline Status choose_config(const Problem& problem, const char* op, GemmConfig* config) {
  DeviceInfo device;
  TPFUSE_RETURN_IF_ERROR(current_device_info(&device));
  TPFUSE_RETURN_IF_ERROR(select_gemm_config(problem, device, config));
  TPFUSE_RETURN_IF_ERROR(apply_overrides(problem, device, config));
  if (params::debug()) {
    std::fprintf(stderr, "tpfuse: %s %s -> %s\n", op, problem.to_string().c_str(), config->to_string().c_str());
  }
  return Status::Ok();
}

// Launch attributes for a kernel of `Config`: its cluster shape, and optionally cooperative.
template <class Config>
struct LaunchAttributes {
  cudaLaunchAttribute list[2]{};
  int count = 0;
  explicit LaunchAttributes(bool cooperative) {
    list[count].id = cudaLaunchAttributeClusterDimension;
    list[count].val.clusterDim.x = Config::kCluster;
    list[count].val.clusterDim.y = 1;
    list[count].val.clusterDim.z = 1;
    ++count;
    if (cooperative) {
      list[count].id = cudaLaunchAttributeCooperative;
      list[count].val.cooperative = 1;
      ++count;
    }
  }
};

// Launches `grid` CTAs of a kernel of `Config` with its cluster shape (and cooperatively if asked).
template <class Config, class Kernel, class Params>
Status launch_persistent(Kernel kernel, const Params& params, int grid, size_t smem, bool cooperative,
                         cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(Config::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  LaunchAttributes<Config> attributes(cooperative);
  cfg.attrs = attributes.list;
  cfg.numAttrs = attributes.count;
  TPFUSE_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, params));
  return Status::Ok();
}

// The largest persistent grid of `kernel` whose clusters are all resident at once, at most `wanted`.
template <class Config, class Kernel>
Status resident_grid(Kernel kernel, size_t smem, int wanted, int* grid) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(wanted / Config::kCluster * Config::kCluster));
  cfg.blockDim = dim3(Config::kThreads);
  cfg.dynamicSmemBytes = smem;
  LaunchAttributes<Config> attributes(false);
  cfg.attrs = attributes.list;
  cfg.numAttrs = attributes.count;
  int clusters = 0;
  TPFUSE_CUDA_TRY(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  *grid = std::min(wanted / Config::kCluster, clusters) * Config::kCluster;
  if (*grid <= 0) return Status::Unsupported("no cluster of this kernel fits on the device");
  return Status::Ok();
}

// The mainloop's operands: A (m x k) and W in its layout, and the tile schedule of `rank`.
template <class Config>
Status make_mainloop_params(const Problem& problem, const GemmConfig& config, int rank, const void* a, const void* w,
                            kernels::MainloopParams* p) {
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(a, m, k, k, Config::kBlockM, Config::kBlockK, &p->a));
  // W is loaded in pieces (see MainloopConfig): K-major, half the tile's rows; MN-major, 64 columns.
  if (Config::kWeightKMajor) {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(w, n, k, k, Config::kWPieceBoxRows, Config::kWPieceBoxCols, &p->w));
  } else {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(w, k, n, n, Config::kWPieceBoxRows, Config::kWPieceBoxCols, &p->w));
  }
  p->schedule.world_size = problem.world_size;
  p->schedule.rank = rank;
  p->schedule.m = int(m);
  p->schedule.n = int(n);
  p->schedule.block_m = Config::kBlockM;
  p->schedule.block_n = Config::kBlockN;
  p->schedule.group_rows = config.group_rows;
  p->schedule.own_lag = config.own_lag;
  p->schedule.segments_per_tile = config.segments_per_tile;
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
  TPFUSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // No more CTAs than tiles (rounded up to whole clusters), and all of them resident.
  const int num_tiles = params.mainloop.schedule.num_tiles();
  const int wanted = std::min(config.num_ctas, (num_tiles + Config::kCluster - 1) / Config::kCluster * Config::kCluster);
  int grid = 0;
  TPFUSE_RETURN_IF_ERROR(resident_grid<Config>(kernel, smem, wanted, &grid));
  if (params::debug()) {
    std::fprintf(stderr, "tpfuse: launch grid %d x %d threads (clusters of %d), %zu B smem, %d tiles, %d k-blocks\n",
                 grid, Config::kThreads, Config::kCluster, smem, num_tiles, params.mainloop.num_k_blocks);
  }
  return launch_persistent<Config>(kernel, params, grid, smem, /*cooperative=*/false, stream);
}

}  // namespace tpfuse
