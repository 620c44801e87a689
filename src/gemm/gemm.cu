// tpfuse::gemm: one rank's partial product with the mainloop the fused ops are built on. Its
// epilogue stores each tile into C on this GPU; its schedule is the output in raster order.
#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/raster.h"
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

}  // namespace kernels

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
    const auto kernel = kernels::gemm_kernel<Config>;
    size_t smem = 0;
    TPFUSE_RETURN_IF_ERROR(kernel_smem_bytes<Config>(config, &smem));
    const GemmSchedule schedule(int(problem.m), int(problem.n), Config::kBlockM, Config::kBlockN, config.group_rows);
    kernels::GemmParams params{};
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, schedule, &params.mainloop));
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map_bf16(c, problem.m, problem.n, problem.n, kChunkRows, kChunkCols, &params.epilogue.c));
    // No more CTAs than tiles, and all of them resident.
    int grid = 0;
    TPFUSE_RETURN_IF_ERROR(resident_grid<Config>(kernel, smem, std::min(config.num_ctas, schedule.num_tiles()), &grid));
    if (debug) {
      std::fprintf(stderr, "tpfuse: launch grid %d x %d threads, %zu B smem, %d tiles, %d k-blocks\n", grid,
                   Config::kThreads, smem, schedule.num_tiles(), params.mainloop.num_k_blocks);
    }
    return launch_persistent<Config>(kernel, params, grid, smem, /*cooperative=*/false, stream);
  });
}

}  // namespace tpfuse
