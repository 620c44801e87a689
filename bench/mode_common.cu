#include <cuda_runtime_api.h>

#include "check.h"
#include "modes.h"

namespace tpfuse::bench {

std::vector<Column> shape_columns() {
  return {
      {"proj", "proj", 23, Format::kText},
      {"m", "M", 6, Format::kInteger},
      {"n", "N", 6, Format::kInteger},
      {"k_per_rank", "K/P", 6, Format::kInteger},
  };
}

Row shape_row(const Shape& shape) {
  return {
      {"proj", shape.projection},
      {"m", double(shape.m)},
      {"n", double(shape.n)},
      {"k_per_rank", double(shape.k_per_rank)},
  };
}

Problem make_problem(const Shape& shape, const Options& options) {
  Problem problem;
  problem.m = shape.m;
  problem.n = shape.n;
  problem.k_per_rank = shape.k_per_rank;
  problem.world_size = options.tp;
  problem.weight_layout = options.weight_layout;
  return problem;
}

TimingOptions timing_options(const Options& options) {
  TimingOptions timing;
  timing.warmup = options.warmup;
  timing.iters = options.iters;
  timing.gate = options.gate;
  return timing;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

uint64_t tensor_seed(uint64_t run_seed, uint64_t shape_index, int gpu, int set, int tensor) {
  uint64_t seed = run_seed;
  for (const uint64_t part : {shape_index, uint64_t(gpu), uint64_t(set), uint64_t(tensor)}) {
    seed = (seed ^ part) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;  // FNV-style mixing
  }
  return seed;
}

size_t rotation_budget_bytes(int device) {
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CHECK(cudaSetDevice(device));
  BENCH_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes / 2;
}

std::vector<DeviceBuffer> random_bf16_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed) {
  std::vector<DeviceBuffer> sets;
  BENCH_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(bf16));
    fill_random_bf16(sets.back().as<bf16>(), count, tensor_seed(seed, 0, 0, s, 0), gpu.stream);
  }
  return sets;
}

std::vector<DeviceBuffer> poisoned_bf16_sets(Gpu& gpu, size_t count, int num_sets) {
  std::vector<DeviceBuffer> sets;
  BENCH_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(bf16));
    poison_bf16(sets.back().as<bf16>(), count, gpu.stream);
  }
  return sets;
}

bool attempt(const std::function<void()>& step, std::string* failure) {
  try {
    step();
    return true;
  } catch (const OpFailed& e) {
    if (failure->empty()) *failure = e.what();
    return false;
  }
}

const double* number_in(const Row& row, const std::string& key) {
  const auto it = row.find(key);
  return it == row.end() ? nullptr : std::get_if<double>(&it->second);
}

}  // namespace tpfuse::bench
