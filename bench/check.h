// Correctness on the GPU, shared by every mode: random inputs, poisoned outputs, an FP32 reference
// GEMM and reduce-scatter, and SPEC's two error measures. Everything runs on the current device and
// the given stream (which must belong to it), except reference_reduce_scatter, which spans a GpuSet.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpus.h"
#include "plan/reference.h"
#include "tpfuse/problem.h"

namespace tpfuse::bench {

using bf16 = __nv_bfloat16;

// Uniform in [-1, 1], rounded to BF16, never zero; a function of (seed, index) only.
void fill_random_bf16(bf16* data, size_t count, uint64_t seed, cudaStream_t stream);
// Fills with 0xFFFF, a NaN, so that any element a kernel fails to write shows up.
void poison_bf16(bf16* data, size_t count, cudaStream_t stream);

// ref = a @ w (m x n, row-major), the exact products of the BF16 inputs summed in FP32.
// `w` is laid out as problem.weight_layout says.
void reference_gemm(const Problem& problem, const bf16* a, const bf16* w, float* ref, cudaStream_t stream);

// sum += addend, element by element in FP32: a BF16 partial added into an FP32 reference.
void add_bf16_to_ref(float* sum, const bf16* addend, size_t count, cudaStream_t stream);

// The sums behind ErrorStats, kept apart so that the outputs of several ranks can be measured together.
struct ErrorSums {
  double max_abs_diff = 0;
  double max_abs_ref = 0;
  double sum_sq_diff = 0;
  double sum_sq_ref = 0;
  uint64_t num_nonfinite = 0;  // NaN or Inf outputs (left-over poison included); not in the sums

  void merge(const ErrorSums& other);
  // NaN measures if any output was not finite; a zero reference gives 0 if out == ref, else +inf.
  ErrorStats stats() const;
};

// Measures `out` (BF16) against `ref` (FP32) with a reduction in double on the GPU. Waits for `stream`.
ErrorSums measure_error(const bf16* out, const float* ref, size_t count, cudaStream_t stream);

// SPEC's max|out-ref|/max|ref| and ||out-ref||/||ref|| of one output; `num_nonfinite` (if given)
// receives the count of NaN/Inf elements. Waits for `stream`.
ErrorStats compare_bf16_to_ref(const bf16* out, const float* ref, size_t count, cudaStream_t stream,
                               uint64_t* num_nonfinite = nullptr);

// The reference reduce-scatter: out_refs[d] (m/G x n, on GPU d) = the sum over ranks r = 0..G-1, in
// that order and in FP32, of rows [d*m/G, (d+1)*m/G) of partial_refs[r] (m x n, on GPU r), G = gpus.size().
// Waits for all GPUs.
void reference_reduce_scatter(GpuSet& gpus, const std::vector<const float*>& partial_refs,
                              const std::vector<float*>& out_refs, int64_t m, int64_t n);

}  // namespace tpfuse::bench
