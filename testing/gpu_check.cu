#include "testing/gpu_check.h"

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "testing/cuda_errors.h"
#include "testing/device_buffer.h"

namespace tpfuse::testing {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

int grid_for(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return int(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

__device__ uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_kernel(bf16* data, size_t count, uint64_t seed) {
  constexpr float kSmallest = 1.0f / 256;  // replaces values that would round to zero
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix(seed + 0x9e3779b97f4a7c15ull * (i + 1));
    const float u = float(bits >> 40) * (2.0f / float(1 << 24)) - 1.0f;  // [-1, 1)
    const float v = fabsf(u) < kSmallest ? copysignf(kSmallest, u) : u;
    data[i] = __float2bfloat16_rn(v);
  }
}

__global__ void fill_small_ints_kernel(bf16* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = __float2bfloat16_rn(float(int(mix(seed + 0x9e3779b97f4a7c15ull * (i + 1)) % 3) - 1));
  }
}

__device__ float e4m3_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(bits), __NV_E4M3)));
}

__global__ void fill_random_e4m3_kernel(uint8_t* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix(seed + 0x9e3779b97f4a7c15ull * (i + 1));
    const float u = float(bits >> 40) * (2.0f / float(1 << 24)) - 1.0f;  // [-1, 1)
    const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(448.0f * u, __NV_SATFINITE, __NV_E4M3);
    // e4m3's smallest normal, 2^-6, where the value rounded to zero (0x00 or 0x80)
    data[i] = (q & 0x7f) == 0 ? uint8_t(q | 0x08) : uint8_t(q);
  }
}

__global__ void fill_small_ints_e4m3_kernel(uint8_t* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const float v = float(int(mix(seed + 0x9e3779b97f4a7c15ull * (i + 1)) % 3) - 1);
    data[i] = uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
}

__global__ void fill_random_scales_kernel(float* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix(seed + 0x9e3779b97f4a7c15ull * (i + 1)) >> 40) / float(1 << 24);  // [0, 1)
    data[i] = (0.5f + 1.5f * u) / 448.0f;
  }
}

// Reference GEMM: 64 x 64 output tiles, K in steps of 16, each of 256 threads computing 4 x 4 outputs
// (rows ty + 16i, columns tx + 16j). Any m, n, k; exact BF16 products, FP32 sums.
constexpr int kRefTile = 64;
constexpr int kRefTileK = 16;

__device__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ float to_float(uint8_t v) { return e4m3_to_float(v); }

// Blockwise scales (a_block_scale not null: Scaling::kBlockwise's layouts, tpfuse/problem.h): each
// 128 of K's FP32 sums multiplied by A's and W's scales of that block and summed in FP64 (the exact
// product of the dequantized inputs but for those FP32 sums, exact for small integers).
template <class T>
__global__ void __launch_bounds__(kThreads) reference_gemm_kernel(const T* a, const T* w, float* c, int64_t m,
                                                                  int64_t n, int64_t k, bool w_is_nxk,
                                                                  const float* a_block_scale = nullptr,
                                                                  const float* w_block_scale = nullptr) {
  __shared__ float a_tile[kRefTileK][kRefTile + 1];  // [k][row]
  __shared__ float w_tile[kRefTileK][kRefTile + 1];  // [k][column]
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t row0 = int64_t(blockIdx.y) * kRefTile;
  const int64_t col0 = int64_t(blockIdx.x) * kRefTile;
  float acc[4][4] = {};
  double scaled[4][4] = {};  // blockwise: the scaled blocks' sum

  for (int64_t k0 = 0; k0 < k; k0 += kRefTileK) {
    // Loads walk the contiguous dimension of each operand.
    for (int idx = threadIdx.x; idx < kRefTile * kRefTileK; idx += kThreads) {
      const int a_row = idx / kRefTileK, a_k = idx % kRefTileK;
      const int64_t gr = row0 + a_row, gk = k0 + a_k;
      a_tile[a_k][a_row] = (gr < m && gk < k) ? to_float(a[gr * k + gk]) : 0.0f;

      const int w_k = w_is_nxk ? idx % kRefTileK : idx / kRefTile;
      const int w_col = w_is_nxk ? idx / kRefTileK : idx % kRefTile;
      const int64_t wk = k0 + w_k, wc = col0 + w_col;
      float wv = 0.0f;
      if (wk < k && wc < n) wv = to_float(w_is_nxk ? w[wc * k + wk] : w[wk * n + wc]);
      w_tile[w_k][w_col] = wv;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kRefTileK; ++kk) {
      float av[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = a_tile[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = w_tile[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
    }
    __syncthreads();
    if (a_block_scale != nullptr && ((k0 + kRefTileK) % kScaleBlock == 0 || k0 + kRefTileK >= k)) {
      const int64_t scale_blocks = k / kScaleBlock, block = k0 / kScaleBlock;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t col = col0 + tx + 16 * j;
          if (r < m && col < n) {
            scaled[i][j] += double(acc[i][j]) * double(a_block_scale[r * scale_blocks + block]) *
                            double(w_block_scale[(col / kScaleBlock) * scale_blocks + block]);
          }
          acc[i][j] = 0.0f;
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = row0 + ty + 16 * i, col = col0 + tx + 16 * j;
      if (r < m && col < n) c[r * n + col] = a_block_scale != nullptr ? float(scaled[i][j]) : acc[i][j];
    }
  }
}

// ref[r][c] *= a_scale[r * a_step] * w_scale[c * w_step]: as the kernels scale, in FP32.
__global__ void scale_ref_kernel(float* ref, int64_t m, int64_t n, const float* a_scale, int a_step,
                                 const float* w_scale, int w_step) {
  const size_t count = size_t(m) * size_t(n);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t r = int64_t(i / size_t(n)), c = int64_t(i % size_t(n));
    ref[i] *= a_scale[r * a_step] * w_scale[c * w_step];
  }
}

// The error sums as the GPU accumulates them: maxima of non-negative doubles as their bits
// (which order like the values), so that atomicMax works on them.
struct DeviceErrorSums {
  unsigned long long max_abs_diff_bits;
  unsigned long long max_abs_ref_bits;
  double sum_sq_diff;
  double sum_sq_ref;
  unsigned long long num_nonfinite;
};

template <class T>
__device__ T block_reduce(T value, bool take_max) {
  __shared__ T partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    const T other = __shfl_down_sync(0xffffffffu, value, offset);
    value = take_max ? (other > value ? other : value) : value + other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / 32 ? partial[lane] : T(0);
    for (int offset = 16; offset > 0; offset /= 2) {
      const T other = __shfl_down_sync(0xffffffffu, value, offset);
      value = take_max ? (other > value ? other : value) : value + other;
    }
  }
  __syncthreads();  // `partial` is reused by the next call
  return value;
}

__global__ void __launch_bounds__(kThreads) error_sums_kernel(const bf16* out, const float* ref, size_t count,
                                                              DeviceErrorSums* sums) {
  double max_abs_diff = 0, max_abs_ref = 0, sum_sq_diff = 0, sum_sq_ref = 0;
  unsigned long long num_nonfinite = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const float o = __bfloat162float(out[i]);
    const double r = ref[i];
    if (!isfinite(o)) {
      ++num_nonfinite;
      continue;
    }
    const double diff = fabs(double(o) - r);
    max_abs_diff = fmax(max_abs_diff, diff);
    max_abs_ref = fmax(max_abs_ref, fabs(r));
    sum_sq_diff += diff * diff;
    sum_sq_ref += r * r;
  }
  max_abs_diff = block_reduce(max_abs_diff, true);
  max_abs_ref = block_reduce(max_abs_ref, true);
  sum_sq_diff = block_reduce(sum_sq_diff, false);
  sum_sq_ref = block_reduce(sum_sq_ref, false);
  num_nonfinite = block_reduce(num_nonfinite, false);
  if (threadIdx.x == 0) {
    atomicMax(&sums->max_abs_diff_bits, static_cast<unsigned long long>(__double_as_longlong(max_abs_diff)));
    atomicMax(&sums->max_abs_ref_bits, static_cast<unsigned long long>(__double_as_longlong(max_abs_ref)));
    atomicAdd(&sums->sum_sq_diff, sum_sq_diff);
    atomicAdd(&sums->sum_sq_ref, sum_sq_ref);
    atomicAdd(&sums->num_nonfinite, num_nonfinite);
  }
}

// sum += addend in FP32; the addend FP32 or BF16.
template <class T>
__global__ void add_kernel(float* sum, const T* addend, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    sum[i] += static_cast<float>(addend[i]);
  }
}

int current_device() {
  int device = 0;
  TESTING_CHECK(cudaGetDevice(&device));
  return device;
}

double double_from_bits(unsigned long long bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

void fill_random_bf16(bf16* data, size_t count, uint64_t seed, cudaStream_t stream) {
  fill_random_kernel<<<grid_for(count), kThreads, 0, stream>>>(data, count, seed);
  TESTING_CHECK(cudaGetLastError());
}

void fill_small_ints_bf16(bf16* data, size_t count, uint64_t seed, cudaStream_t stream) {
  fill_small_ints_kernel<<<grid_for(count), kThreads, 0, stream>>>(data, count, seed);
  TESTING_CHECK(cudaGetLastError());
}

void fill_random_e4m3(uint8_t* data, size_t count, uint64_t seed, cudaStream_t stream) {
  fill_random_e4m3_kernel<<<grid_for(count), kThreads, 0, stream>>>(data, count, seed);
  TESTING_CHECK(cudaGetLastError());
}

void fill_small_ints_e4m3(uint8_t* data, size_t count, uint64_t seed, cudaStream_t stream) {
  fill_small_ints_e4m3_kernel<<<grid_for(count), kThreads, 0, stream>>>(data, count, seed);
  TESTING_CHECK(cudaGetLastError());
}

void fill_random_scales(float* data, size_t count, uint64_t seed, cudaStream_t stream) {
  fill_random_scales_kernel<<<grid_for(count), kThreads, 0, stream>>>(data, count, seed);
  TESTING_CHECK(cudaGetLastError());
}

ScaleShapes scale_shapes(const Problem& problem) {
  switch (problem.scaling) {
    case Scaling::kRowwise: return {{problem.m, 1}, {problem.n, 1}};
    case Scaling::kBlockwise: {
      const int64_t k_blocks = (problem.k_per_rank + kScaleBlock - 1) / kScaleBlock;
      return {{problem.m, k_blocks}, {(problem.n + kScaleBlock - 1) / kScaleBlock, k_blocks}};
    }
    default: return {};  // tensorwise
  }
}

void poison_bf16(bf16* data, size_t count, cudaStream_t stream) {
  TESTING_CHECK(cudaMemsetAsync(data, 0xFF, count * sizeof(bf16), stream));
}

void reference_gemm(const Problem& problem, const bf16* a, const bf16* w, float* ref, cudaStream_t stream) {
  const dim3 grid(unsigned((problem.n + kRefTile - 1) / kRefTile), unsigned((problem.m + kRefTile - 1) / kRefTile));
  reference_gemm_kernel<<<grid, kThreads, 0, stream>>>(a, w, ref, problem.m, problem.n, problem.k_per_rank,
                                                       problem.weight_layout == WeightLayout::kNxK);
  TESTING_CHECK(cudaGetLastError());
}

void reference_gemm_e4m3(const Problem& problem, const uint8_t* a, const uint8_t* w, const InputScales& scales,
                         float* ref, cudaStream_t stream) {
  const dim3 grid(unsigned((problem.n + kRefTile - 1) / kRefTile), unsigned((problem.m + kRefTile - 1) / kRefTile));
  if (problem.scaling == Scaling::kBlockwise) {
    reference_gemm_kernel<<<grid, kThreads, 0, stream>>>(a, w, ref, problem.m, problem.n, problem.k_per_rank,
                                                         problem.weight_layout == WeightLayout::kNxK, scales.a,
                                                         scales.w);
    TESTING_CHECK(cudaGetLastError());
    return;
  }
  reference_gemm_kernel<<<grid, kThreads, 0, stream>>>(a, w, ref, problem.m, problem.n, problem.k_per_rank,
                                                       problem.weight_layout == WeightLayout::kNxK);
  TESTING_CHECK(cudaGetLastError());
  const int step = problem.scaling == Scaling::kRowwise ? 1 : 0;
  scale_ref_kernel<<<grid_for(size_t(problem.m) * problem.n), kThreads, 0, stream>>>(ref, problem.m, problem.n,
                                                                                    scales.a, step, scales.w, step);
  TESTING_CHECK(cudaGetLastError());
}

void add_bf16_to_ref(float* sum, const bf16* addend, size_t count, cudaStream_t stream) {
  add_kernel<<<grid_for(count), kThreads, 0, stream>>>(sum, addend, count);
  TESTING_CHECK(cudaGetLastError());
}

void add_f32_to_ref(float* sum, const float* addend, size_t count, cudaStream_t stream) {
  add_kernel<<<grid_for(count), kThreads, 0, stream>>>(sum, addend, count);
  TESTING_CHECK(cudaGetLastError());
}

ErrorSums measure_error(const bf16* out, const float* ref, size_t count, cudaStream_t stream) {
  DeviceBuffer device_sums(current_device(), sizeof(DeviceErrorSums));
  TESTING_CHECK(cudaMemsetAsync(device_sums.get(), 0, sizeof(DeviceErrorSums), stream));
  error_sums_kernel<<<grid_for(count), kThreads, 0, stream>>>(out, ref, count, device_sums.as<DeviceErrorSums>());
  TESTING_CHECK(cudaGetLastError());
  DeviceErrorSums host{};
  TESTING_CHECK(cudaMemcpyAsync(&host, device_sums.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  TESTING_CHECK(cudaStreamSynchronize(stream));

  ErrorSums sums;
  sums.max_abs_diff = double_from_bits(host.max_abs_diff_bits);
  sums.max_abs_ref = double_from_bits(host.max_abs_ref_bits);
  sums.sum_sq_diff = host.sum_sq_diff;
  sums.sum_sq_ref = host.sum_sq_ref;
  sums.num_nonfinite = host.num_nonfinite;
  return sums;
}

}  // namespace tpfuse::testing
