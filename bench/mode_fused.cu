// Mode fused: tpfuse's fused GEMM + reduce-scatter against the unfused path, on G >= 2 GPUs driven by
// one process: a local communicator of G ranks, rank g on GPU g (problem.world_size = G; K per rank
// is K_total / --tp). Per shape, in one run and on the same rotated inputs: T_gemm, T_comm and T_seq
// as the baseline mode times them (T_comm: the faster of NCCL's ring and symmetric-window
// reduce-scatters), T_fused (gemm_reduce_scatter_local, slowest GPU), and docs/SPEC.md's
//   E = (T_gemm + T_comm - T_fused) / T_comm,   E_hideable = (T_gemm + T_comm - T_fused) / min(T_gemm, T_comm),
//   speedup = T_seq / T_fused.
// With --check, every GPU's fused rows and the unfused path's against the FP32 reference
// reduce-scatter, and docs/SPEC.md's rule: each fused error <= 1.1x the unfused path's.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "local_comm.h"
#include "modes.h"
#include "tpfuse/tpfuse.h"
#include "unfused.h"

namespace tpfuse::bench {

namespace {

constexpr double kTargetE = 0.9;

// The timed loops whose SM clock the driver reports (add_clock_columns, set_clock): T_gemm's and T_fused's.
const TimedCall kGemmCall{"gemm", "gemm", "gemm"};
const TimedCall kFusedCall{"fused", "fused", "fus"};

// The fused op's outputs, m/G x n, poisoned: [gpu][input set].
using FusedOutputs = std::vector<std::vector<DeviceBuffer>>;

std::vector<Column> fused_columns(bool check) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
  });
  const std::vector<Column> comm = comm_columns();
  columns.insert(columns.end(), comm.begin(), comm.end());
  columns.insert(columns.end(), {
      {"t_fused_ms", "T_fused(ms)", 11, Format::kFixed, 4},
      {"E", "E", 6, Format::kFixed, 3},
      {"E_hideable", "E_hide", 6, Format::kFixed, 3},
      {"speedup", "speedup", 7, Format::kFixed, 3},
      {"host_gemm_us", "H_gemm(us)", 10, Format::kFixed, 1},
      {"host_fused_us", "H_fus(us)", 9, Format::kFixed, 1},
  });
  add_clock_columns(columns, {kGemmCall, kFusedCall});
  add_loop_sensor_columns(columns, "gemm", "gemm");
  add_loop_sensor_columns(columns, "fused", "fus");
  if (check) {
    add_error_columns(columns, "unfused", "unf");
    add_error_columns(columns, "fused", "fus");
    add_symmetric_error_columns(columns);
  }
  columns.push_back({"note", "note", 0, Format::kText, 0, false});
  add_outcome_columns(columns, check);
  return columns;
}

// Every rank's fused op on input set `set`, each on its GPU's stream.
void fused_all(const LocalCommunicator& comm, GpuSet& gpus, const UnfusedBuffers& inputs, FusedOutputs& outs,
               const Problem& problem, int set, const ConfigOverrides& overrides) {
  std::vector<const void*> a, w;
  std::vector<void*> out;
  std::vector<cudaStream_t> streams;
  for (int g = 0; g < gpus.size(); ++g) {
    a.push_back(inputs.ranks[g].a[set].get());
    w.push_back(inputs.ranks[g].w[set].get());
    out.push_back(outs[g][set].get());
    streams.push_back(gpus[g].stream);
  }
  check_op(
      gemm_reduce_scatter_local(comm.get(), problem, a.data(), w.data(), nullptr, out.data(), streams.data(), overrides));
}

// Runs the fused op once on input set 0 into poisoned outputs and measures it against `refs`.
ErrorSums check_fused(const LocalCommunicator& comm, GpuSet& gpus, const UnfusedBuffers& inputs, FusedOutputs& outs,
                      const Problem& problem, const References& refs, const ConfigOverrides& overrides) {
  const size_t out_count = inputs.counts.out;
  std::vector<const bf16*> out_ptrs;
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    poison_bf16(outs[g][0].as<bf16>(), out_count, gpus[g].stream);
    out_ptrs.push_back(outs[g][0].as<bf16>());
  }
  fused_all(comm, gpus, inputs, outs, problem, 0, overrides);
  gpus.synchronize();
  comm.check_status();
  return measure_outputs(gpus, out_ptrs, refs, out_count);
}

Row run_shape(GpuSet& gpus, const Options& options, size_t shape_index, Report& report) {
  const Shape& shape = options.shapes[shape_index];
  const int num_gpus = gpus.size();
  Problem problem = make_problem(shape, options);
  problem.world_size = num_gpus;
  Row row = shape_row(shape);
  if (problem.m % num_gpus != 0) {
    row["status"] = "skipped: M not divisible by " + std::to_string(num_gpus) + " GPUs";
    return row;
  }

  // The communicator first: its receive buffers (2 m n BF16 per GPU) come out of the rotation's budget.
  Outcome outcome;
  LocalCommunicator comm;
  bool fused_ok = attempt(
      [&] {
        std::vector<int> devices;
        for (Gpu& gpu : gpus) devices.push_back(gpu.device);
        comm.create(devices, problem);
      },
      &outcome.failure);

  // An input set: the unfused path's buffers and the fused op's output rows.
  const RankCounts counts = rank_counts(problem, num_gpus, /*with_comm=*/true);
  const size_t set_bytes = counts.bf16_bytes() + counts.out * sizeof(bf16) + symmetric_bytes_per_set(counts);
  const int num_sets = rotation_sets(set_bytes, gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));
  UnfusedBuffers unfused = make_unfused_buffers(gpus, counts, num_sets, *options.seed, shape_index);
  const SymmetricBuffers symmetric(gpus, unfused);
  if (!symmetric.available()) row["note"] = "no symmetric window: " + symmetric.reason();
  FusedOutputs fused_out;
  for (Gpu& gpu : gpus) fused_out.push_back(poisoned_bf16_sets(gpu, counts.out, num_sets));
  gpus.synchronize();

  if (options.check) {
    const References refs = make_references(gpus, unfused, problem);
    const UnfusedErrors unfused_errors = check_unfused(gpus, unfused, problem, refs);
    const ErrorStats unfused_stats = unfused_errors.reduce_scatter.stats();
    set_errors(row, "unfused", unfused_stats);
    outcome.wrong = unfused_errors.gemm.num_nonfinite + unfused_errors.reduce_scatter.num_nonfinite;
    outcome.wrong += check_symmetric_into(row, gpus, unfused, symmetric, refs);
    ErrorSums fused_errors;
    if (fused_ok) {
      fused_ok = attempt([&] { fused_errors = check_fused(comm, gpus, unfused, fused_out, problem, refs, options.overrides); },
                         &outcome.failure);
    }
    if (fused_ok) {
      const ErrorStats fused_stats = fused_errors.stats();
      set_errors(row, "fused", fused_stats);
      const bool pass = within_tolerance(fused_stats, unfused_stats);
      row["rule"] = std::string(pass ? "pass" : "FAIL");
      outcome.rule_failed = !pass;
      outcome.wrong += fused_errors.num_nonfinite;
    }
  }

  const TimingOptions timing = timing_options(options);
  const UnfusedTimes times = time_unfused(gpus, unfused, problem, timing, &symmetric);
  row["t_gemm_ms"] = times.gemm;
  set_comm_times(row, times);
  row["host_gemm_us"] = times.gemm_host_us;
  set_clock(row, kGemmCall, times.gemm_sensors, 0);
  set_loop_sensors(row, times.gemm_sensors, "gemm");
  if (fused_ok) {
    attempt(
        [&] {
          const LoopTiming fused = time_loop(gpus, timing, {[&](int i) {
            fused_all(comm, gpus, unfused, fused_out, problem, rotation_set(i, num_sets), options.overrides);
          }});
          comm.check_status();
          const double t_fused = fused.launches[0].median_ms;
          const double hidden_ms = times.gemm + times.comm - t_fused;
          row["t_fused_ms"] = t_fused;
          row["host_fused_us"] = fused.launches[0].host_us;
          set_clock(row, kFusedCall, fused.sensors, 0);
          set_loop_sensors(row, fused.sensors, "fused");
          row["E"] = hidden_ms / times.comm;
          row["E_hideable"] = hidden_ms / std::min(times.gemm, times.comm);
          row["speedup"] = times.seq / t_fused;
        },
        &outcome.failure);
  }
  if (comm.get() != nullptr) attempt([&] { comm.destroy(); }, &outcome.failure);
  finish_row(row, report, options, outcome, counts.partial, num_sets);  // the output: every GPU's rows
  return row;
}

// The closing line: docs/SPEC.md's targets over the shapes the fused op ran on.
void summarize(const Options& options, Report& report, const std::vector<Row>& rows) {
  double min_e = std::numeric_limits<double>::infinity(), min_e_hideable = min_e;
  double log_speedup_sum = 0;
  int num_fused = 0, num_compute_bound = 0, num_e_met = 0, num_hideable_met = 0;
  OutcomeTally tally;
  for (const Row& row : rows) {
    tally.add(row);
    const double* e = number_in(row, "E");
    if (e == nullptr) continue;
    ++num_fused;
    const double e_hideable = *number_in(row, "E_hideable");
    min_e_hideable = std::min(min_e_hideable, e_hideable);
    if (e_hideable >= kTargetE) ++num_hideable_met;
    log_speedup_sum += std::log(*number_in(row, "speedup"));
    if (*number_in(row, "t_comm_ms") <= *number_in(row, "t_gemm_ms")) {
      ++num_compute_bound;
      min_e = std::min(min_e, *e);
      if (*e >= kTargetE) ++num_e_met;
    }
  }

  const size_t num_shapes = options.shapes.size();
  auto minimum = [](double value) {
    if (std::isinf(value)) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", value);
    return std::string(text);
  };
  char text[256];
  std::snprintf(text, sizeof(text),
                "fused: ran on %d of %zu shapes; E >= %.2f on %d of %d with T_comm <= T_gemm (min %s); "
                "E_hideable >= %.2f on %d of %d (min %s)",
                num_fused, num_shapes, kTargetE, num_e_met, num_compute_bound, minimum(min_e).c_str(), kTargetE,
                num_hideable_met, num_fused, minimum(min_e_hideable).c_str());
  std::string line = text;
  Row summary = {{"shapes", double(num_shapes)},
                 {"fused_ran", double(num_fused)},
                 {"compute_bound", double(num_compute_bound)},
                 {"E_met", double(num_e_met)},
                 {"E_hideable_met", double(num_hideable_met)}};
  // Minima of nothing stay out of the JSON (null), not infinity.
  if (num_compute_bound > 0) summary["E_min"] = min_e;
  if (num_fused > 0) {
    const double geomean = std::exp(log_speedup_sum / num_fused);
    std::snprintf(text, sizeof(text), "; speedup geomean %.3f", geomean);
    line += text;
    summary["E_hideable_min"] = min_e_hideable;
    summary["speedup_geomean"] = geomean;
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace

void run_fused(const Options& options, Report& report) {
  const int num_gpus = options.gpus;
  if (num_gpus < 2) {
    int visible = 0;
    TESTING_CHECK(cudaGetDeviceCount(&visible));
    const std::string count = visible == num_gpus ? std::to_string(visible) + " visible"
                                                  : std::to_string(num_gpus) + " in use, --gpus";
    report.add_note("fused mode needs 2 or more GPUs (" + count + "): use --mode proxy");
    return;
  }
  GpuSet gpus(num_gpus, /*with_nccl=*/true);
  report.set_columns(fused_columns(options.check));
  if (num_gpus != options.tp) {
    report.add_note("the fused op and the reduce-scatter run over the " + std::to_string(num_gpus) +
                    " GPUs (P = " + std::to_string(num_gpus) + "), while the GEMMs keep K/P of P = " +
                    std::to_string(options.tp));
  }
  report.add_note("times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) + " warm-up, slowest GPU; E = (T_gemm + T_comm - T_fused) / T_comm, "
                  "E_hideable = the same over min(T_gemm, T_comm), speedup = T_seq / T_fused");
  report.add_note(comm_note(options.check));
  report.add_note("*_gemm: T_gemm's loop (one call queues every GPU's cuBLAS GEMM), *_fus: T_fused's (one call of "
                  "the local fused op queues every GPU's rank); " +
                  timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/true));
  if (options.check) {
    report.add_note("rule: each of the fused op's errors (max and L2, relative to the FP32 reference "
                    "reduce-scatter) <= 1.1x the unfused path's (cuBLAS + NCCL)");
  }
  report.print_header();

  std::vector<Row> rows;
  for (size_t i = 0; i < options.shapes.size(); ++i) {
    rows.push_back(run_shape(gpus, options, i, report));
    note_sensor_failures(report, gpus.sensors());
    report.add_row(rows.back());
  }
  summarize(options, report, rows);
}

}  // namespace tpfuse::bench
