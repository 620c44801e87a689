#include "gpu_testing.cuh"

namespace tpfuse::testing {
namespace {

__device__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

__global__ void fill_random_kernel(__nv_bfloat16* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix(seed * 0x9E3779B97F4A7C15ULL + i);
    data[i] = __float2bfloat16(float(bits >> 40) / float(1 << 23) - 1.0f);
  }
}

__global__ void fill_small_ints_kernel(__nv_bfloat16* data, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    data[i] = __float2bfloat16(float(int(mix(seed * 0x9E3779B97F4A7C15ULL + i) % 3) - 1));
  }
}

__global__ void reference_gemm_kernel(int m, int n, int k, bool w_k_major, const __nv_bfloat16* a,
                                      const __nv_bfloat16* w, float* ref) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y;
  if (col >= n) return;
  float sum = 0;
  for (int i = 0; i < k; ++i) {
    const float wv = __bfloat162float(w_k_major ? w[size_t(col) * k + i] : w[size_t(i) * n + col]);
    sum = fmaf(__bfloat162float(a[size_t(row) * k + i]), wv, sum);
  }
  ref[size_t(row) * n + col] = sum;
}

}  // namespace

void fill_random(__nv_bfloat16* data, size_t count, uint64_t seed) { fill_random_kernel<<<1024, 256>>>(data, count, seed); }

void fill_small_ints(__nv_bfloat16* data, size_t count, uint64_t seed) {
  fill_small_ints_kernel<<<1024, 256>>>(data, count, seed);
}

void poison(__nv_bfloat16* data, size_t count) { cudaMemset(data, 0xFF, count * sizeof(__nv_bfloat16)); }

void reference_gemm(const Problem& p, const __nv_bfloat16* a, const __nv_bfloat16* w, float* ref) {
  const dim3 grid(unsigned((p.n + 255) / 256), unsigned(p.m));
  reference_gemm_kernel<<<grid, 256>>>(int(p.m), int(p.n), int(p.k_per_rank), p.weight_layout == WeightLayout::kNxK,
                                        a, w, ref);
}

Errors compare(const std::vector<__nv_bfloat16>& out, const std::vector<float>& ref) {
  double max_err = 0, max_ref = 0, err2 = 0, ref2 = 0;
  Errors e;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = __bfloat162float(out[i]);
    if (!std::isfinite(o)) {
      ++e.non_finite;
      continue;
    }
    const double d = std::fabs(o - ref[i]);
    max_err = std::max(max_err, d);
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    err2 += d * d;
    ref2 += double(ref[i]) * ref[i];
  }
  e.max_rel = max_ref > 0 ? max_err / max_ref : max_err;
  e.norm_rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return e;
}

int64_t first_mismatch(const std::vector<__nv_bfloat16>& out, const std::vector<float>& ref) {
  for (size_t i = 0; i < out.size(); ++i) {
    const __nv_bfloat16 expected = __float2bfloat16(ref[i]);
    if (*reinterpret_cast<const uint16_t*>(&out[i]) != *reinterpret_cast<const uint16_t*>(&expected)) return int64_t(i);
  }
  return -1;
}

}  // namespace tpfuse::testing
