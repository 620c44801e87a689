// The benchmark's clock and power sensors: how a loop's readings are summarized; that without
// NVML (or with a library that is not NVML) every reading is empty, with a reason, and nothing
// fails; and, through a stand-in for NVML's library (fake_nvml.cpp), the readings and their failures.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "sensors.h"

namespace tpfuse::bench {
namespace {

TEST(BenchSensors, SummaryTakesEachLaunchsMedianClockOnTheSlowestGpu) {
  SensorLog log;
  log.num_launches = 2;
  // GPU 0: launch 0 at 1500 (median of three), launch 1 at 1450; GPU 1 slower on launch 0 only.
  log.sm_clock_mhz = {{{1500, 1980, 1410}, {1440, 1460}}, {{1425, 1425}, {1515}}};
  log.power_w = {{690, 700}, {650, 660, 670}};
  // Counters stepping every 50 ms (GPU 0 by 35 J, GPU 1 by 32.5 J), read every 20 ms from 0 to 0.2 s.
  for (int gpu = 0; gpu < 2; ++gpu) {
    log.energy.emplace_back();
    for (int ms = 0; ms <= 200; ms += 20) {
      log.energy[gpu].push_back({ms * 1e-3, 1000.0 + (gpu == 0 ? 35.0 : 32.5) * (ms / 50)});
    }
  }
  log.seconds = 0.2;
  log.num_readings = 3;
  const LoopSensors s = summarize(log);
  ASSERT_EQ(s.sm_clock_mhz.size(), 2u);
  ASSERT_TRUE(s.sm_clock_mhz[0] && s.sm_clock_mhz[1]);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz[0], 1425);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz[1], 1450);
  // Power per GPU from the counter's steps (first seen at 60 ms, last at 200 ms: three steps in
  // 0.14 s): 750 W and 696 W, averaged; the counted increase over the loop is 4 steps.
  ASSERT_TRUE(s.power_w);
  EXPECT_DOUBLE_EQ(*s.power_w, (3 * 35.0 + 3 * 32.5) / 0.14 / 2);
  EXPECT_EQ(s.energy_steps, 4);
  ASSERT_TRUE(s.power_read_w);
  EXPECT_DOUBLE_EQ(*s.power_read_w, (695.0 + 660.0) / 2);
  ASSERT_TRUE(s.energy_j);
  EXPECT_DOUBLE_EQ(*s.energy_j, 4 * 35.0 + 4 * 32.5);
  EXPECT_DOUBLE_EQ(s.seconds, 0.2);
  EXPECT_EQ(s.num_readings, 3);
}

TEST(BenchSensors, SummaryFallsBackToPowerReadingsAndNeverGuesses) {
  SensorLog log;
  log.num_launches = 2;
  // Launch 1 ran between readings on GPU 1: no clock for it. No energy counter on GPU 1.
  log.sm_clock_mhz = {{{1500}, {1450}}, {{1490}, {}}};
  log.power_w = {{700}, {600, 640}};
  log.energy = {{{0.0, 10.0}, {0.03, 31.0}, {0.06, 52.0}, {0.09, 73.0}, {0.1, 73.0}}, {}};
  log.seconds = 0.1;
  const LoopSensors s = summarize(log);
  ASSERT_TRUE(s.sm_clock_mhz[0]);
  EXPECT_DOUBLE_EQ(*s.sm_clock_mhz[0], 1490);
  EXPECT_FALSE(s.sm_clock_mhz[1]);
  ASSERT_TRUE(s.power_w);
  EXPECT_DOUBLE_EQ(*s.power_w, (700.0 + 620.0) / 2);
  EXPECT_FALSE(s.energy_j);
  EXPECT_EQ(s.energy_steps, 0);

  // No power readings on a GPU without the counter: no power at all.
  log.power_w[1].clear();
  EXPECT_FALSE(summarize(log).power_w);
  EXPECT_FALSE(summarize(log).power_read_w);
}

TEST(BenchSensors, ALoopOfFewStepsOfTheCounterHasNoPower) {
  SensorLog log;
  log.num_launches = 1;
  log.sm_clock_mhz = {{{1500}}};
  log.power_w = {{690, 710}};
  // A 30 ms loop over which a counter stepping every 50 ms moved once, by 35 J: over the loop's
  // wall time that would read 1167 W, and NVML's power reading averages a longer window.
  log.energy = {{{0.0, 100.0}, {0.01, 100.0}, {0.02, 135.0}, {0.03, 135.0}}};
  log.seconds = 0.03;
  LoopSensors s = summarize(log);
  EXPECT_FALSE(s.power_w);
  ASSERT_TRUE(s.power_read_w);
  EXPECT_DOUBLE_EQ(*s.power_read_w, 700);
  EXPECT_EQ(s.energy_steps, 1);
  ASSERT_TRUE(s.energy_j);
  EXPECT_DOUBLE_EQ(*s.energy_j, 35);

  // One step short of kMinEnergySteps: still none; at it, the steps' power.
  log.energy[0].clear();
  for (int step = 0; step <= kMinEnergySteps; ++step) log.energy[0].push_back({0.05 * step, 100.0 + 35.0 * step});
  log.energy[0].pop_back();
  s = summarize(log);
  EXPECT_EQ(s.energy_steps, kMinEnergySteps - 1);
  EXPECT_FALSE(s.power_w);
  log.energy[0].push_back({0.05 * kMinEnergySteps, 100.0 + 35.0 * kMinEnergySteps});
  s = summarize(log);
  EXPECT_EQ(s.energy_steps, kMinEnergySteps);
  ASSERT_TRUE(s.power_w);
  EXPECT_DOUBLE_EQ(*s.power_w, 700);
}

TEST(BenchSensors, EachLaunchsPowerComesFromTheReadingsTakenWhileItAloneRan) {
  SensorLog log;
  log.num_launches = 3;
  log.sm_clock_mhz = {{{1500}, {1600}, {}}};
  log.power_w = {{600}};
  // Launch 0 for 0.4 s at 700 W, a reading during no launch, launch 1 for 0.4 s at 500 W; the
  // counter steps every 0.1 s and is read every 0.05 s. Launch 2 never ran alone.
  std::vector<EnergyReading>& counter = log.energy.emplace_back();
  double joules = 0;
  for (int i = 0; i <= 8; ++i) {
    if (i > 0 && i % 2 == 0) joules += 70;
    counter.push_back({0.05 * i, joules, 0});
  }
  counter.push_back({0.45, joules, -1});
  for (int i = 1; i <= 8; ++i) {
    if (i % 2 == 0) joules += 50;
    counter.push_back({0.45 + 0.05 * i, joules, 1});
  }
  log.seconds = 0.85;
  const LoopSensors s = summarize(log);
  ASSERT_EQ(s.launch_power_w.size(), 3u);
  ASSERT_TRUE(s.launch_power_w[0] && s.launch_power_w[1]);
  EXPECT_DOUBLE_EQ(*s.launch_power_w[0], 700);
  EXPECT_DOUBLE_EQ(*s.launch_power_w[1], 500);
  EXPECT_FALSE(s.launch_power_w[2]);
  // The loop's: 8 steps from 0.1 s to 0.85 s.
  EXPECT_EQ(s.energy_steps, 8);
  ASSERT_TRUE(s.power_w);
  EXPECT_DOUBLE_EQ(*s.power_w, (3 * 70.0 + 4 * 50.0) / 0.75);
}

TEST(BenchSensors, EmptyLogGivesEmptyColumns) {
  SensorLog log;
  log.num_launches = 3;
  const LoopSensors s = summarize(log);
  ASSERT_EQ(s.sm_clock_mhz.size(), 3u);
  for (const auto& mhz : s.sm_clock_mhz) EXPECT_FALSE(mhz);
  ASSERT_EQ(s.launch_power_w.size(), 3u);
  for (const auto& watts : s.launch_power_w) EXPECT_FALSE(watts);
  EXPECT_FALSE(s.power_w);
  EXPECT_FALSE(s.power_read_w);
  EXPECT_FALSE(s.energy_j);
}

// Every reading of unavailable sensors is empty, and a sampler over them summarizes to nothing.
void expect_unavailable(GpuSensors& sensors, const std::string& reason_part) {
  EXPECT_FALSE(sensors.available());
  EXPECT_NE(sensors.unavailable_reason().find("NVML unavailable"), std::string::npos) << sensors.unavailable_reason();
  EXPECT_NE(sensors.unavailable_reason().find(reason_part), std::string::npos) << sensors.unavailable_reason();
  EXPECT_EQ(sensors.size(), 0);
  EXPECT_FALSE(sensors.sm_clock_mhz(0));
  EXPECT_FALSE(sensors.power_w(0));
  EXPECT_FALSE(sensors.energy_j(0));
  EXPECT_FALSE(sensors.max_sm_clock_mhz(0));
  EXPECT_FALSE(sensors.power_limit_w(0));
  EXPECT_TRUE(sensors.take_failures().empty());

  SensorSampler sampler(sensors, 2, std::chrono::milliseconds(1));
  sampler.launch_started(1);
  sampler.launch_done();
  const LoopSensors s = sampler.finish();
  ASSERT_EQ(s.sm_clock_mhz.size(), 2u);
  EXPECT_FALSE(s.sm_clock_mhz[0] || s.sm_clock_mhz[1]);
  EXPECT_FALSE(s.power_w);
  EXPECT_FALSE(s.energy_j);
  EXPECT_EQ(s.num_readings, 0);
}

TEST(BenchSensors, WithoutNvmlNothingIsRead) {
  GpuSensors sensors({"00000000:18:00.0"}, "libtpfuse-test-no-such-nvml.so.1");
  expect_unavailable(sensors, "libtpfuse-test-no-such-nvml.so.1");
}

TEST(BenchSensors, ALibraryThatIsNotNvmlIsRefused) {
  // The C library loads, but has none of NVML's calls.
  GpuSensors sensors({"00000000:18:00.0"}, "libc.so.6");
  expect_unavailable(sensors, "nvmlInit_v2");
}

// The stand-in's GPUs by PCI bus id, as cudaDeviceGetPCIBusId writes them.
const std::string kGpu0 = "0000:18:00.0";
const std::string kGpu1 = "0000:2a:00.0";

TEST(BenchSensors, ReadsThroughNvml) {
  GpuSensors sensors({kGpu0}, TPFUSE_FAKE_NVML);
  ASSERT_TRUE(sensors.available()) << sensors.unavailable_reason();
  ASSERT_EQ(sensors.size(), 1);
  EXPECT_EQ(sensors.max_sm_clock_mhz(0), 1980);
  EXPECT_EQ(sensors.power_limit_w(0), 700);
  EXPECT_EQ(sensors.power_w(0), 700);
  EXPECT_TRUE(sensors.energy_j(0));
  EXPECT_TRUE(sensors.take_failures().empty());
}

TEST(BenchSensors, SamplerCountsEachClockReadingForTheLaunchThatRan) {
  void* library = dlopen(TPFUSE_FAKE_NVML, RTLD_NOW);
  ASSERT_NE(library, nullptr) << dlerror();
  const auto set_sm_clock = reinterpret_cast<void (*)(unsigned)>(dlsym(library, "fake_nvml_set_sm_clock"));
  ASSERT_NE(set_sm_clock, nullptr);

  GpuSensors sensors({kGpu0}, TPFUSE_FAKE_NVML);
  ASSERT_TRUE(sensors.available()) << sensors.unavailable_reason();
  SensorSampler sampler(sensors, 3, std::chrono::milliseconds(1));
  // Launch 0 runs at 1500 MHz, launch 1 at 1800; launch 2 never runs; readings between launches
  // (at 1000 MHz) count for none.
  for (const auto& [launch, mhz] : {std::pair{0, 1500u}, std::pair{1, 1800u}}) {
    set_sm_clock(1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    set_sm_clock(mhz);
    sampler.launch_started(launch);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    sampler.launch_done();
  }
  const LoopSensors s = sampler.finish();
  ASSERT_EQ(s.sm_clock_mhz.size(), 3u);
  EXPECT_EQ(s.sm_clock_mhz[0], 1500);
  EXPECT_EQ(s.sm_clock_mhz[1], 1800);
  EXPECT_FALSE(s.sm_clock_mhz[2]);
  // 700 W: the stand-in's energy counter (stepping every 20 ms) between its first and last step in
  // the loop, each seen at most a reading late; its power reading. The counted energy is short of
  // the loop's by less than a step.
  ASSERT_TRUE(s.power_w && s.power_read_w && s.energy_j);
  EXPECT_GE(s.energy_steps, 3);
  EXPECT_NEAR(*s.power_w, 700, 35);
  EXPECT_EQ(*s.power_read_w, 700);
  EXPECT_NEAR(*s.energy_j, 700 * s.seconds, 700 * 0.02 + 1);
  // Each launch ran 30 ms alone, under two of the counter's 20 ms steps: no power of its own.
  ASSERT_EQ(s.launch_power_w.size(), 3u);
  EXPECT_FALSE(s.launch_power_w[0] || s.launch_power_w[1] || s.launch_power_w[2]);
  EXPECT_GE(s.seconds, 0.08);
  EXPECT_GT(s.num_readings, 10);
  dlclose(library);
}

TEST(BenchSensors, AReadingNvmlRefusesStaysEmptyAndIsReportedOnce) {
  GpuSensors sensors({kGpu0, kGpu1}, TPFUSE_FAKE_NVML);
  ASSERT_TRUE(sensors.available()) << sensors.unavailable_reason();
  SensorSampler sampler(sensors, 1, std::chrono::milliseconds(1));
  sampler.launch_started(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sampler.launch_done();
  const LoopSensors s = sampler.finish();
  // Both GPUs have a clock; GPU 1 has no power reading, so the loop has none.
  EXPECT_TRUE(s.sm_clock_mhz[0]);
  EXPECT_FALSE(s.power_w);
  EXPECT_FALSE(s.power_read_w);
  EXPECT_FALSE(s.energy_j);
  const std::vector<std::string> failures = sensors.take_failures();
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0], "nvmlDeviceGetTotalEnergyConsumption on GPU 1: Not Supported");
  EXPECT_EQ(failures[1], "nvmlDeviceGetPowerUsage on GPU 1: Not Supported");
  EXPECT_TRUE(sensors.take_failures().empty());
  EXPECT_FALSE(sensors.power_w(1));
  EXPECT_EQ(sensors.power_w(0), 700);
}

TEST(BenchSensors, AGpuNvmlDoesNotKnowMakesTheSensorsUnavailable) {
  GpuSensors sensors({kGpu0, "0000:99:00.0"}, TPFUSE_FAKE_NVML);
  EXPECT_FALSE(sensors.available());
  EXPECT_EQ(sensors.unavailable_reason(), "NVML has no GPU 1 (PCI bus id 0000:99:00.0): Not Found");
  EXPECT_FALSE(sensors.sm_clock_mhz(0));
}

}  // namespace
}  // namespace tpfuse::bench
