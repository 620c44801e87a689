// The GPUs' SM clock and power during a timed loop, read through NVML. NVML comes with the driver
// (libnvidia-ml.so.1) and is loaded at run time, so the benchmark builds and runs without it: then
// every reading is empty and GpuSensors says why. Pure C++ (no CUDA), so the CPU tests can link it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tpfuse::bench {

// NVML's shared library as the driver installs it.
inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// The sensors of a set of GPUs. A reading NVML refuses is left empty from then on, and its failure
// is kept for take_failures(); NVML's calls are thread-safe, so a sampler thread may read.
class GpuSensors {
 public:
  // One entry per GPU: its PCI bus id as cudaDeviceGetPCIBusId writes it (NVML's device order may
  // differ from CUDA's). `library`: the NVML to load.
  explicit GpuSensors(const std::vector<std::string>& pci_bus_ids, const char* library = kNvmlLibrary);
  ~GpuSensors();
  GpuSensors(const GpuSensors&) = delete;
  GpuSensors& operator=(const GpuSensors&) = delete;

  // False: NVML or one of the GPUs was not found, and no reading is taken.
  bool available() const { return unavailable_reason_.empty(); }
  // Why not available, e.g. "NVML unavailable: libnvidia-ml.so.1: cannot open shared object file".
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  int size() const { return int(devices_.size()); }

  std::optional<double> sm_clock_mhz(int gpu);
  std::optional<double> power_w(int gpu);
  // The energy counter (since the driver loaded), in joules.
  std::optional<double> energy_j(int gpu);
  std::optional<double> max_sm_clock_mhz(int gpu);
  std::optional<double> power_limit_w(int gpu);

  // The failed readings not yet taken, one line each ("nvmlDeviceGetPowerUsage on GPU 0: Not Supported").
  std::vector<std::string> take_failures();

 private:
  struct Nvml;
  enum Reading { kSmClock, kPower, kEnergy, kMaxSmClock, kPowerLimit, kNumReadings };

  // Runs NVML call `call` of `reading` on `gpu`; empty (and the reading turned off) on failure.
  template <typename Value, typename Call>
  std::optional<Value> read(int gpu, Reading reading, const char* name, Call call);

  std::unique_ptr<Nvml> nvml_;
  std::vector<void*> devices_;  // NVML's handles, one per GPU
  std::string unavailable_reason_;
  std::mutex mutex_;  // guards the two below
  std::vector<std::vector<bool>> failed_;  // [gpu][reading]
  std::vector<std::string> failures_;
};

// The energy counter steps every 100 ms on an H200 and one read of it takes about 3 ms, so a loop's
// power is taken from it only over at least this many steps (200 ms between the first and the last:
// a few percent from the reads' dating).
inline constexpr int kMinEnergySteps = 3;

// One reading of a GPU's energy counter.
struct EnergyReading {
  double seconds = 0;  // since the loop's start
  double joules = 0;   // the counter (since the driver loaded)
  int launch = -1;     // the launch that ran from before the read to after it; -1: none, or several
};

// What a sampler collected over one timed loop of `num_launches` interleaved launches.
struct SensorLog {
  int num_launches = 0;
  // [gpu][launch]: the SM clock readings (MHz) taken while that launch ran.
  std::vector<std::vector<std::vector<double>>> sm_clock_mhz;
  // [gpu]: the power readings (W) over the loop.
  std::vector<std::vector<double>> power_w;
  // [gpu]: the energy counter's readings in order, the first at the loop's start and the last at its
  // end; empty where the counter does not exist.
  std::vector<std::vector<EnergyReading>> energy;
  double seconds = 0;  // the loop's wall time
  int num_readings = 0;  // sampling rounds, all GPUs read in each
};

// A loop's sensors, summarized over its GPUs.
struct LoopSensors {
  // Per launch: the lowest over the GPUs of each GPU's median SM clock while the launch ran (the
  // slowest GPU sets an iteration's time).
  std::vector<std::optional<double>> sm_clock_mhz;
  // Per GPU, averaged over the GPUs: the energy counter's increase from its first step inside the
  // loop to its last, over the time between them (the counter moves in steps, so its increase over
  // a short loop's wall time is off by up to a step); the mean of the power readings on a GPU
  // without the counter; empty where a counter stepped fewer than kMinEnergySteps times.
  std::optional<double> power_w;
  // Per launch, averaged over the GPUs: the same over the longest run of counter readings taken
  // while that launch ran (SensorSampler::launch_started); so only where a launch runs long alone,
  // as in separate loops.
  std::vector<std::optional<double>> launch_power_w;
  // The fewest steps of the energy counter inside the loop on any GPU (0 without the counter).
  int energy_steps = 0;
  // The same from the power readings alone (NVML averages them over its own window).
  std::optional<double> power_read_w;
  // The counters' increase over the loop, summed over the GPUs; empty unless every GPU has the counter.
  std::optional<double> energy_j;
  double seconds = 0;
  int num_readings = 0;
};

LoopSensors summarize(const SensorLog& log);

// Reads every GPU's SM clock and power on a thread of its own, every `period`, and the energy
// counters on another as often as they answer (a read takes milliseconds, a clock read a
// microsecond), from construction to finish(). A clock reading counts for the launch set by
// launch_started(), until launch_done().
class SensorSampler {
 public:
  SensorSampler(GpuSensors& sensors, int num_launches, std::chrono::milliseconds period);
  ~SensorSampler();
  SensorSampler(const SensorSampler&) = delete;
  SensorSampler& operator=(const SensorSampler&) = delete;

  void launch_started(int launch) { running_launch_.store(launch); }
  void launch_done() { running_launch_.store(-1); }

  // Stops the thread; the loop's summary.
  LoopSensors finish();

 private:
  void sample_until_stopped();
  void read_energy_until_stopped();
  // Appends each GPU's energy counter, dated, to the log.
  void read_energy();
  void stop();

  GpuSensors& sensors_;
  const std::chrono::milliseconds period_;
  std::atomic<int> running_launch_{-1};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  SensorLog log_;
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
  std::thread energy_thread_;
  static constexpr std::chrono::milliseconds kEnergyPause{1};
};

}  // namespace tpfuse::bench
