// tpfuse::gemm: one rank's partial product with the mainloop the fused ops are built on. Its
// epilogue stores each tile into C on this GPU; its schedule is the output in raster order. Where
// the tiles would leave most SMs idle (small M), each tile's K loop is split over several CTAs
// instead, whose partials the last of them adds (gemm/split_k.h, gemm/split_k_epilogue.cuh); where
// only their last wave would, that wave's tiles alone. At
// m <= 64 over wide outputs a kernel of its own streams W instead (gemm/swap_ab.cuh).
#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/raster.h"
#include "gemm/split_k.h"
#include "gemm/split_k_epilogue.cuh"
#include "gemm/split_k_workspace.h"
#include "gemm/store_epilogue.cuh"
#include "gemm/swap_ab.cuh"
#include "tpfuse/gemm.h"

namespace tpfuse {
namespace kernels {

struct GemmParams {
  MainloopParams<GemmSchedule> mainloop;
  StoreTileEpilogue::Params epilogue;
};

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) gemm_kernel(const __grid_constant__ GemmParams params) {
  run_persistent<Config, StoreTileEpilogue>(params.mainloop, params.epilogue, aligned_shared_storage<Config>(),
                                            blockIdx.x, gridDim.x);
}

struct SplitKGemmParams {
  MainloopParams<SplitKSchedule> mainloop;
  SplitKEpilogue::Params epilogue;
};

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) split_k_gemm_kernel(const __grid_constant__ SplitKGemmParams params) {
  run_persistent<Config, SplitKEpilogue>(params.mainloop, params.epilogue, aligned_shared_storage<Config>(),
                                         blockIdx.x, gridDim.x);
}

}  // namespace kernels

namespace {

// Launches `kernel` over the steps of `params.mainloop.schedule`: no more CTAs than steps, and all
// of them resident.
template <class Config, class Kernel, class Params>
Status launch_gemm(Kernel kernel, const Params& params, const GemmConfig& config, bool debug, cudaStream_t stream) {
  size_t smem = 0;
  TPFUSE_RETURN_IF_ERROR(kernel_smem_bytes<Config>(config, &smem));
  const int num_steps = params.mainloop.schedule.num_tiles();
  int grid = 0;
  TPFUSE_RETURN_IF_ERROR(resident_grid<Config>(kernel, smem, std::min(config.num_ctas, num_steps), &grid));
  if (debug) {
    std::fprintf(stderr, "tpfuse: launch grid %d x %d threads, %zu B smem, %d steps (split_k %d), %d k-blocks\n", grid,
                 Config::kThreads, smem, num_steps, config.split_k, params.mainloop.num_k_blocks);
  }
  return launch_persistent<Config>(kernel, params, grid, smem, /*cooperative=*/false, stream);
}

// The swap-AB kernel over A's rows rounded up to kRows (inputs of kSwapAbDType: swap_ab_rows takes no other).
template <int kRows, bool kWeightKMajor>
Status launch_swap_ab(const Problem& problem, const void* a, const void* w, void* c, bool debug, cudaStream_t stream) {
  using Config = kernels::SwapAbConfig<kRows, kWeightKMajor, kSwapAbDType>;
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  kernels::SwapAbParams params{};
  TPFUSE_RETURN_IF_ERROR(make_tensor_map(problem.dtype, a, m, k, k, kRows, Config::kBlockK, &params.a));
  if constexpr (kWeightKMajor) {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map(problem.dtype, w, n, k, k, Config::kCols, Config::kBlockK, &params.w));
  } else {
    TPFUSE_RETURN_IF_ERROR(make_tensor_map(problem.dtype, w, k, n, n, Config::kBlockK, Config::kCols, &params.w));
  }
  params.c = static_cast<__nv_bfloat16*>(c);
  params.m = int(m);
  params.n = int(n);
  params.num_tiles = int((n + Config::kCols - 1) / Config::kCols);
  params.num_k_blocks = int((k + Config::kBlockK - 1) / Config::kBlockK);
  const size_t smem = sizeof(typename Config::Storage) + 1024;
  const auto kernel = kernels::swap_ab_gemm_kernel<Config>;
  int grid = 0;
  TPFUSE_RETURN_IF_ERROR(resident_grid<Config>(kernel, smem, params.num_tiles, &grid));
  if (debug) {
    std::fprintf(stderr,
                 "tpfuse: launch swap_ab grid %d x %d threads, %zu B smem, rows %d, %d stages, %d tiles, %d k-blocks\n",
                 grid, Config::kThreads, smem, kRows, Config::kStages, params.num_tiles, params.num_k_blocks);
  }
  return launch_persistent<Config>(kernel, params, grid, smem, /*cooperative=*/false, stream);
}

template <bool kWeightKMajor>
Status launch_swap_ab(int rows, const Problem& problem, const void* a, const void* w, void* c, bool debug,
                      cudaStream_t stream) {
  switch (rows) {
    case 8: return launch_swap_ab<8, kWeightKMajor>(problem, a, w, c, debug, stream);
    case 16: return launch_swap_ab<16, kWeightKMajor>(problem, a, w, c, debug, stream);
    case 32: return launch_swap_ab<32, kWeightKMajor>(problem, a, w, c, debug, stream);
    case 64: return launch_swap_ab<64, kWeightKMajor>(problem, a, w, c, debug, stream);
    default: return Status::Internal("no swap-AB kernel for " + std::to_string(rows) + " rows");
  }
}

}  // namespace

Status gemm(const Problem& problem, const void* a, const void* w, void* c, cudaStream_t stream,
            const ConfigOverrides& overrides) {
  return gemm(problem, a, w, InputScales{}, c, stream, overrides);
}

Status gemm(const Problem& problem_in, const void* a, const void* w, const InputScales& scales, void* c,
            cudaStream_t stream, const ConfigOverrides& overrides) {
  // One rank's partial product: no reduce-scatter, so the whole of C is one segment.
  Problem problem = problem_in;
  problem.world_size = 1;
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  TPFUSE_RETURN_IF_ERROR(validate_operand(a, "a"));
  TPFUSE_RETURN_IF_ERROR(validate_operand(w, "w"));
  TPFUSE_RETURN_IF_ERROR(validate_operand(c, "c"));
  bool debug = false;
  TPFUSE_RETURN_IF_ERROR(debug_logging(&debug));

  DeviceInfo device;
  TPFUSE_RETURN_IF_ERROR(current_device_info(&device));
  GemmConfig config;
  TPFUSE_RETURN_IF_ERROR(select_plain_gemm_config(problem, device, overrides, &config));
  if (const int rows = swap_ab_rows(problem, device, overrides); rows != 0) {
    if (debug) {
      std::fprintf(stderr, "tpfuse: gemm %s, overrides %s -> swap_ab, rows %d\n", problem.to_string().c_str(),
                   overrides.to_string().c_str(), rows);
    }
    return problem.weight_layout == WeightLayout::kNxK ? launch_swap_ab<true>(rows, problem, a, w, c, debug, stream)
                                                       : launch_swap_ab<false>(rows, problem, a, w, c, debug, stream);
  }
  if (debug) {
    std::fprintf(stderr, "tpfuse: gemm %s, overrides %s -> %s\n", problem.to_string().c_str(),
                 overrides.to_string().c_str(), config.to_string().c_str());
  }

  return with_variant<NoOpSync>(config.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
    using Config = decltype(mainloop_config);
    const GemmSchedule tiles(int(problem.m), int(problem.n), Config::kBlockM, Config::kBlockN, config.group_rows);
    CUtensorMap c_map;
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map(kOutputDType, c, problem.m, problem.n, problem.n, kChunkRows, kChunkCols, &c_map));
    if (config.split_k == 1) {
      kernels::GemmParams params{};
      TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, scales, tiles, &params.mainloop));
      params.epilogue.c = c_map;
      return launch_gemm<Config>(kernels::gemm_kernel<Config>, params, config, debug, stream);
    }
    kernels::SplitKGemmParams params{};
    const int num_k_blocks = int(k_blocks_of(problem.k_per_rank, problem.dtype));
    const SplitKSchedule schedule(tiles, SplitPlan{config.whole_tiles, config.split_k}, num_k_blocks);
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, scales, schedule, &params.mainloop));
    SplitKWorkspace workspace;
    TPFUSE_RETURN_IF_ERROR(split_k_workspace(stream, device.num_sms, &workspace));
    params.epilogue.c = c_map;
    params.epilogue.partials = workspace.partials;
    params.epilogue.splits_done = workspace.splits_done;
    return launch_gemm<Config>(kernels::split_k_gemm_kernel<Config>, params, config, debug, stream);
  });
}

}  // namespace tpfuse
