// Mode ag-copy-probe: what the all-gather's pushes cost the GEMM beside them when a copy engine
// moves them instead of the SMs. On GPU 0, per all-gather shape: tpfuse::gemm on the gathered X
// (as ag-proxy's T_gemm), rank 0's block of X copied into P - 1 destination slots alone, and the
// same copies on a second stream while the GEMM runs (the span of both), each way: P - 1
// cudaMemcpyAsync calls, and one cudaMemcpyBatchAsync that asks for copies that overlap compute
// (a device-to-device copy within one GPU may run as a kernel, which waits for the SMs; to tell,
// the copies are also timed beside a kernel that only holds every SM, with all its shared memory,
// for a fixed time: a copy engine's copies overlap it, a copy kernel's follow it). The
// copies land in local memory, as the solo-rank proxy's pushes do; no op is called, nothing waits
// on a flag: it measures the overlap a copy-engine transport could reach at best. Whether the
// copies' timing matters: the GEMM as P GEMMs of one block of rows each, in sequence, alone, with
// every copy issued at the start ("burst"), and with the copy to destination d issued as block d's
// GEMM starts ("paced", when peer d would need it first).
#include <algorithm>
#include <cmath>
#include <string>

#include "gemm_sets.h"
#include "modes.h"
#include "core/ptx.cuh"
#include "testing/gpu_check.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

constexpr uint64_t kHoldNs = 500'000;

// Spins until `ns` have passed since its start, touching no memory. Launched one CTA an SM with all
// of an SM's shared memory (reserved by the launch), so no other kernel's CTA fits beside it.
__global__ void hold_every_sm(uint64_t ns) {
  const uint64_t start = ptx::globaltimer_ns();
  while (ptx::globaltimer_ns() - start < ns) {
  }
}

struct SmHold {
  int ctas = 0;
  int smem_bytes = 0;
  explicit SmHold(int device) {
    TESTING_CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, device));
    TESTING_CHECK(cudaDeviceGetAttribute(&smem_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    TESTING_CHECK(cudaFuncSetAttribute(hold_every_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  }
  void launch(cudaStream_t stream) const {
    hold_every_sm<<<ctas, 32, smem_bytes, stream>>>(kHoldNs);
    TESTING_CHECK(cudaGetLastError());
  }
};

std::vector<Column> copy_probe_columns() {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"block_mb", "block(MB)", 9, Format::kFixed, 2},
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
      {"t_copy_ms", "T_copy(ms)", 10, Format::kFixed, 4},
      {"copy_gb_s", "copy(GB/s)", 10, Format::kFixed, 0},
      {"t_gemm_copy_ms", "T_gemm+copy(ms)", 15, Format::kFixed, 4},
      {"overlap_over_gemm", "both/gemm", 9, Format::kFixed, 3},
      {"serial_over_gemm", "serial/gemm", 11, Format::kFixed, 3},
      {"t_batch_ms", "T_batch(ms)", 11, Format::kFixed, 4},
      {"batch_gb_s", "batch(GB/s)", 11, Format::kFixed, 0},
      {"t_gemm_batch_ms", "T_gemm+batch(ms)", 16, Format::kFixed, 4},
      {"batch_overlap_over_gemm", "both_b/gemm", 11, Format::kFixed, 3},
      {"t_bands_ms", "T_blocks(ms)", 12, Format::kFixed, 4},
      {"bands_burst_over_bands", "burst/blocks", 12, Format::kFixed, 3},
      {"bands_paced_over_bands", "paced/blocks", 12, Format::kFixed, 3},
      {"t_hold_ms", "T_hold(ms)", 10, Format::kFixed, 4},
      {"hold_copy_minus_hold_ms", "copy|hold(ms)", 13, Format::kFixed, 4},
      {"hold_batch_minus_hold_ms", "batch|hold(ms)", 14, Format::kFixed, 4},
      {"mhz_gemm", "MHz_gemm", 8, Format::kInteger},
      {"mhz_gemm_copy", "MHz_both", 8, Format::kInteger},
      {"mhz_gemm_batch", "MHz_both_b", 10, Format::kInteger},
  });
  add_loop_sensor_columns(columns);
  add_outcome_columns(columns, /*check=*/false);
  return columns;
}

// A second stream that joins the GPU's stream for the copies of one call.
class SideStream {
 public:
  explicit SideStream(int device) {
    TESTING_CHECK(cudaSetDevice(device));
    TESTING_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESTING_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    TESTING_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  }
  ~SideStream() {
    cudaEventDestroy(join_);
    cudaEventDestroy(fork_);
    cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t fork(cudaStream_t main) {
    TESTING_CHECK(cudaEventRecord(fork_, main));
    TESTING_CHECK(cudaStreamWaitEvent(stream_, fork_));
    return stream_;
  }
  void join(cudaStream_t main) {
    TESTING_CHECK(cudaEventRecord(join_, stream_));
    TESTING_CHECK(cudaStreamWaitEvent(main, join_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

Row run_shape(GpuSet& gpus, const Options& options, const Shape& shape, size_t shape_index, Report& report) {
  Gpu& gpu = gpus[0];
  const int world = options.tp;
  const Problem gemm{shape.m, shape.n, shape.k_per_rank, 1, options.weight_layout};
  Row row = shape_row(shape);
  Outcome outcome;

  const size_t block_bytes = size_t(shape.m / world) * size_t(shape.k_per_rank) * sizeof(bf16);
  row["block_mb"] = double(block_bytes) / 1e6;
  GemmSets sets = make_gemm_sets(gpu, gemm, 0, *options.seed, shape_index);
  const int num_sets = sets.num_sets;
  DeviceBuffer slots(gpu.device, block_bytes * size_t(world - 1));
  SideStream side(gpu.device);
  const SmHold hold(gpu.device);
  gpus.synchronize();

  // Rank 0's block (the first m/P rows of the set's gathered X) into the P - 1 slots, in order.
  const auto copy_block = [&](int set, cudaStream_t stream) {
    for (int d = 1; d < world; ++d) {
      TESTING_CHECK(cudaMemcpyAsync(static_cast<char*>(slots.get()) + block_bytes * size_t(d - 1), sets.a[set].get(),
                                    block_bytes, cudaMemcpyDeviceToDevice, stream));
    }
  };
  // The same copies as one batch, hinted to overlap compute (a copy engine, where the driver can).
  std::vector<void*> dsts(world - 1);
  std::vector<const void*> srcs(world - 1);
  std::vector<size_t> sizes(world - 1, block_bytes);
  for (int d = 1; d < world; ++d) dsts[d - 1] = static_cast<char*>(slots.get()) + block_bytes * size_t(d - 1);
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attrs_index = 0;
  const auto copy_batch = [&](int set, cudaStream_t stream) {
    std::fill(srcs.begin(), srcs.end(), sets.a[set].get());
    TESTING_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs, &attrs_index, 1,
                                       stream));
  };
  const LaunchFn gemm_call = [&](int i) { ours_on_set(gpu, gemm, sets, rotation_set(i, num_sets), options.overrides); };
  const LaunchFn copy_call = [&](int i) { copy_block(rotation_set(i, num_sets), gpu.stream); };
  const LaunchFn batch_call = [&](int i) { copy_batch(rotation_set(i, num_sets), gpu.stream); };
  // The copies on the side stream beside the GEMM.
  const auto beside_gemm = [&](const auto& copies) {
    return [&, copies](int i) {
      const int set = rotation_set(i, num_sets);
      copies(set, side.fork(gpu.stream));
      ours_on_set(gpu, gemm, sets, set, options.overrides);
      side.join(gpu.stream);
    };
  };
  // The GEMM block by block (rank 0's m/P rows of the gathered X, then the next source's), the
  // copies beside it: none, all at the start, or the one to destination d as block d starts.
  enum class Copies { kNone, kBurst, kPaced };
  const Problem block_gemm{shape.m / world, shape.n, shape.k_per_rank, 1, options.weight_layout};
  const size_t a_block = size_t(block_gemm.m) * size_t(shape.k_per_rank);
  const size_t c_block = size_t(block_gemm.m) * size_t(shape.n);
  const auto block_gemms = [&](Copies copies) {
    return [&, copies](int i) {
      const int set = rotation_set(i, num_sets);
      if (copies == Copies::kBurst) copy_block(set, side.fork(gpu.stream));
      for (int b = 0; b < world; ++b) {
        if (copies == Copies::kPaced && b > 0) {
          TESTING_CHECK(cudaMemcpyAsync(dsts[b - 1], sets.a[set].get(), block_bytes, cudaMemcpyDeviceToDevice,
                                        side.fork(gpu.stream)));
        }
        check_op(tpfuse::gemm(block_gemm, sets.a[set].as<bf16>() + a_block * b, sets.w[set].get(),
                              sets.c_ours[set].as<bf16>() + c_block * b, gpu.stream, options.overrides));
      }
      if (copies != Copies::kNone) side.join(gpu.stream);
    };
  };
  const LaunchFn hold_call = [&](int) { hold.launch(gpu.stream); };
  const auto beside_hold = [&](const auto& copies) {
    return [&, copies](int i) {
      copies(rotation_set(i, num_sets), side.fork(gpu.stream));
      hold.launch(gpu.stream);
      side.join(gpu.stream);
    };
  };

  // In the order the row reads them: t[0] .. t[10].
  const std::vector<LaunchFn> calls{gemm_call,           copy_call,
                                    beside_gemm(copy_block), batch_call,
                                    beside_gemm(copy_batch), hold_call,
                                    beside_hold(copy_block), beside_hold(copy_batch),
                                    block_gemms(Copies::kNone), block_gemms(Copies::kBurst),
                                    block_gemms(Copies::kPaced)};
  LoopTiming loop;
  if (attempt([&] { loop = time_loop(gpus, timing_options(options), calls); }, &outcome.failure)) {
    const auto& t = loop.launches;
    row["t_gemm_ms"] = t[0].median_ms;
    row["t_copy_ms"] = t[1].median_ms;
    row["copy_gb_s"] = double(block_bytes) * (world - 1) / (t[1].median_ms * 1e6);
    row["t_gemm_copy_ms"] = t[2].median_ms;
    row["overlap_over_gemm"] = t[2].median_ms / t[0].median_ms;
    row["serial_over_gemm"] = (t[0].median_ms + t[1].median_ms) / t[0].median_ms;
    row["t_batch_ms"] = t[3].median_ms;
    row["batch_gb_s"] = double(block_bytes) * (world - 1) / (t[3].median_ms * 1e6);
    row["t_gemm_batch_ms"] = t[4].median_ms;
    row["batch_overlap_over_gemm"] = t[4].median_ms / t[0].median_ms;
    row["t_hold_ms"] = t[5].median_ms;
    row["hold_copy_minus_hold_ms"] = t[6].median_ms - t[5].median_ms;
    row["hold_batch_minus_hold_ms"] = t[7].median_ms - t[5].median_ms;
    row["t_bands_ms"] = t[8].median_ms;
    row["bands_burst_over_bands"] = t[9].median_ms / t[8].median_ms;
    row["bands_paced_over_bands"] = t[10].median_ms / t[8].median_ms;
    set_if_read(row, "mhz_gemm", loop.sensors.sm_clock_mhz[0]);
    set_if_read(row, "mhz_gemm_batch", loop.sensors.sm_clock_mhz[4]);
    set_if_read(row, "mhz_gemm_copy", loop.sensors.sm_clock_mhz[2]);
    set_loop_sensors(row, loop.sensors);
  }
  finish_row(row, report, options, outcome, sets.c_count, num_sets);
  return row;
}

}  // namespace

void run_ag_copy_probe(const Options& options, Report& report) {
  std::vector<Shape> shapes = options.shapes;
  if (options.shapes_arg == "sweep") {
    std::string error;
    shapes = all_gather_sweep_shapes(options.tp, &error);
    if (shapes.empty()) throw CallFailed(error);
  }
  if (options.tp < 2) throw CallFailed("ag-copy-probe needs --tp >= 2 (the copies go to P - 1 peers)");
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(copy_probe_columns());
  report.add_note("GPU 0 only; shapes M, N/P, K. T_gemm = tpfuse::gemm on the gathered X (M x K); T_copy = rank "
                  "0's block (M/P x K) copied into P - 1 = " + std::to_string(options.tp - 1) +
                  " local slots by cudaMemcpyAsync, T_batch by one cudaMemcpyBatchAsync hinted to overlap compute; "
                  "T_gemm+copy, T_gemm+batch = the GEMM and the copies on a second stream; "
                  "serial/gemm = (T_gemm + T_copy) / T_gemm; T_hold = a kernel holding every SM for " +
                  std::to_string(kHoldNs / 1000) + " us, copy|hold and batch|hold = what the copies add to it "
                  "(about 0: they ran on a copy engine; about T_copy: after it)");
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/false));
  report.print_header();

  double log_sum = 0, worst = 0;
  int count = 0;
  OutcomeTally tally;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Row row = run_shape(gpus, options, shapes[i], i, report);
    note_sensor_failures(report, gpus.sensors());
    if (const double* ratio = number_in(row, "overlap_over_gemm")) {
      log_sum += std::log(*ratio);
      worst = std::max(worst, *ratio);
      ++count;
    }
    tally.add(row);
    report.add_row(row);
  }
  std::string line = "ag-copy-probe: both/gemm on " + std::to_string(count) + " of " + std::to_string(shapes.size()) +
                     " shapes";
  Row summary = {{"shapes", double(shapes.size())}, {"ran", double(count)}};
  if (count > 0) {
    char text[96];
    std::snprintf(text, sizeof(text), ": max %.3f, geomean %.3f", worst, std::exp(log_sum / count));
    line += text;
    summary["overlap_over_gemm_geomean"] = std::exp(log_sum / count);
    summary["overlap_over_gemm_max"] = worst;
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
