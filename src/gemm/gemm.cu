// tpfuse::gemm: one rank's partial product with the mainloop the fused ops are built on. Its
// epilogue stores each tile into C on this GPU; its schedule is the output in raster order. Where
// the tiles would leave most SMs idle (small M), each tile's K loop is split over several CTAs
// instead, whose partials the last of them adds (gemm/split_k.h, gemm/split_k_epilogue.cuh).
#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/raster.h"
#include "gemm/split_k.h"
#include "gemm/split_k_epilogue.cuh"
#include "gemm/split_k_workspace.h"
#include "gemm/store_epilogue.cuh"
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

}  // namespace

Status gemm(const Problem& problem_in, const void* a, const void* w, void* c, cudaStream_t stream,
            const ConfigOverrides& overrides) {
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
  if (debug) {
    std::fprintf(stderr, "tpfuse: gemm %s, overrides %s -> %s\n", problem.to_string().c_str(),
                 overrides.to_string().c_str(), config.to_string().c_str());
  }

  return with_variant<NoOpSync>(config.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
    using Config = decltype(mainloop_config);
    const GemmSchedule tiles(int(problem.m), int(problem.n), Config::kBlockM, Config::kBlockN, config.group_rows);
    CUtensorMap c_map;
    TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(c, problem.m, problem.n, problem.n, kChunkRows, kChunkCols, &c_map));
    if (config.split_k == 1) {
      kernels::GemmParams params{};
      TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, tiles, &params.mainloop));
      params.epilogue.c = c_map;
      return launch_gemm<Config>(kernels::gemm_kernel<Config>, params, config, debug, stream);
    }
    kernels::SplitKGemmParams params{};
    const int num_k_blocks = int((problem.k_per_rank + kBlockK - 1) / kBlockK);
    const SplitKSchedule schedule(tiles, config.split_k, num_k_blocks);
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, schedule, &params.mainloop));
    SplitKWorkspace workspace;
    TPFUSE_RETURN_IF_ERROR(split_k_workspace(stream, device.num_sms, &workspace));
    params.epilogue.c = c_map;
    params.epilogue.partials = workspace.partials;
    params.epilogue.splits_done = workspace.splits_done;
    return launch_gemm<Config>(kernels::split_k_gemm_kernel<Config>, params, config, debug, stream);
  });
}

}  // namespace tpfuse
