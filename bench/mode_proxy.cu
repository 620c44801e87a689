// Mode proxy: the solo-rank proxy of the fused op, on GPU 0. P ranks of a local communicator are
// emulated on GPU 0, rank 0's incoming partials are preset as delivered (random numbers in its
// receive buffer, flags raised for every call), and rank 0 runs alone on the full grid: it computes
// all of A_0 @ W_0, pushes the other owners' tiles into their receive buffers (on the same GPU) and
// adds the P-1 preset partials to its own rows. T_fused_solo against T_gemm (tpfuse::gemm: the same
// mainloop storing its tiles locally) is the cost of the push/reduce epilogue without NVLink; the
// target is fused/gemm <= 1.05. T_cublas is there for reference.
//
//   rank 0   segment-step 0 .. P-2: rows of owners 1 .. P-1 -> pushed to their receive buffers
//            segment-step P-1:      its own rows + the preset partials of ranks 1 .. P-1 -> out
//   ranks 1 .. P-1 never run
#include <algorithm>
#include <cmath>
#include <string>

#include "testing/gpu_check.h"
#include "gemm_sets.h"
#include "local_comm.h"
#include "modes.h"
#include "ops/gemm_rs/launch.h"
#include "testing/solo_rank.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kRecv = 2 };  // seeds: A and W are tensors 0 and 1 (gemm_sets.h)

constexpr double kTargetRatio = 1.05;
// Rank 0 sums in FP32 and rounds once to BF16: every element is within half a BF16 ulp (at most 2^-8
// of its value) of the FP32 reference. The check allows twice that on the largest element, and 2^-8
// on the L2 norm (the RMS of one rounding is well below it); a missing partial exceeds the L2 bound
// several times over.
constexpr double kMaxRelBound = 1.0 / 128;
constexpr double kNormRelBound = 1.0 / 256;

// Rank 0's operands and the plain GEMMs' outputs (sets.c_ours: tpfuse::gemm's), and its rows of the
// sum (m/P x n, poisoned), one per input set.
struct Buffers {
  GemmSets sets;
  std::vector<DeviceBuffer> out;
};

std::vector<Column> proxy_columns(bool check, bool compare, bool separate_loops) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_cublas_ms", "T_cublas(ms)", 12, Format::kFixed, 4},
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
      {"t_fused_solo_ms", "T_fused_solo(ms)", 16, Format::kFixed, 4},
      {"fused_over_gemm", "fused/gemm", 10, Format::kFixed, 3},
      {"tflops_cublas", "TF_cublas", 9, Format::kFixed, 1},
      {"tflops_gemm", "TF_gemm", 8, Format::kFixed, 1},
      {"tflops_fused_solo", "TF_solo", 8, Format::kFixed, 1},
  });
  if (compare) {
    columns.insert(columns.end(), {
        {"t_fused_solo_b_ms", "T_solo_b(ms)", 12, Format::kFixed, 4},
        {"fused_b_over_gemm", "b/gemm", 7, Format::kFixed, 3},
    });
  }
  columns.insert(columns.end(), {
      {"host_cublas_us", "H_cub(us)", 9, Format::kFixed, 1},
      {"host_gemm_us", "H_gemm(us)", 10, Format::kFixed, 1},
      {"host_fused_solo_us", "H_solo(us)", 10, Format::kFixed, 1},
      {"mhz_cublas", "MHz_cub", 7, Format::kInteger},
      {"mhz_gemm", "MHz_gemm", 8, Format::kInteger},
      {"mhz_fused_solo", "MHz_solo", 8, Format::kInteger},
      {"power_cublas_w", "W_cub", 5, Format::kInteger, 0, separate_loops},
      {"power_gemm_w", "W_gemm", 6, Format::kInteger, 0, separate_loops},
      {"power_fused_solo_w", "W_solo", 6, Format::kInteger, 0, separate_loops},
  });
  if (compare) {
    columns.insert(columns.end(), {
        {"host_fused_solo_b_us", "H_solo_b(us)", 12, Format::kFixed, 1, false},
        {"mhz_fused_solo_b", "MHz_solo_b", 10, Format::kInteger, 0, false},
        {"power_fused_solo_b_w", "W_solo_b", 8, Format::kInteger, 0, false},
    });
  }
  add_loop_sensor_columns(columns);
  if (check) add_error_columns(columns, "solo", "solo");
  add_outcome_columns(columns, check);
  return columns;
}

// Random non-zero partials in every rank's receive buffer, the same numbers in both parity halves
// (a call's parity depends on the device's epoch: rank 0 then reduces the same partials whichever it
// is), and rank 0's incoming flags raised for every future call.
void preset_partials(const LocalCommunicator& comm, Gpu& gpu, uint64_t run_seed, size_t shape_index) {
  Communicator* c = comm.get();
  const size_t parity_elems = c->parity.data_bytes / sizeof(bf16);
  for (int r = 0; r < c->world_size; ++r) {
    const uint64_t recv_seed = tensor_seed(run_seed, shape_index, r, 0, kRecv);
    for (int parity = 0; parity < 2; ++parity) {
      fill_random_bf16(static_cast<bf16*>(parity_data(*c, r, parity)), parity_elems, recv_seed, gpu.stream);
    }
  }
  check_op(preset_incoming_flags(c, 0));
  // NOTE: the communicator's own setup and the preset are not on gpu.stream: wait for all of it.
  TESTING_CHECK(cudaDeviceSynchronize());
}

// Rank 0 alone on input set `set`.
void run_solo(const LocalCommunicator& comm, const Problem& problem, Buffers& buffers, int set, cudaStream_t stream,
              const ConfigOverrides& overrides) {
  const void* a = buffers.sets.a[set].get();
  const void* w = buffers.sets.w[set].get();
  void* out = buffers.out[set].get();
  check_op(launch_gemm_rs(comm.get(), problem, {0}, &a, &w, &out, &stream, overrides));
}

// Runs rank 0 once on input set 0 into a poisoned output and measures it against the FP32
// reference: its own rows of A_0 @ W_0 plus the P-1 preset partials.
ErrorSums check_solo(Gpu& gpu, const LocalCommunicator& comm, const Problem& problem, Buffers& buffers,
                     const ConfigOverrides& overrides) {
  const size_t out_count = size_t(problem.rows_per_rank()) * size_t(problem.n);
  poison_bf16(buffers.out[0].as<bf16>(), out_count, gpu.stream);
  run_solo(comm, problem, buffers, 0, gpu.stream, overrides);
  TESTING_CHECK(cudaStreamSynchronize(gpu.stream));
  comm.check_status();

  // Rank 0 owns rows [0, m/P): the first rows of A_0.
  Problem own_rows = problem;
  own_rows.m = problem.rows_per_rank();
  DeviceBuffer ref(gpu.device, out_count * sizeof(float));
  reference_gemm(own_rows, buffers.sets.a[0].as<bf16>(), buffers.sets.w[0].as<bf16>(), ref.as<float>(), gpu.stream);
  // recv[parity 0][source][m/P][n]: the partials of sources 1 .. P-1 follow source 0's slot.
  const bf16* recv = static_cast<const bf16*>(parity_data(*comm.get(), 0, 0));
  for (int source = 1; source < problem.world_size; ++source) {
    add_bf16_to_ref(ref.as<float>(), recv + size_t(source) * out_count, out_count, gpu.stream);
  }
  return measure_error(buffers.out[0].as<bf16>(), ref.as<float>(), out_count, gpu.stream);
}

Row run_shape(GpuSet& gpus, const Options& options, size_t shape_index, Report& report) {
  Gpu& gpu = gpus[0];
  const Shape& shape = options.shapes[shape_index];
  const Problem problem = make_problem(shape, options);
  Row row = shape_row(shape);

  // The communicator first: its receive buffers (2 m n BF16 per rank) come out of the rotation's budget.
  Outcome outcome;
  LocalCommunicator comm;
  bool solo_ok = attempt(
      [&] {
        comm.create(std::vector<int>(problem.world_size, gpu.device), problem);
        preset_partials(comm, gpu, *options.seed, shape_index);
      },
      &outcome.failure);

  const size_t out_count = size_t(problem.rows_per_rank()) * size_t(problem.n);
  Buffers buffers;
  buffers.sets = make_gemm_sets(gpu, problem, out_count * sizeof(bf16), *options.seed, shape_index);
  const int num_sets = buffers.sets.num_sets;
  buffers.out = poisoned_bf16_sets(gpu, out_count, num_sets);
  gpus.synchronize();

  if (options.check && solo_ok) {
    ErrorSums solo;
    solo_ok = attempt([&] { solo = check_solo(gpu, comm, problem, buffers, options.overrides); }, &outcome.failure);
    if (solo_ok && options.compare) {
      // The compared variant computes the same rows, within the same bound.
      ErrorSums solo_b;
      solo_ok = attempt([&] { solo_b = check_solo(gpu, comm, problem, buffers, *options.compare); }, &outcome.failure);
      solo.merge(solo_b);
    }
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
  const LaunchFn cublas_call = [&](int i) { cublas_on_set(gpu, problem, buffers.sets, rotation_set(i, num_sets)); };
  const LaunchFn gemm_call = [&](int i) { ours_on_set(gpu, problem, buffers.sets, rotation_set(i, num_sets), options.overrides); };
  const LaunchFn solo_call = [&](int i) {
    run_solo(comm, problem, buffers, rotation_set(i, num_sets), gpu.stream, options.overrides);
  };
  // Timed together (time_loop); cuBLAS alone where one of ours fails.
  std::vector<LaunchFn> calls{cublas_call, gemm_call};
  if (solo_ok) calls.push_back(solo_call);
  if (solo_ok && options.compare) {
    calls.push_back([&](int i) { run_solo(comm, problem, buffers, rotation_set(i, num_sets), gpu.stream, *options.compare); });
  }
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
  row["tflops_cublas"] = tflops(flops, times[0].median_ms);
  row["host_cublas_us"] = times[0].host_us;
  set_if_read(row, "mhz_cublas", mhz[0]);
  set_if_read(row, "power_cublas_w", watts[0]);
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
      if (options.compare) {
        row["t_fused_solo_b_ms"] = times[3].median_ms;
        row["fused_b_over_gemm"] = times[3].median_ms / times[1].median_ms;
        row["host_fused_solo_b_us"] = times[3].host_us;
        set_if_read(row, "mhz_fused_solo_b", mhz[3]);
        set_if_read(row, "power_fused_solo_b_w", watts[3]);
      }
    }
  }
  set_loop_sensors(row, loop.sensors);
  if (comm.get() != nullptr) attempt([&] { comm.destroy(); }, &outcome.failure);
  finish_row(row, report, options, outcome, out_count, num_sets);
  return row;
}

}  // namespace

void run_proxy(const Options& options, Report& report) {
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(proxy_columns(options.check, options.compare.has_value(), options.separate_loops));
  report.add_note("GPU 0 only: rank 0 of P = " + std::to_string(options.tp) +
                  " emulated ranks runs alone on the full grid, its incoming partials preset; times in ms: median "
                  "of " + std::to_string(options.iters) + " iterations after " + std::to_string(options.warmup) +
                  " warm-up, the three calls " + call_order(options) + "; A and W rotate over the input sets, the receive buffers "
                  "do not");
  report.add_note("T_gemm = tpfuse::gemm, T_fused_solo = rank 0's fused call; target fused/gemm <= 1.05; overrides " +
                  options.overrides.to_string() +
                  (options.compare ? "; T_solo_b: rank 0's fused call with " + options.compare->to_string() : ""));
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/false));
  if (options.check) {
    report.add_note("rule: rank 0's rows against their FP32 reference (its rows of A_0 @ W_0 plus the preset "
                    "partials): max_rel <= 1/128 and L2 rel <= 1/256 (one BF16 rounding is at most 1/256)");
  }
  report.print_header();

  double max_ratio = 0, log_ratio_sum = 0, max_b = 0, log_b_sum = 0;
  int num_ratios = 0, num_meeting = 0;
  OutcomeTally tally;
  for (size_t i = 0; i < options.shapes.size(); ++i) {
    const Row row = run_shape(gpus, options, i, report);
    note_sensor_failures(report, gpus.sensors());
    if (const double* ratio = number_in(row, "fused_over_gemm")) {
      max_ratio = std::max(max_ratio, *ratio);
      log_ratio_sum += std::log(*ratio);
      ++num_ratios;
      if (*ratio <= kTargetRatio) ++num_meeting;
    }
    if (const double* b = number_in(row, "fused_b_over_gemm")) {
      max_b = std::max(max_b, *b);
      log_b_sum += std::log(*b);
    }
    tally.add(row);
    report.add_row(row);
  }

  const size_t num_shapes = options.shapes.size();
  std::string line = "proxy: fused/gemm on " + std::to_string(num_ratios) + " of " + std::to_string(num_shapes) +
                     " shapes";
  Row summary = {{"shapes", double(num_shapes)},
                 {"fused_ran", double(num_ratios)},
                 {"meet_target", double(num_meeting)}};
  if (num_ratios > 0) {
    const double geomean = std::exp(log_ratio_sum / num_ratios);
    char text[128];
    std::snprintf(text, sizeof(text), ": max %.3f, geomean %.3f; %d meet <= %.2f", max_ratio, geomean, num_meeting,
                  kTargetRatio);
    line += text;
    summary["fused_over_gemm_max"] = max_ratio;
    summary["fused_over_gemm_geomean"] = geomean;
    if (options.compare) {
      const double b = std::exp(log_b_sum / num_ratios);
      std::snprintf(text, sizeof(text), "; b/gemm max %.3f, geomean %.3f", max_b, b);
      line += text;
      summary["fused_b_over_gemm_max"] = max_b;
      summary["fused_b_over_gemm_geomean"] = b;
    }
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
