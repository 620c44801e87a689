#include "meta.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <ctime>

#include "gpus.h"
#include "sensors.h"
#include "testing/cuda_errors.h"
#include "git_commit.h"  // TPFUSE_GIT_COMMIT, written at every build (bench/git_commit.cmake)

namespace tpfuse::bench {

namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string hostname() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown";
}

// 13000 -> "13.0"
std::string cuda_version(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string cublas_version() {
  int major = 0, minor = 0, patch = 0;
  TESTING_CHECK(cublasGetProperty(MAJOR_VERSION, &major));
  TESTING_CHECK(cublasGetProperty(MINOR_VERSION, &minor));
  TESTING_CHECK(cublasGetProperty(PATCH_LEVEL, &patch));
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// 22809 -> "2.28.9"
std::string nccl_version() {
  int version = 0;
  TESTING_CHECK(ncclGetVersion(&version));
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

Value number_or_null(const std::optional<double>& value) { return value ? Value(*value) : Value{}; }

}  // namespace

Fields collect_meta(int num_gpus) {
  int driver = 0, runtime = 0, visible = 0;
  TESTING_CHECK(cudaDriverGetVersion(&driver));
  TESTING_CHECK(cudaRuntimeGetVersion(&runtime));
  TESTING_CHECK(cudaGetDeviceCount(&visible));
  cudaDeviceProp prop{};
  TESTING_CHECK(cudaGetDeviceProperties(&prop, 0));
  GpuSensors sensors({pci_bus_id(0)});
  const std::optional<double> max_mhz = sensors.max_sm_clock_mhz(0);
  const std::optional<double> limit_w = sensors.power_limit_w(0);
  std::string nvml_status = sensors.available() ? "ok" : sensors.unavailable_reason();
  for (const std::string& failure : sensors.take_failures()) nvml_status += "; failed: " + failure;
  return {
      {"date", utc_now()},
      {"hostname", hostname()},
      {"gpu", std::string(prop.name)},
      {"gpu_count", double(num_gpus)},
      {"gpus_visible", double(visible)},
      {"sm_clock_max_mhz", number_or_null(max_mhz)},  // GPU 0's
      {"power_limit_w", number_or_null(limit_w)},     // GPU 0's enforced limit
      {"nvml", nvml_status},
      {"cuda_driver_api", cuda_version(driver)},
      {"cuda_runtime", cuda_version(runtime)},
      {"cublas", cublas_version()},
      {"nccl", nccl_version()},
      {"git_commit", std::string(TPFUSE_GIT_COMMIT)},
  };
}

Fields options_fields(const Options& options) {
  return {
      {"mode", options.mode},
      {"op", options.mode == "proxy" || options.mode == "ag-proxy" || options.mode == "fused" || options.mode == "ag"
                 ? Value(std::string(op_flag(options.op)))
                 : Value{}},
      {"warmup", double(options.warmup)},
      {"iters", double(options.iters)},
      {"check", options.check},
      {"shapes", options.shapes_arg},
      {"tp", double(options.tp)},
      {"layout", std::string(layout_flag(options.weight_layout))},
      {"fp8", options.scaling == Scaling::kNone ? Value{} : Value(std::string(to_string(options.scaling)))},
      {"accumulation", options.scaling == Scaling::kNone ? Value{} : Value(std::string(to_string(options.accumulation)))},
      {"gpus", double(options.gpus)},
      {"seed", options.seed ? Value(double(*options.seed)) : Value{}},
      {"gate", options.gate},
      {"sensors", options.sensors},
      {"separate_loops", options.separate_loops},
      {"timeline", options.timeline},
      {"overrides", options.overrides.to_string()},
      {"compare", options.compare ? Value(options.compare->to_string()) : Value{}},
  };
}

}  // namespace tpfuse::bench
