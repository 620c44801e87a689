// One GPU's rotated input sets for a per-rank GEMM run both ways, cuBLAS and tpfuse::gemm: shared by
// the modes that time our GEMM against cuBLAS (gemm, proxy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "testing/device_buffer.h"
#include "gpus.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse::bench {

struct GemmSets {
  int num_sets = 1;
  size_t c_count = 0;                          // m x n
  std::vector<DeviceBuffer> a, w;              // random: m x k_per_rank, and the weight as laid out
  std::vector<DeviceBuffer> c_cublas, c_ours;  // poisoned
};

// As many sets as rotation_sets allows for A, W, both outputs and `extra_bytes_per_set` (what the
// caller rotates besides, with the same count of sets). Seeded per shape and input set.
GemmSets make_gemm_sets(Gpu& gpu, const Problem& problem, size_t extra_bytes_per_set, uint64_t run_seed,
                        size_t shape_index);

// One call on input set `set`, on the GPU's stream. tpfuse::gemm's bad Status throws OpFailed.
void cublas_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set);
void ours_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, const ConfigOverrides& overrides);

}  // namespace tpfuse::bench
