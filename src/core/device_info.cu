#include "core/device_info.h"

#include "core/cuda_check.h"

namespace tpfuse {

Status current_device_info(DeviceInfo* info) {
  int device = 0;
  TPFUSE_CUDA_TRY(cudaGetDevice(&device));
  TPFUSE_CUDA_TRY(cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount, device));
  TPFUSE_CUDA_TRY(cudaDeviceGetAttribute(&info->max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TPFUSE_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, device));
  TPFUSE_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  return Status::Ok();
}

}  // namespace tpfuse
