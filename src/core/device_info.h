// What a config choice needs to know about a GPU. The struct is pure C++ (the CPU tests make their
// own devices); current_device_info reads the current CUDA device.
#pragma once

#include "tpfuse/status.h"

namespace tpfuse {

struct DeviceInfo {
  int num_sms = 132;
  int max_smem_per_block = 232448;  // bytes of dynamic shared memory a block may opt in to (H100/H200)
  int cc_major = 9;
  int cc_minor = 0;
};

Status current_device_info(DeviceInfo* info);

}  // namespace tpfuse
