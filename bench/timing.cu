#include "timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tpfuse::bench {

namespace {

// Queuing an iteration on 8 GPUs takes well under a millisecond; a gate held this long means that
// something in the queued work waited for the GPU (a synchronizing call, or a module load).
constexpr uint64_t kGateTimeoutNs = 5'000'000'000ull;

__device__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until the host publishes `epoch`; bounded, so a host that never releases is an error.
__global__ void wait_for_release(const volatile uint32_t* released_epoch, uint32_t epoch,
                                 volatile uint32_t* timed_out) {
  const uint64_t start = global_timer_ns();
  while (*released_epoch < epoch) {
    if (global_timer_ns() - start > kGateTimeoutNs) {
      *timed_out = 1;
      return;
    }
  }
}

// Two words of pinned, mapped host memory every GPU polls: the released epoch, and a timeout flag.
// With unified addressing the host pointer is valid on every device.
class StartGate {
 public:
  StartGate() {
    TESTING_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words_), 2 * sizeof(uint32_t),
                              cudaHostAllocMapped | cudaHostAllocPortable));
    words_[0] = 0;
    words_[1] = 0;
  }
  ~StartGate() { cudaFreeHost(words_); }
  StartGate(const StartGate&) = delete;
  StartGate& operator=(const StartGate&) = delete;

  // Queues the hold on `stream` for the next epoch (call once per GPU, then release()).
  void hold(cudaStream_t stream) {
    wait_for_release<<<1, 1, 0, stream>>>(&words_[0], epoch_ + 1, &words_[1]);
    TESTING_CHECK(cudaGetLastError());
  }
  void release() {
    ++epoch_;
    __atomic_store_n(&words_[0], epoch_, __ATOMIC_RELEASE);
  }
  bool timed_out() const { return __atomic_load_n(&words_[1], __ATOMIC_ACQUIRE) != 0; }

 private:
  uint32_t* words_ = nullptr;
  uint32_t epoch_ = 0;
};

// A start and a stop event on one GPU.
class EventPair {
 public:
  explicit EventPair(int device) : device_(device) {
    TESTING_CHECK(cudaSetDevice(device));
    TESTING_CHECK(cudaEventCreate(&start));
    TESTING_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaSetDevice(device_);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;

  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;

 private:
  int device_;
};

}  // namespace

LoopTiming time_loop(GpuSet& gpus, const TimingOptions& options, const std::vector<LaunchFn>& launches) {
  const int num_launches = int(launches.size());
  if (const auto& pair = options.alternate;
      pair && (pair->first == pair->second || std::min(pair->first, pair->second) < 0 ||
               std::max(pair->first, pair->second) >= num_launches)) {
    throw CallFailed("time_loop: the alternating pair (" + std::to_string(pair->first) + ", " +
                     std::to_string(pair->second) + ") is not two of the " + std::to_string(num_launches) +
                     " launches");
  }
  for (const LaunchFn& launch : launches) launch(0);
  gpus.synchronize();

  StartGate gate;
  std::vector<std::unique_ptr<EventPair>> events;
  for (Gpu& gpu : gpus) events.push_back(std::make_unique<EventPair>(gpu.device));
  std::optional<SensorSampler> sampler;  // over the timed iterations only

  struct Times {
    double gpu_ms = 0;   // the slowest GPU's
    double host_us = 0;  // queuing the launch
  };
  // One gated iteration of launch `k`, its call number `call` (its input set); `dated`: the
  // sensors' readings while it runs are its.
  auto time_iteration = [&](int k, int call, bool dated) {
    double host_us = 0;
    try {
      for (int g = 0; g < gpus.size(); ++g) {
        TESTING_CHECK(cudaSetDevice(gpus[g].device));
        if (options.gate) gate.hold(gpus[g].stream);
        TESTING_CHECK(cudaEventRecord(events[g]->start, gpus[g].stream));
      }
      const auto queue_start = std::chrono::steady_clock::now();
      launches[k](call);
      host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - queue_start).count();
      for (int g = 0; g < gpus.size(); ++g) {
        TESTING_CHECK(cudaSetDevice(gpus[g].device));
        TESTING_CHECK(cudaEventRecord(events[g]->stop, gpus[g].stream));
      }
    } catch (...) {
      // Let the held GPUs go before the gate's memory is freed.
      gate.release();
      for (Gpu& gpu : gpus) {
        cudaSetDevice(gpu.device);
        cudaStreamSynchronize(gpu.stream);
      }
      throw;
    }
    // The sensors' readings from here to the end of the synchronization are launch k's.
    if (sampler && dated) sampler->launch_started(k);
    gate.release();
    gpus.synchronize();
    if (sampler && dated) sampler->launch_done();
    if (gate.timed_out()) {
      throw CallFailed("the start gate timed out: the queued work waited for a GPU while the GPUs were held "
                       "(run with --no-gate to time without it)");
    }
    double slowest_ms = 0;
    for (int g = 0; g < gpus.size(); ++g) {
      float ms = 0;
      TESTING_CHECK(cudaEventElapsedTime(&ms, events[g]->start, events[g]->stop));
      slowest_ms = std::max(slowest_ms, double(ms));
    }
    return Times{slowest_ms, host_us};
  };

  // Calls are numbered across the launches in the order they run, so that two calls in a row use
  // different input sets: one launch never finds the operands the launch before it left in L2 (in
  // separate loops each launch's own calls are in a row: numbered alone, each of them goes through
  // every set).
  // Per launch, its GPU times in its own place [0] and in its alternating partner's place [1].
  std::vector<std::array<std::vector<double>, 2>> gpu_ms(launches.size());
  std::vector<std::vector<double>> host_us(launches.size());
  for (auto& times : gpu_ms) times[0].reserve(options.iters);
  for (auto& times : host_us) times.reserve(options.iters);
  // The sensors are read from the first timed iteration on.
  auto start_sensors = [&] {
    if (options.read_sensors && !sampler) sampler.emplace(gpus.sensors(), num_launches, kSensorPeriod);
  };
  // Launch k's call in iteration `iteration`, run in place `place` of the order. In an interleaved
  // loop a reading counts for the launch that ran from before it to after it.
  auto run_iteration = [&](int k, int place, int iteration, bool timed) {
    if (timed) start_sensors();
    const int call = options.separate_loops ? iteration : iteration * num_launches + place;
    const Times times = time_iteration(k, call, timed && !options.separate_loops);
    if (timed) {
      gpu_ms[k][place == k ? 0 : 1].push_back(times.gpu_ms);
      host_us[k].push_back(times.host_us);
    }
  };
  if (options.separate_loops) {
    using Clock = std::chrono::steady_clock;
    const auto seconds_since = [](Clock::time_point start) {
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (int k = 0; k < num_launches; ++k) {
      int iteration = 0;
      for (const auto start = Clock::now(); iteration < options.warmup || seconds_since(start) < kSettleSeconds;) {
        run_iteration(k, k, iteration++, /*timed=*/false);
      }
      // A separate loop's readings count for its launch, the gaps between its calls included: an
      // NVML read can outlast a short call, and the clock moves slower than the calls follow.
      start_sensors();
      if (sampler) sampler->launch_started(k);
      for (const auto start = Clock::now(); int(gpu_ms[k][0].size()) < options.iters ||
                                            seconds_since(start) < kSeparateTimedSeconds;) {
        run_iteration(k, k, iteration++, /*timed=*/true);
      }
      if (sampler) sampler->launch_done();
    }
  } else {
    for (int iteration = 0; iteration < options.warmup + options.iters; ++iteration) {
      const std::vector<int> order = launch_order(num_launches, iteration, options.alternate);
      for (int place = 0; place < num_launches; ++place) {
        run_iteration(order[place], place, iteration, iteration >= options.warmup);
      }
    }
  }
  LoopTiming result;
  for (int k = 0; k < num_launches; ++k) {
    result.launches.push_back({placed_median(gpu_ms[k][0], gpu_ms[k][1]), median(std::move(host_us[k]))});
  }
  SensorLog unread;
  unread.num_launches = num_launches;
  result.sensors = sampler ? sampler->finish() : summarize(unread);
  return result;
}

double time_median_ms(GpuSet& gpus, const TimingOptions& options, const LaunchFn& launch) {
  return time_loop(gpus, options, {launch}).launches[0].median_ms;
}

}  // namespace tpfuse::bench
