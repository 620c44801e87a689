// Helpers for the GPU tests on top of the shared test support (testing/): typed device arrays, the
// fills and the reference on the default stream, docs/SPEC.md's error measures of host copies, and the
// first bit-for-bit mismatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "testing/errors.h"
#include "testing/gpu_check.h"
#include "tpfuse/problem.h"

namespace tpfuse::testing {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceArray(size_t n) : count(n) { cudaMalloc(&ptr, n * sizeof(T)); }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  size_t bytes() const { return count * sizeof(T); }
  std::vector<T> to_host() const {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), ptr, bytes(), cudaMemcpyDeviceToHost);
    return host;
  }
};

// The shared fills (testing/gpu_check.h) on the default stream.
inline void fill_random(bf16* data, size_t count, uint64_t seed) { fill_random_bf16(data, count, seed, nullptr); }
inline void fill_small_ints(bf16* data, size_t count, uint64_t seed) {
  fill_small_ints_bf16(data, count, seed, nullptr);
}
inline void poison(bf16* data, size_t count) { poison_bf16(data, count, nullptr); }
inline void reference_gemm(const Problem& problem, const bf16* a, const bf16* w, float* ref) {
  reference_gemm(problem, a, w, ref, nullptr);
}

// docs/SPEC.md's measures of a BF16 output against its FP32 reference, from host copies.
ErrorSums error_sums(const std::vector<bf16>& out, const std::vector<float>& ref);

// The first element where out != ref bit for bit (as BF16 of the exact reference), or -1.
int64_t first_mismatch(const std::vector<bf16>& out, const std::vector<float>& ref);

// "row R, column C" of element `index` of a row-major matrix of `cols` columns.
std::string element_at(int64_t index, int64_t cols);

// element_at(index, cols), then the element's value against the reference's (as BF16), and how many
// elements differ: "row R, column C: V, expected E (D of N differ)".
std::string mismatch_at(const std::vector<bf16>& out, const std::vector<float>& ref, int64_t index, int64_t cols);

}  // namespace tpfuse::testing
