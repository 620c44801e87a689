// The GPUs one benchmark process drives (devices 0..count-1): each gets a stream, a cuBLAS handle
// bound to it, and, when asked for, an NCCL communicator (rank = device index, ncclCommInitAll); the
// set has their clock and power sensors.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "sensors.h"
#include "testing/device_buffer.h"

namespace tpfuse::bench {

// The benchmark is built on the shared test support: its buffers, fills, references, measures.
using namespace ::tpfuse::testing;

struct Gpu {
  int device = -1;
  std::string name;
  size_t l2_bytes = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  ncclComm_t comm = nullptr;  // null unless the set was made with NCCL
  DeviceBuffer cublas_workspace;
};

// The device's PCI bus id, as NVML finds the device by it.
std::string pci_bus_id(int device);

class GpuSet {
 public:
  GpuSet(int count, bool with_nccl);
  ~GpuSet();
  GpuSet(const GpuSet&) = delete;
  GpuSet& operator=(const GpuSet&) = delete;

  int size() const { return int(gpus_.size()); }
  Gpu& operator[](int i) { return gpus_[i]; }
  std::vector<Gpu>::iterator begin() { return gpus_.begin(); }
  std::vector<Gpu>::iterator end() { return gpus_.end(); }

  // Waits until every GPU's stream is idle.
  void synchronize();

  GpuSensors& sensors() { return sensors_; }

 private:
  std::vector<Gpu> gpus_;
  GpuSensors sensors_;
};

}  // namespace tpfuse::bench
