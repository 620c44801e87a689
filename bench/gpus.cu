#include "gpus.h"

#include <cublas_v2.h>

#include <cstdlib>

namespace tpfuse::bench {

namespace {

// cuBLAS's recommended workspace on Hopper. Set explicitly so that no GEMM allocates while timed.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

std::vector<std::string> pci_bus_ids(int count) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) ids.push_back(pci_bus_id(i));
  return ids;
}

}  // namespace

std::string pci_bus_id(int device) {
  char id[32] = {};
  TESTING_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), device));
  return id;
}

GpuSet::GpuSet(int count, bool with_nccl) : gpus_(count), sensors_(pci_bus_ids(count)) {
  for (int i = 0; i < count; ++i) {
    Gpu& gpu = gpus_[i];
    gpu.device = i;
    TESTING_CHECK(cudaSetDevice(i));
    cudaDeviceProp prop{};
    TESTING_CHECK(cudaGetDeviceProperties(&prop, i));
    gpu.name = prop.name;
    gpu.l2_bytes = size_t(prop.l2CacheSize);
    TESTING_CHECK(cudaStreamCreateWithFlags(&gpu.stream, cudaStreamNonBlocking));
    TESTING_CHECK(cublasCreate(&gpu.cublas));
    // NOTE: cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
    TESTING_CHECK(cublasSetStream(gpu.cublas, gpu.stream));
    gpu.cublas_workspace = DeviceBuffer(i, kCublasWorkspaceBytes);
    TESTING_CHECK(cublasSetWorkspace(gpu.cublas, gpu.cublas_workspace.get(), kCublasWorkspaceBytes));
  }
  if (with_nccl) {
    // NVLink SHARP (multicast) is off on the target machines and must stay off.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    std::vector<ncclComm_t> comms(count);
    std::vector<int> devices(count);
    for (int i = 0; i < count; ++i) devices[i] = i;
    TESTING_CHECK(ncclCommInitAll(comms.data(), count, devices.data()));
    for (int i = 0; i < count; ++i) gpus_[i].comm = comms[i];
  }
}

// Errors are ignored here: a destructor cannot report them.
GpuSet::~GpuSet() {
  // One thread finalizes several communicators inside a group (NCCL's rule), then frees them.
  ncclGroupStart();
  for (Gpu& gpu : gpus_) {
    if (gpu.comm != nullptr) ncclCommFinalize(gpu.comm);
  }
  ncclGroupEnd();
  for (Gpu& gpu : gpus_) {
    if (gpu.comm != nullptr) ncclCommDestroy(gpu.comm);
  }
  for (Gpu& gpu : gpus_) {
    cudaSetDevice(gpu.device);
    if (gpu.cublas != nullptr) cublasDestroy(gpu.cublas);
    if (gpu.stream != nullptr) cudaStreamDestroy(gpu.stream);
  }
}

void GpuSet::synchronize() {
  for (Gpu& gpu : gpus_) {
    TESTING_CHECK(cudaSetDevice(gpu.device));
    TESTING_CHECK(cudaStreamSynchronize(gpu.stream));
  }
}

}  // namespace tpfuse::bench
