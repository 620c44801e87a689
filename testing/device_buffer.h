// Device memory on one GPU, freed when the buffer goes away. Leaves the current device as it was.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "testing/cuda_errors.h"

namespace tpfuse::testing {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    int current = 0;
    TESTING_CHECK(cudaGetDevice(&current));
    TESTING_CHECK(cudaSetDevice(device));
    const cudaError_t err = cudaMalloc(&ptr_, bytes);
    TESTING_CHECK(cudaSetDevice(current));
    TESTING_CHECK(err);
  }
  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      device_ = std::exchange(other.device_, -1);
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  // Errors are ignored here: a destructor cannot report them, and the next checked call will.
  void release() noexcept {
    if (ptr_ == nullptr) return;
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess) {
      cudaFree(ptr_);
      cudaSetDevice(current);
    }
    ptr_ = nullptr;
  }

  int device_ = -1;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tpfuse::testing
