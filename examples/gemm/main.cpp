// One per-rank GEMM through the installed library: only tpfuse/gemm.h (no NCCL header needed).
// Without a usable GPU it says so and exits 0; a bad Status or a wrong result exits 1.
#include <tpfuse/gemm.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

uint16_t bf16_of(float x) {  // exact for the small integers used here
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return uint16_t(bits >> 16);
}

float float_of(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("example_gemm: no CUDA GPU visible; nothing to run\n");
    return 0;
  }
  tpfuse::Problem p;
  p.m = 256;
  p.n = 512;
  p.k_per_rank = 64;
  p.weight_layout = tpfuse::WeightLayout::kKxN;
  p.dtype = tpfuse::DType::kBF16;  // of a and w (c is BF16 whatever they are)
  // Small integers: every product and sum is exact in BF16, so the result must match exactly.
  std::vector<uint16_t> a(size_t(p.m * p.k_per_rank)), w(size_t(p.k_per_rank * p.n)), c(size_t(p.m * p.n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_of(float(int(i % 3) - 1));
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_of(float(int(i % 5) - 2));
  void *da = nullptr, *dw = nullptr, *dc = nullptr;
  cudaMalloc(&da, a.size() * 2);
  cudaMalloc(&dw, w.size() * 2);
  cudaMalloc(&dc, c.size() * 2);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  const tpfuse::Status s = tpfuse::gemm(p, da, dw, dc, nullptr);
  if (!s.ok()) {
    std::printf("example_gemm: %s\n", s.to_string().c_str());
    return 1;
  }
  cudaMemcpy(c.data(), dc, c.size() * 2, cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float ref = 0;
      for (int64_t k = 0; k < p.k_per_rank; ++k) ref += float_of(a[i * p.k_per_rank + k]) * float_of(w[k * p.n + j]);
      wrong += float_of(c[i * p.n + j]) != ref;
    }
  }
  cudaFree(da);
  cudaFree(dw);
  cudaFree(dc);
  std::printf("example_gemm: %lld x %lld x %lld, %d wrong\n", (long long)p.m, (long long)p.n,
              (long long)p.k_per_rank, wrong);
  return wrong == 0 ? 0 : 1;
}
