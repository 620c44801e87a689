// Mode ag-proxy: the solo-rank proxy of the all-gather + GEMM, on GPU 0. P ranks of a local
// communicator are emulated on GPU 0; rank 0's gathered buffer holds random blocks of X from its
// peers and its flags are raised for every call, so rank 0 runs alone on the full grid: it
// multiplies its own block of X, pushes it into the peers' gathered buffers (on the same GPU), and
// multiplies the preset blocks. T_fused_solo against T_gemm (tpfuse::gemm on the whole gathered X,
// m x k: the same product with its operand already in place) is the cost of the op without NVLink;
// the target is fused/gemm <= 1.03. T_cublas is there for reference.
//
// Shapes: M, n (this rank's columns, N/P), K; the default sweep is the column-parallel layers'.
#include <algorithm>
#include <cmath>
#include <string>

#include "gemm_sets.h"
#include "local_comm.h"
#include "modes.h"
#include "ops/ag_gemm/launch.h"
#include "testing/gpu_check.h"
#include "testing/solo_rank.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kPeerBlocks = 2 };  // seeds: A and W are tensors 0 and 1 (gemm_sets.h)

constexpr double kTargetRatio = 1.03;
// One BF16 rounding of an FP32 sum, as the reduce-scatter's proxy (mode_proxy.cu) allows.
constexpr double kMaxRelBound = 1.0 / 128;
constexpr double kNormRelBound = 1.0 / 256;

std::vector<Column> ag_proxy_columns(bool check, bool separate_loops) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_cublas_ms", "T_cublas(ms)", 12, Format::kFixed, 4},
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
      {"t_fused_solo_ms", "T_fused_solo(ms)", 16, Format::kFixed, 4},
      {"fused_over_gemm", "fused/gemm", 10, Format::kFixed, 3},
      {"tflops_gemm", "TF_gemm", 8, Format::kFixed, 1},
      {"tflops_fused_solo", "TF_solo", 8, Format::kFixed, 1},
      {"host_gemm_us", "H_gemm(us)", 10, Format::kFixed, 1},
      {"host_fused_solo_us", "H_solo(us)", 10, Format::kFixed, 1},
      {"mhz_gemm", "MHz_gemm", 8, Format::kInteger},
      {"mhz_fused_solo", "MHz_solo", 8, Format::kInteger},
      {"power_gemm_w", "W_gemm", 6, Format::kInteger, 0, separate_loops},
      {"power_fused_solo_w", "W_solo", 6, Format::kInteger, 0, separate_loops},
  });
  add_loop_sensor_columns(columns);
  if (check) add_error_columns(columns, "solo", "solo");
  add_outcome_columns(columns, check);
  return columns;
}

AllGatherProblem all_gather_problem(const Shape& shape, const Options& options) {
  AllGatherProblem p;
  p.m = shape.m;
  p.n_per_rank = shape.n;
  p.k = shape.k_per_rank;
  p.world_size = options.tp;
  p.weight_layout = options.weight_layout;
  return p;
}

// The whole product as a plain GEMM: the gathered X (m x k) times W_0.
Problem gemm_of(const AllGatherProblem& p) { return Problem{p.m, p.n_per_rank, p.k, 1, p.weight_layout}; }

// Random blocks of X in rank 0's gathered buffer, the same in both parity halves (a call's parity
// depends on the device's epoch), and the peers' flags raised there for every future call.
void preset_blocks(const LocalCommunicator& comm, const AllGatherProblem& problem, Gpu& gpu, uint64_t run_seed,
                   size_t shape_index) {
  Communicator* c = comm.get();
  const size_t parity_elems = c->parity.data_bytes / sizeof(bf16);
  const uint64_t seed = tensor_seed(run_seed, shape_index, 0, 0, kPeerBlocks);
  for (int parity = 0; parity < 2; ++parity) {
    fill_random_bf16(static_cast<bf16*>(parity_data(*c, 0, parity)), parity_elems, seed, gpu.stream);
  }
  check_op(preset_peer_blocks(c, 0, problem));
  // NOTE: the communicator's own setup and the preset are not on gpu.stream: wait for all of it.
  TESTING_CHECK(cudaDeviceSynchronize());
}

// Rank 0 alone on input set `set`: its block of X is the first m/P rows of the set's A.
void run_solo(const LocalCommunicator& comm, const AllGatherProblem& problem, const GemmSets& sets,
              const std::vector<DeviceBuffer>& out, int set, cudaStream_t stream, const ConfigOverrides& overrides) {
  const void* x = sets.a[set].get();
  const void* w = sets.w[set].get();
  void* y = out[set].get();
  void* gathered = nullptr;
  check_op(launch_all_gather(comm.get(), problem, {0}, &x, &w, &y, &gathered, &stream, overrides));
}

// Rank 0 once on input set 0 into a poisoned Y, against the FP32 reference of the gathered X it
// multiplied: its own rows of A, then the preset blocks of sources 1 .. P-1.
ErrorSums check_solo(Gpu& gpu, const LocalCommunicator& comm, const AllGatherProblem& problem, const GemmSets& sets,
                     const std::vector<DeviceBuffer>& out, const ConfigOverrides& overrides) {
  const size_t y_count = size_t(problem.m) * size_t(problem.n_per_rank);
  poison_bf16(out[0].as<bf16>(), y_count, gpu.stream);
  run_solo(comm, problem, sets, out, 0, gpu.stream, overrides);
  TESTING_CHECK(cudaStreamSynchronize(gpu.stream));
  comm.check_status();

  const size_t block = size_t(problem.rows_per_rank()) * size_t(problem.k);
  DeviceBuffer gathered(gpu.device, size_t(problem.m) * size_t(problem.k) * sizeof(bf16));
  TESTING_CHECK(cudaMemcpyAsync(gathered.get(), sets.a[0].get(), block * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                gpu.stream));
  // gathered[parity 0][source][m/P][k]: the blocks of sources 1 .. P-1 follow source 0's slot.
  const bf16* preset = static_cast<const bf16*>(parity_data(*comm.get(), 0, 0));
  TESTING_CHECK(cudaMemcpyAsync(gathered.as<bf16>() + block, preset + block,
                                (size_t(problem.m) * size_t(problem.k) - block) * sizeof(bf16),
                                cudaMemcpyDeviceToDevice, gpu.stream));
  DeviceBuffer ref(gpu.device, y_count * sizeof(float));
  reference_gemm(gemm_of(problem), gathered.as<bf16>(), sets.w[0].as<bf16>(), ref.as<float>(), gpu.stream);
  return measure_error(out[0].as<bf16>(), ref.as<float>(), y_count, gpu.stream);
}

Row run_shape(GpuSet& gpus, const Options& options, const Shape& shape, size_t shape_index, Report& report) {
  Gpu& gpu = gpus[0];
  const AllGatherProblem problem = all_gather_problem(shape, options);
  const Problem gemm = gemm_of(problem);
  Row row = shape_row(shape);

  Outcome outcome;
  LocalCommunicator comm;
  bool solo_ok = attempt(
      [&] {
        comm.create(std::vector<int>(problem.world_size, gpu.device), problem);
        preset_blocks(comm, problem, gpu, *options.seed, shape_index);
      },
      &outcome.failure);

  // The GEMM's sets (A: the gathered m x k, W_0) and the solo call's outputs, rotated alike.
  const size_t y_count = size_t(problem.m) * size_t(problem.n_per_rank);
  GemmSets sets = make_gemm_sets(gpu, gemm, y_count * sizeof(bf16), *options.seed, shape_index);
  const int num_sets = sets.num_sets;
  std::vector<DeviceBuffer> out = poisoned_bf16_sets(gpu, y_count, num_sets);
  gpus.synchronize();

  if (options.check && solo_ok) {
    ErrorSums solo;
    solo_ok = attempt([&] { solo = check_solo(gpu, comm, problem, sets, out, options.overrides); }, &outcome.failure);
    if (solo_ok) {
      const ErrorStats stats = solo.stats();
      set_errors(row, "solo", stats);
      const bool pass = stats.max_rel <= kMaxRelBound && stats.norm_rel <= kNormRelBound;  // false for NaN
      row["rule"] = std::string(pass ? "pass" : "FAIL");
      outcome.rule_failed = !pass;
      outcome.wrong = solo.num_nonfinite;
    }
  }

  const TimingOptions timing = timing_options(options);
  const double flops = problem.flops_per_rank();
  const LaunchFn cublas_call = [&](int i) { cublas_on_set(gpu, gemm, sets, rotation_set(i, num_sets)); };
  const LaunchFn gemm_call = [&](int i) { ours_on_set(gpu, gemm, sets, rotation_set(i, num_sets), options.overrides); };
  const LaunchFn solo_call = [&](int i) {
    run_solo(comm, problem, sets, out, rotation_set(i, num_sets), gpu.stream, options.overrides);
  };
  std::vector<LaunchFn> calls{cublas_call, gemm_call};
  if (solo_ok) calls.push_back(solo_call);
  LoopTiming loop;
  const bool ours_ok = attempt(
      [&] {
        loop = time_loop(gpus, timing, calls);
        if (solo_ok) comm.check_status();
      },
      &outcome.failure);
  if (!ours_ok) loop = time_loop(gpus, timing, {cublas_call});
  const auto& times = loop.launches;
  const auto& mhz = loop.sensors.sm_clock_mhz;
  const auto& watts = loop.sensors.launch_power_w;
  row["t_cublas_ms"] = times[0].median_ms;
  if (ours_ok) {
    row["t_gemm_ms"] = times[1].median_ms;
    row["tflops_gemm"] = tflops(flops, times[1].median_ms);
    row["host_gemm_us"] = times[1].host_us;
    set_if_read(row, "mhz_gemm", mhz[1]);
    set_if_read(row, "power_gemm_w", watts[1]);
    if (solo_ok) {
      row["t_fused_solo_ms"] = times[2].median_ms;
      row["tflops_fused_solo"] = tflops(flops, times[2].median_ms);
      row["fused_over_gemm"] = times[2].median_ms / times[1].median_ms;
      row["host_fused_solo_us"] = times[2].host_us;
      set_if_read(row, "mhz_fused_solo", mhz[2]);
      set_if_read(row, "power_fused_solo_w", watts[2]);
    }
  }
  set_loop_sensors(row, loop.sensors);
  if (comm.get() != nullptr) attempt([&] { comm.destroy(); }, &outcome.failure);
  finish_row(row, report, options, outcome, y_count, num_sets);
  return row;
}

}  // namespace

void run_ag_proxy(const Options& options, Report& report) {
  std::vector<Shape> shapes = options.shapes;
  if (options.shapes_arg == "sweep") {
    std::string error;
    shapes = all_gather_sweep_shapes(options.tp, &error);
    if (shapes.empty()) throw CallFailed(error);
  }
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(ag_proxy_columns(options.check, options.separate_loops));
  report.add_note("GPU 0 only: rank 0 of P = " + std::to_string(options.tp) +
                  " emulated ranks runs alone on the full grid, its peers' blocks of X preset as arrived; shapes "
                  "M, N/P, K; times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) + " warm-up, the three calls " + call_order(options));
  report.add_note("T_gemm = tpfuse::gemm on the gathered X (M x K), T_fused_solo = rank 0's all_gather_gemm; "
                  "target fused/gemm <= 1.03; overrides " + options.overrides.to_string());
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/false));
  if (options.check) {
    report.add_note("rule: rank 0's Y against the FP32 reference of the gathered X it multiplied: max_rel <= "
                    "1/128 and L2 rel <= 1/256");
  }
  report.print_header();

  double max_ratio = 0, log_ratio_sum = 0;
  int num_ratios = 0, num_meeting = 0;
  OutcomeTally tally;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Row row = run_shape(gpus, options, shapes[i], i, report);
    note_sensor_failures(report, gpus.sensors());
    if (const double* ratio = number_in(row, "fused_over_gemm")) {
      max_ratio = std::max(max_ratio, *ratio);
      log_ratio_sum += std::log(*ratio);
      ++num_ratios;
      if (*ratio <= kTargetRatio) ++num_meeting;
    }
    tally.add(row);
    report.add_row(row);
  }
  std::string line = "ag-proxy: fused/gemm on " + std::to_string(num_ratios) + " of " + std::to_string(shapes.size()) +
                     " shapes";
  Row summary = {{"shapes", double(shapes.size())}, {"fused_ran", double(num_ratios)},
                 {"meet_target", double(num_meeting)}};
  if (num_ratios > 0) {
    const double geomean = std::exp(log_ratio_sum / num_ratios);
    char text[128];
    std::snprintf(text, sizeof(text), ": max %.3f, geomean %.3f; %d meet <= %.2f", max_ratio, geomean, num_meeting,
                  kTargetRatio);
    line += text;
    summary["fused_over_gemm_max"] = max_ratio;
    summary["fused_over_gemm_geomean"] = geomean;
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
