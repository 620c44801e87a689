// Probe: TMA tile-mode stores/loads with negative coordinates, and a store from a 128B-aligned
// (not 1024B) swizzled smem base. Usage: probe A|B|C
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_bf16.h>
#include "core/ptx.cuh"
#include "core/tensor_map.h"
using namespace tpfuse;
constexpr int R = 8;  // tensor rows
__global__ void kstore(const __grid_constant__ CUtensorMap map, int y, int smem_row_offset) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* buf = (uint8_t*)(((uintptr_t)raw + 1023) & ~uintptr_t(1023));
  uint16_t* s = (uint16_t*)buf;
  // logical (r, c) -> swizzled address: row r at r*128, 16B piece p -> p ^ (r % 8)
  for (int i = threadIdx.x; i < 80 * 64; i += blockDim.x) {
    int r = i / 64, c = i % 64;
    int piece = c / 8, within = c % 8;
    s[r * 64 + ((piece ^ (r % 8)) * 8) + within] = __bfloat16_as_ushort(__float2bfloat16(float(r)));
  }
  ptx::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::tma_store_2d(&map, buf + smem_row_offset * 128, 0, y);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group<0>();
  }
}
__global__ void kload(const __grid_constant__ CUtensorMap map, int y, float* out) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* buf = (uint8_t*)(((uintptr_t)raw + 1023) & ~uintptr_t(1023));
  __shared__ uint64_t bar;
  uint16_t* s = (uint16_t*)buf;
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) s[i] = 0x7fc0;  // NaN marker
  ptx::fence_proxy_async_shared();
  if (threadIdx.x == 0) { ptx::mbarrier_init(&bar, 1); ptx::fence_barrier_init(); }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_expect_tx(&bar, 64 * 64 * 2);
    ptx::tma_load_2d(buf, &map, &bar, 0, y);
  }
  ptx::mbarrier_wait(&bar, 0);
  for (int r = threadIdx.x; r < 64; r += blockDim.x) {
    int piece = 0;
    out[r] = __bfloat162float(__ushort_as_bfloat16(s[r * 64 + ((piece ^ (r % 8)) * 8)]));
  }
}
int main(int argc, char** argv) {
  const char t = argc > 1 ? argv[1][0] : 'A';
  __nv_bfloat16* g; cudaMalloc(&g, R * 64 * 2);
  std::vector<uint16_t> h(R * 64, 0x4000 | 0x0100);  // marker
  cudaMemcpy(g, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  CUtensorMap map;
  Status st = make_tensor_map_bf16(g, R, 64, 64, 64, 64, &map);
  if (!st.ok()) { printf("map: %s\n", st.to_string().c_str()); return 1; }
  cudaFuncSetAttribute(kstore, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
  cudaFuncSetAttribute(kload, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
  if (t == 'A' || t == 'C') {
    kstore<<<1, 128, 80 * 128 + 1024>>>(map, t == 'A' ? -8 : 0, t == 'A' ? 0 : 3);
    cudaError_t e = cudaDeviceSynchronize();
    printf("%c: %s\n", t, cudaGetErrorString(e));
    if (e) return 1;
    cudaMemcpy(h.data(), g, h.size() * 2, cudaMemcpyDeviceToHost);
    for (int r = 0; r < R; ++r) {
      __nv_bfloat16 b; std::memcpy(&b, &h[r * 64], 2); __nv_bfloat16 b2; std::memcpy(&b2, &h[r * 64 + 63], 2);
      printf("  g row %d: %g .. %g (expect %d)\n", r, __bfloat162float(b), __bfloat162float(b2), t == 'A' ? r + 8 : r + 3);
    }
  } else {
    for (int r = 0; r < R; ++r) for (int c = 0; c < 64; ++c) { __nv_bfloat16 b = __float2bfloat16(float(100 + r)); std::memcpy(&h[r * 64 + c], &b, 2); }
    cudaMemcpy(g, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
    float* out; cudaMalloc(&out, 64 * 4);
    kload<<<1, 128, 64 * 128 + 1024>>>(map, -8, out);
    cudaError_t e = cudaDeviceSynchronize();
    printf("B: %s\n", cudaGetErrorString(e));
    if (e) return 1;
    float o[64]; cudaMemcpy(o, out, 256, cudaMemcpyDeviceToHost);
    for (int r = 0; r < 20; ++r) printf("  smem row %d: %g (expect %s)\n", r, o[r], r >= 8 && r < 16 ? "100+r-8" : "0");
  }
  return 0;
}
