// Code that the CPU tests and the kernels compile alike, so that what the CPU tests check is what
// the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define TPFUSE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TPFUSE_HOST_DEVICE inline
#endif
