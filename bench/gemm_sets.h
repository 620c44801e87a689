// One GPU's rotated input sets for a per-rank GEMM run both ways, cuBLAS and tpfuse::gemm: shared by
// the modes that time our GEMM against cuBLAS (gemm, proxy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "testing/cublaslt_fp8.h"
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
  // E4M3 problems: each set's scales (shaped as problem.scaling says: scale_shapes), the same as
  // cuBLASLt reads them (blockwise: copies in its layouts, made here, outside the timed calls), and
  // cuBLASLt's scaled GEMM, the baseline there.
  std::vector<DeviceBuffer> a_scale, w_scale;
  std::vector<testing::CublasLtScales> cublaslt_scales;
  std::shared_ptr<testing::CublasLtFp8> cublaslt;

  InputScales scales(int set) const {
    if (a_scale.empty()) return {};
    return {a_scale[set].as<const float>(), w_scale[set].as<const float>()};
  }
};

// As many sets as rotation_sets allows for A, W, both outputs and `extra_bytes_per_set` (what the
// caller rotates besides, with the same count of sets). Seeded per shape and input set. Inputs of
// the problem's dtype: BF16 uniform in [-1, 1], or E4M3 over its range with their scales.
GemmSets make_gemm_sets(Gpu& gpu, const Problem& problem, size_t extra_bytes_per_set, uint64_t run_seed,
                        size_t shape_index);

// One call on input set `set`, on the GPU's stream: cuBLAS (cuBLASLt's scaled GEMM for E4M3) or
// ours. tpfuse::gemm's bad Status throws OpFailed.
void cublas_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set);
void ours_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, const ConfigOverrides& overrides);
// The FP32 reference of set `set`'s product (m x n; of `problem`'s rows, which may be fewer than the
// set's: the first ones), dequantized for E4M3.
void reference_on_set(Gpu& gpu, const Problem& problem, const GemmSets& sets, int set, float* ref);

}  // namespace tpfuse::bench
