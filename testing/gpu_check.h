// Correctness on the GPU, shared by the GPU tests and the benchmark: random and small-integer
// inputs, poisoned outputs, an FP32 reference GEMM, and docs/SPEC.md's error measures (testing/errors.h).
// Everything runs on the current device and the given stream (which must belong to it). A failed
// CUDA call throws CallFailed (testing/cuda_errors.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "testing/errors.h"
#include "tpfuse/problem.h"

namespace tpfuse::testing {

using bf16 = __nv_bfloat16;

// Uniform in [-1, 1], rounded to BF16, never zero; a function of (seed, index) only.
void fill_random_bf16(bf16* data, size_t count, uint64_t seed, cudaStream_t stream);
// Small integers in {-1, 0, 1}, a function of (seed, index): with K per rank at most 256 / P every
// partial and every total is an integer of magnitude at most 256, exact in BF16 (the exact mode).
void fill_small_ints_bf16(bf16* data, size_t count, uint64_t seed, cudaStream_t stream);
// The same for E4M3 inputs (one byte each): uniform in [-448, 448] (e4m3's range) rounded to E4M3,
// never zero; small integers in {-1, 0, 1}.
void fill_random_e4m3(uint8_t* data, size_t count, uint64_t seed, cudaStream_t stream);
void fill_small_ints_e4m3(uint8_t* data, size_t count, uint64_t seed, cudaStream_t stream);
// Scales of E4M3 data, as amax scaling makes them for values in e4m3's range: uniform in
// [0.5, 2) / 448.
void fill_random_scales(float* data, size_t count, uint64_t seed, cudaStream_t stream);

// An E4M3 problem's scales as row-major FP32 matrices (problem.scaling, tpfuse/problem.h): 1 x 1
// each (tensorwise); m x 1 and n x 1 (rowwise); m x k_per_rank/128 and ceil(n/128) x k_per_rank/128
// (blockwise; K blocks rounded up, so that a problem validate() refuses still gets whole buffers).
struct ScaleShape {
  int64_t rows = 1, cols = 1;
  size_t count() const { return size_t(rows) * size_t(cols); }
};
struct ScaleShapes {
  ScaleShape a, w;
};
ScaleShapes scale_shapes(const Problem& problem);

// Fills with 0xFFFF, a NaN, so that any element a kernel fails to write shows up.
void poison_bf16(bf16* data, size_t count, cudaStream_t stream);

// ref = a @ w (m x n, row-major), the exact products of the BF16 inputs summed in FP32.
// `w` is laid out as problem.weight_layout says.
void reference_gemm(const Problem& problem, const bf16* a, const bf16* w, float* ref, cudaStream_t stream);

// The same for E4M3 inputs (problem.dtype, N x K weight): the exact products summed in FP32, then
// multiplied by their row's and column's scales as problem.scaling says (the dequantized product);
// blockwise, each 128 of K's sum multiplied by its blocks' scales, the blocks summed in FP64.
void reference_gemm_e4m3(const Problem& problem, const uint8_t* a, const uint8_t* w, const InputScales& scales,
                         float* ref, cudaStream_t stream);

// sum += addend, element by element in FP32: a BF16 partial, or an FP32 one, added into a reference.
void add_bf16_to_ref(float* sum, const bf16* addend, size_t count, cudaStream_t stream);
void add_f32_to_ref(float* sum, const float* addend, size_t count, cudaStream_t stream);

// Measures `out` (BF16) against `ref` (FP32) with a reduction in double on the GPU. Waits for `stream`.
ErrorSums measure_error(const bf16* out, const float* ref, size_t count, cudaStream_t stream);

}  // namespace tpfuse::testing
