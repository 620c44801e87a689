#include "gemm_sets.h"

#include "baselines.h"
#include "testing/gpu_check.h"
#include "modes.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW };

}  // namespace

GemmSets make_gemm_sets(Gpu& gpu, const Problem& problem, size_t extra_bytes_per_set, uint64_t run_seed,
                        size_t shape_index) {
  const size_t a_count = size_t(problem.m) * size_t(problem.k_per_rank);
  const size_t w_count = size_t(problem.k_per_rank) * size_t(problem.n);
  const size_t c_count = size_t(problem.m) * size_t(problem.n);
  const size_t set_bytes = (a_count + w_count + 2 * c_count) * sizeof(bf16) + extra_bytes_per_set;

  GemmSets sets;
  sets.c_count = c_count;
  sets.num_sets = rotation_sets(set_bytes, gpu.l2_bytes, rotation_budget_bytes(gpu.device));
  sets.a = random_bf16_sets(gpu, a_count, sets.num_sets, tensor_seed(run_seed, shape_index, 0, 0, kA));
  sets.w = random_bf16_sets(gpu, w_count, sets.num_sets, tensor_seed(run_seed, shape_index, 0, 0, kW));
  sets.c_cublas = poisoned_bf16_sets(gpu, c_count, sets.num_sets);
  sets.c_ours = poisoned_bf16_sets(gpu, c_count, sets.num_sets);
  return sets;
}

void cublas_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set) {
  cublas_gemm(gpu.cublas, problem, sets.a[set].get(), sets.w[set].get(), sets.c_cublas[set].get());
}

void ours_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, const ConfigOverrides& overrides) {
  check_op(tpfuse::gemm(problem, sets.a[set].get(), sets.w[set].get(), sets.c_ours[set].get(), gpu.stream, overrides));
}

}  // namespace tpfuse::bench
