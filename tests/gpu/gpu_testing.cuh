// Helpers for the GPU tests: device buffers, input generators, a plain FP32 reference GEMM, and
// the SPEC's error measures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tpfuse/problem.h"

namespace tpfuse::testing {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) { cudaMalloc(&ptr, n * sizeof(T)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  size_t bytes() const { return count * sizeof(T); }
  std::vector<T> to_host() const {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), ptr, bytes(), cudaMemcpyDeviceToHost);
    return host;
  }
};

// Uniform values in [-1, 1), a different stream of them for every seed.
void fill_random(__nv_bfloat16* data, size_t count, uint64_t seed);
// Small integers in {-1, 0, 1}: with K <= 256 every dot product is an integer of magnitude <= 256,
// exactly representable in BF16, so the GEMM must be exact.
void fill_small_ints(__nv_bfloat16* data, size_t count, uint64_t seed);
// 0xFFFF (a NaN) in every element: anything left unwritten shows.
void poison(__nv_bfloat16* data, size_t count);

// ref = a @ w in FP32 (exact BF16 products), m x n row-major; w laid out as `layout` says.
void reference_gemm(const Problem& problem, const __nv_bfloat16* a, const __nv_bfloat16* w, float* ref);

struct Errors {
  double max_rel = 0;   // max |out - ref| / max |ref|
  double norm_rel = 0;  // ||out - ref|| / ||ref||
  size_t non_finite = 0;
};
Errors compare(const std::vector<__nv_bfloat16>& out, const std::vector<float>& ref);

// The first element where out != ref bit for bit (as BF16 of the exact reference), or -1.
int64_t first_mismatch(const std::vector<__nv_bfloat16>& out, const std::vector<float>& ref);

}  // namespace tpfuse::testing
