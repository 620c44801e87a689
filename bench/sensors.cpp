#include "sensors.h"

#include <dlfcn.h>

#include <algorithm>
#include <numeric>

namespace tpfuse::bench {

namespace {

// The few NVML types and calls used, as nvml.h declares them (the header is not needed to build).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;  // nvmlDevice_t, an opaque handle
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM of nvmlClockType_t

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double mean(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

// The mean over the GPUs of `per_gpu`, or empty unless every GPU has a value.
std::optional<double> mean_of_all(const std::vector<std::optional<double>>& per_gpu) {
  if (per_gpu.empty()) return std::nullopt;
  double sum = 0;
  for (const std::optional<double>& value : per_gpu) {
    if (!value) return std::nullopt;
    sum += *value;
  }
  return sum / double(per_gpu.size());
}

struct StepPower {
  int steps = 0;
  std::optional<double> watts;  // with at least kMinEnergySteps steps
};

// The counter's steps among readings [begin, end) and its increase from the first step to the last
// over the time between them. Each step is dated by the reading that first saw it, at most one
// read late at either end of the span.
StepPower power_over_steps(const std::vector<EnergyReading>& counter, size_t begin, size_t end) {
  StepPower out;
  size_t first = 0, last = 0;
  for (size_t i = begin + 1; i < end; ++i) {
    if (counter[i].joules == counter[i - 1].joules) continue;
    if (out.steps++ == 0) first = i;
    last = i;
  }
  if (out.steps >= kMinEnergySteps && counter[last].seconds > counter[first].seconds) {
    out.watts = (counter[last].joules - counter[first].joules) / (counter[last].seconds - counter[first].seconds);
  }
  return out;
}

}  // namespace

struct GpuSensors::Nvml {
  void* library = nullptr;
  bool initialized = false;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*max_clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;  // mW
  NvmlReturn (*total_energy)(NvmlDevice, unsigned long long*) = nullptr;  // mJ
  NvmlReturn (*enforced_power_limit)(NvmlDevice, unsigned*) = nullptr;  // mW

  ~Nvml() {
    if (initialized) shutdown();
    if (library != nullptr) dlclose(library);
  }

  // Loads `path` and initializes NVML; the reason on failure, else empty.
  std::string open(const char* path) {
    library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      return error != nullptr ? error : std::string(path) + ": cannot be loaded";
    }
    const std::string missing = bind(init, "nvmlInit_v2") + bind(shutdown, "nvmlShutdown") +
                                bind(error_string, "nvmlErrorString") +
                                bind(handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") +
                                bind(clock_info, "nvmlDeviceGetClockInfo") +
                                bind(max_clock_info, "nvmlDeviceGetMaxClockInfo") +
                                bind(power_usage, "nvmlDeviceGetPowerUsage") +
                                bind(total_energy, "nvmlDeviceGetTotalEnergyConsumption") +
                                bind(enforced_power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    if (!missing.empty()) return std::string(path) + " lacks" + missing;
    if (const NvmlReturn result = init(); result != kNvmlSuccess) {
      return std::string("nvmlInit_v2: ") + error_string(result);
    }
    initialized = true;
    return "";
  }

  // Points `function` at the symbol `name`; " name" if the library has no such symbol, else empty.
  template <typename Function>
  std::string bind(Function& function, const char* name) {
    function = reinterpret_cast<Function>(dlsym(library, name));
    return function != nullptr ? "" : std::string(" ") + name;
  }
};

GpuSensors::GpuSensors(const std::vector<std::string>& pci_bus_ids, const char* library)
    : nvml_(std::make_unique<Nvml>()) {
  if (const std::string reason = nvml_->open(library); !reason.empty()) {
    unavailable_reason_ = "NVML unavailable: " + reason;
    return;
  }
  for (size_t g = 0; g < pci_bus_ids.size(); ++g) {
    NvmlDevice device = nullptr;
    if (const NvmlReturn result = nvml_->handle_by_pci_bus_id(pci_bus_ids[g].c_str(), &device);
        result != kNvmlSuccess) {
      unavailable_reason_ = "NVML has no GPU " + std::to_string(g) + " (PCI bus id " + pci_bus_ids[g] +
                            "): " + nvml_->error_string(result);
      devices_.clear();
      return;
    }
    devices_.push_back(device);
  }
  failed_.assign(devices_.size(), std::vector<bool>(kNumReadings, false));
}

GpuSensors::~GpuSensors() = default;

template <typename Value, typename Call>
std::optional<Value> GpuSensors::read(int gpu, Reading reading, const char* name, Call call) {
  if (!available()) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_[gpu][reading]) return std::nullopt;
  }
  Value value{};
  const NvmlReturn result = call(devices_[gpu], &value);
  if (result == kNvmlSuccess) return value;
  std::lock_guard<std::mutex> lock(mutex_);
  failed_[gpu][reading] = true;
  failures_.push_back(std::string(name) + " on GPU " + std::to_string(gpu) + ": " + nvml_->error_string(result));
  return std::nullopt;
}

std::optional<double> GpuSensors::sm_clock_mhz(int gpu) {
  const auto mhz = read<unsigned>(gpu, kSmClock, "nvmlDeviceGetClockInfo",
                                  [&](NvmlDevice d, unsigned* v) { return nvml_->clock_info(d, kNvmlClockSm, v); });
  return mhz ? std::optional<double>(*mhz) : std::nullopt;
}

std::optional<double> GpuSensors::max_sm_clock_mhz(int gpu) {
  const auto mhz = read<unsigned>(gpu, kMaxSmClock, "nvmlDeviceGetMaxClockInfo", [&](NvmlDevice d, unsigned* v) {
    return nvml_->max_clock_info(d, kNvmlClockSm, v);
  });
  return mhz ? std::optional<double>(*mhz) : std::nullopt;
}

std::optional<double> GpuSensors::power_w(int gpu) {
  const auto mw = read<unsigned>(gpu, kPower, "nvmlDeviceGetPowerUsage", nvml_->power_usage);
  return mw ? std::optional<double>(*mw * 1e-3) : std::nullopt;
}

std::optional<double> GpuSensors::energy_j(int gpu) {
  const auto mj = read<unsigned long long>(gpu, kEnergy, "nvmlDeviceGetTotalEnergyConsumption", nvml_->total_energy);
  return mj ? std::optional<double>(double(*mj) * 1e-3) : std::nullopt;
}

std::optional<double> GpuSensors::power_limit_w(int gpu) {
  const auto mw = read<unsigned>(gpu, kPowerLimit, "nvmlDeviceGetEnforcedPowerLimit", nvml_->enforced_power_limit);
  return mw ? std::optional<double>(*mw * 1e-3) : std::nullopt;
}

std::vector<std::string> GpuSensors::take_failures() {
  std::vector<std::string> taken;
  std::lock_guard<std::mutex> lock(mutex_);
  taken.swap(failures_);
  return taken;
}

LoopSensors summarize(const SensorLog& log) {
  const size_t num_gpus = log.power_w.size();
  LoopSensors out;
  out.seconds = log.seconds;
  out.num_readings = log.num_readings;
  out.sm_clock_mhz.assign(log.num_launches, std::nullopt);
  out.launch_power_w.assign(log.num_launches, std::nullopt);
  if (num_gpus == 0) return out;

  for (int k = 0; k < log.num_launches; ++k) {
    std::vector<double> medians;
    for (const auto& per_launch : log.sm_clock_mhz) {
      if (!per_launch[k].empty()) medians.push_back(median(per_launch[k]));
    }
    if (medians.size() == num_gpus) out.sm_clock_mhz[k] = *std::min_element(medians.begin(), medians.end());
  }

  std::vector<std::optional<double>> power(num_gpus), power_read(num_gpus), energy(num_gpus);
  std::vector<std::vector<std::optional<double>>> launch_power(log.num_launches,
                                                               std::vector<std::optional<double>>(num_gpus));
  std::optional<int> fewest_steps;
  for (size_t g = 0; g < num_gpus; ++g) {
    if (!log.power_w[g].empty()) power_read[g] = mean(log.power_w[g]);
    const std::vector<EnergyReading> no_counter;
    const std::vector<EnergyReading>& counter = g < log.energy.size() ? log.energy[g] : no_counter;
    if (counter.size() >= 2) energy[g] = counter.back().joules - counter.front().joules;
    const StepPower loop = power_over_steps(counter, 0, counter.size());
    fewest_steps = std::min(fewest_steps.value_or(loop.steps), loop.steps);
    // NVML's power reading is its own average over a longer window than a short loop, so it stands
    // in only where there is no counter.
    power[g] = counter.size() < 2 ? power_read[g] : loop.watts;
    // A launch's power over its longest run of readings taken while it alone ran.
    for (int k = 0; k < log.num_launches; ++k) {
      size_t best_begin = 0, best_end = 0;
      for (size_t begin = 0; begin < counter.size();) {
        size_t end = begin;
        while (end < counter.size() && counter[end].launch == k) ++end;
        if (end - begin > best_end - best_begin) best_begin = begin, best_end = end;
        begin = std::max(end, begin + 1);
      }
      launch_power[k][g] = power_over_steps(counter, best_begin, best_end).watts;
    }
  }
  for (int k = 0; k < log.num_launches; ++k) out.launch_power_w[k] = mean_of_all(launch_power[k]);
  out.power_w = mean_of_all(power);
  out.power_read_w = mean_of_all(power_read);
  out.energy_steps = fewest_steps.value_or(0);
  if (const std::optional<double> mean_energy = mean_of_all(energy)) out.energy_j = *mean_energy * double(num_gpus);
  return out;
}

SensorSampler::SensorSampler(GpuSensors& sensors, int num_launches, std::chrono::milliseconds period)
    : sensors_(sensors), period_(period) {
  log_.num_launches = num_launches;
  if (!sensors_.available()) return;
  const int num_gpus = sensors_.size();
  log_.sm_clock_mhz.assign(num_gpus, std::vector<std::vector<double>>(num_launches));
  log_.power_w.assign(num_gpus, {});
  log_.energy.assign(num_gpus, {});
  start_ = std::chrono::steady_clock::now();
  read_energy();
  thread_ = std::thread([this] { sample_until_stopped(); });
  energy_thread_ = std::thread([this] { read_energy_until_stopped(); });
}

SensorSampler::~SensorSampler() { stop(); }

void SensorSampler::sample_until_stopped() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    for (int g = 0; g < sensors_.size(); ++g) {
      // A clock reading counts only if one launch ran from before it to after it.
      const int launch = running_launch_.load();
      const std::optional<double> mhz = sensors_.sm_clock_mhz(g);
      if (mhz && launch >= 0 && running_launch_.load() == launch) {
        log_.sm_clock_mhz[g][launch].push_back(*mhz);
      }
      if (const std::optional<double> watts = sensors_.power_w(g)) log_.power_w[g].push_back(*watts);
    }
    ++log_.num_readings;
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stopping_; });
  }
}

void SensorSampler::read_energy_until_stopped() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    read_energy();
    lock.lock();
    wake_.wait_for(lock, kEnergyPause, [this] { return stopping_; });
  }
}

void SensorSampler::read_energy() {
  for (int g = 0; g < sensors_.size(); ++g) {
    const int launch = running_launch_.load();
    if (const std::optional<double> joules = sensors_.energy_j(g)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      log_.energy[g].push_back({seconds, *joules, running_launch_.load() == launch ? launch : -1});
    }
  }
}

void SensorSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (energy_thread_.joinable()) energy_thread_.join();
}

LoopSensors SensorSampler::finish() {
  stop();
  if (sensors_.available()) {
    read_energy();
    log_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  return summarize(log_);
}

}  // namespace tpfuse::bench
