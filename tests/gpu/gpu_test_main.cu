// main() of every GPU test: without a usable Hopper GPU it prints why and returns 77, which CTest
// reports as skipped (never as passed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA GPU visible (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  if (prop.major != 9) {
    std::printf("SKIPPED: tpfuse's kernels need a Hopper GPU (sm_90); device 0 is %s (sm_%d%d)\n", prop.name,
                prop.major, prop.minor);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
