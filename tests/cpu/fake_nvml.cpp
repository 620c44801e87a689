// A stand-in for NVML's library with two GPUs, for the benchmark's sensor tests on a machine without
// a driver. GPU 0 reads every sensor (its SM clock set by the test, 700 W drawn); GPU 1 has the clocks
// and power limit but neither power reading. Return codes and signatures as nvml.h declares them.
#include <atomic>
#include <chrono>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED
constexpr int kNotFound = 6;      // NVML_ERROR_NOT_FOUND
constexpr int kClockSm = 1;
constexpr unsigned long long kPowerMw = 700000;
constexpr unsigned long long kEnergyStepUs = 20000;

int gpus[2];
std::atomic<unsigned> sm_clock_mhz{1500};
const auto loaded = std::chrono::steady_clock::now();

int index_of(void* device) { return device == &gpus[0] ? 0 : 1; }

}  // namespace

extern "C" {

void fake_nvml_set_sm_clock(unsigned mhz) { sm_clock_mhz.store(mhz); }

int nvmlInit_v2() { return kSuccess; }
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int result) {
  return result == kNotSupported ? "Not Supported" : result == kNotFound ? "Not Found" : "Unknown Error";
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* pci_bus_id, void** device) {
  const char* ids[2] = {"0000:18:00.0", "0000:2a:00.0"};
  for (int g = 0; g < 2; ++g) {
    if (std::strcmp(pci_bus_id, ids[g]) == 0) {
      *device = &gpus[g];
      return kSuccess;
    }
  }
  return kNotFound;
}

int nvmlDeviceGetClockInfo(void*, int type, unsigned* mhz) {
  if (type != kClockSm) return kNotSupported;
  *mhz = sm_clock_mhz.load();
  return kSuccess;
}

int nvmlDeviceGetMaxClockInfo(void*, int type, unsigned* mhz) {
  if (type != kClockSm) return kNotSupported;
  *mhz = 1980;
  return kSuccess;
}

int nvmlDeviceGetPowerUsage(void* device, unsigned* mw) {
  if (index_of(device) != 0) return kNotSupported;
  *mw = unsigned(kPowerMw);
  return kSuccess;
}

// kPowerMw since the library loaded, in mJ, updated every kEnergyStepUs as a GPU's counter is.
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* mj) {
  if (index_of(device) != 0) return kNotSupported;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - loaded);
  const unsigned long long stepped_us = (unsigned long long)(us.count()) / kEnergyStepUs * kEnergyStepUs;
  *mj = stepped_us * kPowerMw / 1000000ull;
  return kSuccess;
}

int nvmlDeviceGetEnforcedPowerLimit(void*, unsigned* mw) {
  *mw = unsigned(kPowerMw);
  return kSuccess;
}

}  // extern "C"
