#include "gemm_sets.h"

#include "baselines.h"
#include "testing/gpu_check.h"
#include "modes.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW, kAScale, kWScale };

// E4M3 sets of `count` elements (testing/gpu_check.h's fill).
std::vector<DeviceBuffer> random_e4m3_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed) {
  std::vector<DeviceBuffer> sets;
  TESTING_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count);
    fill_random_e4m3(sets.back().as<uint8_t>(), count, tensor_seed(seed, 0, 0, s, 0), gpu.stream);
  }
  return sets;
}

std::vector<DeviceBuffer> random_scale_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed) {
  std::vector<DeviceBuffer> sets;
  TESTING_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(float));
    fill_random_scales(sets.back().as<float>(), count, tensor_seed(seed, 0, 0, s, 0), gpu.stream);
  }
  return sets;
}

}  // namespace

GemmSets make_gemm_sets(Gpu& gpu, const Problem& problem, size_t extra_bytes_per_set, uint64_t run_seed,
                        size_t shape_index) {
  const size_t a_count = size_t(problem.m) * size_t(problem.k_per_rank);
  const size_t w_count = size_t(problem.k_per_rank) * size_t(problem.n);
  const size_t c_count = size_t(problem.m) * size_t(problem.n);
  const bool e4m3 = problem.dtype == DType::kE4M3;
  const bool rowwise = problem.scaling == Scaling::kRowwise;
  const size_t a_scales = rowwise ? size_t(problem.m) : 1, w_scales = rowwise ? size_t(problem.n) : 1;
  const size_t set_bytes = (a_count + w_count) * size_t(element_bytes(problem.dtype)) + 2 * c_count * sizeof(bf16) +
                           (e4m3 ? (a_scales + w_scales) * sizeof(float) : 0) + extra_bytes_per_set;

  GemmSets sets;
  sets.c_count = c_count;
  sets.num_sets = rotation_sets(set_bytes, gpu.l2_bytes, rotation_budget_bytes(gpu.device));
  const auto seed = [&](Tensor t) { return tensor_seed(run_seed, shape_index, 0, 0, t); };
  if (e4m3) {
    sets.a = random_e4m3_sets(gpu, a_count, sets.num_sets, seed(kA));
    sets.w = random_e4m3_sets(gpu, w_count, sets.num_sets, seed(kW));
    sets.a_scale = random_scale_sets(gpu, a_scales, sets.num_sets, seed(kAScale));
    sets.w_scale = random_scale_sets(gpu, w_scales, sets.num_sets, seed(kWScale));
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
    sets.cublaslt->gemm(problem, sets.a[set].get(), sets.w[set].get(), sets.scales(set), sets.c_cublas[set].get(),
                        gpu.stream);
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
