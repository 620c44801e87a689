// Probe (issue 51, the last step): does a kernel's parameter block size cost time on the GPU when
// calls queue back to back? A persistent grid (132 x 384 threads, one CTA an SM) whose work is a
// fixed chain of FMAs, with a __grid_constant__ parameter of 0.5, 1.4, 2.4 or 4 KB that every
// thread reads. Times: CUDA events over 1000 launches, median of 7 repeats, sizes interleaved.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

template <int kBytes>
struct Params {
  unsigned int words[kBytes / 4 - 4];
  float* out;
  int iters;
};

template <int kBytes>
__global__ void __launch_bounds__(384, 1) work(const __grid_constant__ Params<kBytes> p) {
  constexpr int kWords = kBytes / 4 - 4;
  float x = float(p.words[threadIdx.x % kWords]);
  for (int i = 0; i < p.iters; ++i) x = fmaf(x, 1.0000001f, 1e-7f);
  if (x == -1.0f) p.out[blockIdx.x] = x;  // never: keeps the chain alive
}

template <int kBytes>
float time_us(int iters, float* out, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int sms) {
  Params<kBytes> p{};
  for (int i = 0; i < kBytes / 4 - 4; ++i) p.words[i] = i;
  p.out = out;
  p.iters = iters;
  constexpr int kLaunches = 1000;
  for (int i = 0; i < 20; ++i) work<kBytes><<<sms, 384, 0, s>>>(p);
  cudaEventRecord(e0, s);
  for (int i = 0; i < kLaunches; ++i) work<kBytes><<<sms, 384, 0, s>>>(p);
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000.0f / kLaunches;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out = nullptr;
  cudaMalloc(&out, sms * sizeof(float));
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("# per-launch time (us), median of 7 repeats of 1000 back-to-back launches, %d CTAs x 384\n", sms);
  std::printf("%8s %10s %10s %10s %10s %14s\n", "iters", "0.5KB", "1.4KB", "2.4KB", "4.0KB", "2.4-1.4 (us)");
  for (int iters : {0, 2000, 8000, 20000}) {
    std::vector<float> t[4];
    for (int r = 0; r < 7; ++r) {
      t[0].push_back(time_us<512>(iters, out, s, e0, e1, sms));
      t[1].push_back(time_us<1408>(iters, out, s, e0, e1, sms));
      t[2].push_back(time_us<2432>(iters, out, s, e0, e1, sms));
      t[3].push_back(time_us<4000>(iters, out, s, e0, e1, sms));
    }
    float m[4];
    for (int k = 0; k < 4; ++k) {
      std::sort(t[k].begin(), t[k].end());
      m[k] = t[k][3];
    }
    std::printf("%8d %10.3f %10.3f %10.3f %10.3f %14.3f\n", iters, m[0], m[1], m[2], m[3], m[2] - m[1]);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
