// What the config choice needs to know about the current GPU.
#pragma once

#include "plan/config.h"
#include "tpfuse/status.h"

namespace tpfuse {

Status current_device_info(DeviceInfo* info);

}  // namespace tpfuse
