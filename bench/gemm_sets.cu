#include "gemm_sets.h"

#include "baselines.h"
#include "testing/gpu_check.h"
#include "modes.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW, kAScale, kWScale };

}  // namespace

GemmSets make_gemm_sets(Gpu& gpu, const Problem& problem, size_t extra_bytes_per_set, uint64_t run_seed,
                        size_t shape_index) {
  const size_t a_count = size_t(problem.m) * size_t(problem.k_per_rank);
  const size_t w_count = size_t(problem.k_per_rank) * size_t(problem.n);
  const size_t c_count = size_t(problem.m) * size_t(problem.n);
  const bool e4m3 = problem.dtype == DType::kE4M3;
  const ScaleShapes scale_shape = scale_shapes(problem);
  const size_t a_scales = scale_shape.a.count(), w_scales = scale_shape.w.count();
  // Blockwise, cuBLASLt's copies of the scales too.
  const size_t scale_copies = problem.scaling == Scaling::kBlockwise ? 2 : 1;
  const size_t set_bytes = (a_count + w_count) * size_t(element_bytes(problem.dtype)) + 2 * c_count * sizeof(bf16) +
                           (e4m3 ? scale_copies * (a_scales + w_scales) * sizeof(float) : 0) + extra_bytes_per_set;

  GemmSets sets;
  sets.c_count = c_count;
  sets.num_sets = rotation_sets(set_bytes, gpu.l2_bytes, rotation_budget_bytes(gpu.device));
  const auto seed = [&](Tensor t) { return tensor_seed(run_seed, shape_index, 0, 0, t); };
  if (e4m3) {
    sets.a = filled_sets<uint8_t>(gpu, a_count, sets.num_sets, seed(kA), fill_random_e4m3);
    sets.w = filled_sets<uint8_t>(gpu, w_count, sets.num_sets, seed(kW), fill_random_e4m3);
    sets.a_scale = filled_sets<float>(gpu, a_scales, sets.num_sets, seed(kAScale), fill_random_scales);
    sets.w_scale = filled_sets<float>(gpu, w_scales, sets.num_sets, seed(kWScale), fill_random_scales);
    for (int set = 0; set < sets.num_sets; ++set) {
      sets.cublaslt_scales.emplace_back(problem, sets.scales(set), gpu.stream);
    }
    sets.cublaslt = std::make_shared<CublasLtFp8>();
  } else {
    sets.a = random_bf16_sets(gpu, a_count, sets.num_sets, seed(kA));
    sets.w = random_bf16_sets(gpu, w_count, sets.num_sets, seed(kW));
  }
  sets.c_cublas = poisoned_bf16_sets(gpu, c_count, sets.num_sets);
  sets.c_ours = poisoned_bf16_sets(gpu, c_count, sets.num_sets);
  return sets;
}

void cublas_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set) {
  if (sets.cublaslt) {
    sets.cublaslt->gemm(problem, sets.a[set].get(), sets.w[set].get(), sets.cublaslt_scales[set],
                        sets.c_cublas[set].get(), gpu.stream);
  } else {
    cublas_gemm(gpu.cublas, problem, sets.a[set].get(), sets.w[set].get(), sets.c_cublas[set].get());
  }
}

void ours_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, const ConfigOverrides& overrides) {
  check_op(tpfuse::gemm(problem, sets.a[set].get(), sets.w[set].get(), sets.scales(set), sets.c_ours[set].get(),
                        gpu.stream, overrides));
}

void reference_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, float* ref) {
  if (problem.dtype == DType::kE4M3) {
    reference_gemm_e4m3(problem, sets.a[set].as<uint8_t>(), sets.w[set].as<uint8_t>(), sets.scales(set), ref,
                        gpu.stream);
  } else {
    reference_gemm(problem, sets.a[set].as<bf16>(), sets.w[set].as<bf16>(), ref, gpu.stream);
  }
}

}  // namespace tpfuse::bench
