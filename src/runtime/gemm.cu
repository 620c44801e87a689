// tpfuse::gemm: one rank's partial product with the mainloop the fused op is built on.

#include <cstdlib>

#include "kernels/tile_store.cuh"
#include "runtime/launch.cuh"
#include "tpfuse/tpfuse.h"

namespace tpfuse {

Status gemm(const Problem& problem_in, const void* a, const void* w, void* c, cudaStream_t stream) {
  // One rank's partial product: no reduce-scatter, so the whole of C is one segment.
  Problem problem = problem_in;
  problem.world_size = 1;
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  TPFUSE_RETURN_IF_ERROR(validate_operand(a, "a"));
  TPFUSE_RETURN_IF_ERROR(validate_operand(w, "w"));
  TPFUSE_RETURN_IF_ERROR(validate_operand(c, "c"));

  GemmConfig config;
  TPFUSE_RETURN_IF_ERROR(choose_config(problem, "gemm", &config));

  auto run = [&](auto mainloop_config) {
    using Config = decltype(mainloop_config);
    using Epilogue = kernels::StoreTileEpilogue;
    kernels::KernelParams<Epilogue> params{};
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, config, /*rank=*/0, a, w, &params.mainloop));
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map_bf16(c, problem.m, problem.n, problem.n, kernels::kChunkRows, kernels::kChunkCols, &params.epilogue.c));
    return launch_gemm_kernel<Config>(params, config, stream);
  };
  if (std::getenv("TPFUSE_STAGE4") != nullptr && config.block_m == 128 && config.block_n == 256) {
    // Prototype: 4 stages, the epilogue staging 2 chunks at a time.
    config.stages = 4;
    config.staged_chunks = 2;
    const bool k_major = problem.weight_layout == WeightLayout::kNxK;
    if (config.cluster_size == 2) {
      return k_major ? run(kernels::MainloopConfig<128, 256, 4, true, 2, 2>{})
                     : run(kernels::MainloopConfig<128, 256, 4, false, 2, 2>{});
    }
    return k_major ? run(kernels::MainloopConfig<128, 256, 4, true, 1, 2>{})
                   : run(kernels::MainloopConfig<128, 256, 4, false, 1, 2>{});
  }
  return with_mainloop_config(config, problem.weight_layout, run);
}

}  // namespace tpfuse
