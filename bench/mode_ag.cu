// Mode ag: the fused all-gather + GEMM against the unfused path (ncclAllGather of X, then a cuBLAS
// GEMM of the gathered X), on the G GPUs one process drives: a local communicator of G ranks, rank g
// on GPU g (problem.world_size = G). Per shape, in one run and on the same rotated inputs: T_gemm
// (cuBLAS on the gathered m x k), T_comm (ncclAllGather alone), T_seq (both on one stream), T_fused
// (all_gather_gemm_local, slowest GPU), and docs/SPEC.md's
//   E = (T_gemm + T_comm - T_fused) / T_comm,   E_hideable = (T_gemm + T_comm - T_fused) / min(T_gemm, T_comm),
//   speedup = T_seq / T_fused.
// With --check, every GPU's Y (fused and unfused) against the FP32 reference of the gathered X, and
// docs/SPEC.md's rule: each fused error <= 1.1x the unfused path's. Shapes: M, n (N / G), K; the default
// sweep is the column-parallel layers' (cli.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "baselines.h"
#include "local_comm.h"
#include "modes.h"
#include "testing/gpu_check.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kX, kW };

constexpr double kTargetE = 0.9;

// The timed loops whose SM clock the driver reports (add_clock_columns, set_clock): T_gemm's and T_fused's.
const TimedCall kGemmCall{"gemm", "gemm", "gemm"};
const TimedCall kFusedCall{"fused", "fused", "fus"};

// One GPU's tensors, one of each per input set: its rows of X, its columns of W, the gathered X
// (the all-gather's output, the GEMM's input) and the two paths' Y.
struct RankSets {
  std::vector<DeviceBuffer> x, w, gathered, y_unfused, y_fused;
};

struct Counts {
  size_t x = 0, w = 0, gathered = 0, y = 0;
};

std::vector<Column> ag_columns(bool check) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
      {"t_comm_ms", "T_comm(ms)", 10, Format::kFixed, 4},
      {"t_seq_ms", "T_seq(ms)", 10, Format::kFixed, 4},
      {"t_fused_ms", "T_fused(ms)", 11, Format::kFixed, 4},
      {"E", "E", 6, Format::kFixed, 3},
      {"E_hideable", "E_hide", 6, Format::kFixed, 3},
      {"speedup", "speedup", 7, Format::kFixed, 3},
      {"host_fused_us", "H_fus(us)", 9, Format::kFixed, 1},
  });
  add_clock_columns(columns, {kGemmCall, kFusedCall});
  if (check) {
    add_error_columns(columns, "unfused", "unf");
    add_error_columns(columns, "fused", "fus");
  }
  add_outcome_columns(columns, check);
  return columns;
}

Problem gemm_of(const AllGatherProblem& p) { return Problem{p.m, p.n_per_rank, p.k, 1, p.weight_layout}; }

void all_gather_all(GpuSet& gpus, std::vector<RankSets>& ranks, const Counts& counts, int set) {
  TESTING_CHECK(ncclGroupStart());
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(ncclAllGather(ranks[g].x[set].get(), ranks[g].gathered[set].get(), counts.x, ncclBfloat16,
                                gpus[g].comm, gpus[g].stream));
  }
  TESTING_CHECK(ncclGroupEnd());
}

void gemm_all(GpuSet& gpus, std::vector<RankSets>& ranks, const AllGatherProblem& problem, int set) {
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    cublas_gemm(gpus[g].cublas, gemm_of(problem), ranks[g].gathered[set].get(), ranks[g].w[set].get(),
                ranks[g].y_unfused[set].get());
  }
}

void fused_all(const LocalCommunicator& comm, GpuSet& gpus, std::vector<RankSets>& ranks,
               const AllGatherProblem& problem, int set, const ConfigOverrides& overrides) {
  std::vector<const void*> x, w;
  std::vector<void*> y;
  std::vector<cudaStream_t> streams;
  for (int g = 0; g < gpus.size(); ++g) {
    x.push_back(ranks[g].x[set].get());
    w.push_back(ranks[g].w[set].get());
    y.push_back(ranks[g].y_fused[set].get());
    streams.push_back(gpus[g].stream);
  }
  check_op(
      all_gather_gemm_local(comm.get(), problem, x.data(), w.data(), nullptr, y.data(), nullptr, streams.data(), overrides));
}

// Both paths once on input set 0 into poisoned outputs, each GPU's Y against the FP32 reference of
// the gathered X (NCCL's gather of set 0, checked bit for bit against the fused op's own gather
// by the GPU tests).
void check_paths(const LocalCommunicator& comm, GpuSet& gpus, std::vector<RankSets>& ranks, const Counts& counts,
                 const AllGatherProblem& problem, const ConfigOverrides& overrides, ErrorSums* unfused,
                 ErrorSums* fused) {
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    poison_bf16(ranks[g].y_unfused[0].as<bf16>(), counts.y, gpus[g].stream);
    poison_bf16(ranks[g].y_fused[0].as<bf16>(), counts.y, gpus[g].stream);
  }
  all_gather_all(gpus, ranks, counts, 0);
  gemm_all(gpus, ranks, problem, 0);
  fused_all(comm, gpus, ranks, problem, 0, overrides);
  gpus.synchronize();
  comm.check_status();
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    DeviceBuffer ref(gpus[g].device, counts.y * sizeof(float));
    reference_gemm(gemm_of(problem), ranks[g].gathered[0].as<bf16>(), ranks[g].w[0].as<bf16>(), ref.as<float>(),
                   gpus[g].stream);
    unfused->merge(measure_error(ranks[g].y_unfused[0].as<bf16>(), ref.as<float>(), counts.y, gpus[g].stream));
    fused->merge(measure_error(ranks[g].y_fused[0].as<bf16>(), ref.as<float>(), counts.y, gpus[g].stream));
  }
}

Row run_shape(GpuSet& gpus, const Options& options, const Shape& shape, size_t shape_index, Report& report) {
  const int num_gpus = gpus.size();
  AllGatherProblem problem;
  problem.m = shape.m;
  problem.n_per_rank = shape.n;
  problem.k = shape.k_per_rank;
  problem.world_size = num_gpus;
  problem.weight_layout = options.weight_layout;
  Row row = shape_row(shape);
  if (problem.m % num_gpus != 0) {
    row["status"] = "skipped: M not divisible by " + std::to_string(num_gpus) + " GPUs";
    return row;
  }

  Outcome outcome;
  LocalCommunicator comm;
  bool fused_ok = attempt(
      [&] {
        std::vector<int> devices;
        for (Gpu& gpu : gpus) devices.push_back(gpu.device);
        comm.create(devices, problem);
      },
      &outcome.failure);

  Counts counts;
  counts.x = size_t(problem.rows_per_rank()) * size_t(problem.k);
  counts.w = size_t(problem.k) * size_t(problem.n_per_rank);
  counts.gathered = size_t(problem.m) * size_t(problem.k);
  counts.y = size_t(problem.m) * size_t(problem.n_per_rank);
  const size_t set_bytes = (counts.x + counts.w + counts.gathered + 2 * counts.y) * sizeof(bf16);
  const int num_sets = rotation_sets(set_bytes, gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));
  std::vector<RankSets> ranks(num_gpus);
  for (int g = 0; g < num_gpus; ++g) {
    ranks[g].x = random_bf16_sets(gpus[g], counts.x, num_sets, tensor_seed(*options.seed, shape_index, g, 0, kX));
    ranks[g].w = random_bf16_sets(gpus[g], counts.w, num_sets, tensor_seed(*options.seed, shape_index, g, 0, kW));
    ranks[g].gathered = poisoned_bf16_sets(gpus[g], counts.gathered, num_sets);
    ranks[g].y_unfused = poisoned_bf16_sets(gpus[g], counts.y, num_sets);
    ranks[g].y_fused = poisoned_bf16_sets(gpus[g], counts.y, num_sets);
  }
  gpus.synchronize();

  if (options.check && fused_ok) {
    ErrorSums unfused, fused;
    fused_ok = attempt([&] { check_paths(comm, gpus, ranks, counts, problem, options.overrides, &unfused, &fused); },
                       &outcome.failure);
    if (fused_ok) {
      set_errors(row, "unfused", unfused.stats());
      set_errors(row, "fused", fused.stats());
      const bool pass = within_tolerance(fused.stats(), unfused.stats());
      row["rule"] = std::string(pass ? "pass" : "FAIL");
      outcome.rule_failed = !pass;
      outcome.wrong = unfused.num_nonfinite + fused.num_nonfinite;
    }
  }

  const TimingOptions timing = timing_options(options);
  const LoopTiming gemm = time_loop(gpus, timing, {[&](int i) { gemm_all(gpus, ranks, problem, rotation_set(i, num_sets)); }});
  const LoopTiming comm_only =
      time_loop(gpus, timing, {[&](int i) { all_gather_all(gpus, ranks, counts, rotation_set(i, num_sets)); }});
  const LoopTiming seq = time_loop(gpus, timing, {[&](int i) {
    all_gather_all(gpus, ranks, counts, rotation_set(i, num_sets));
    gemm_all(gpus, ranks, problem, rotation_set(i, num_sets));
  }});
  const double t_gemm = gemm.launches[0].median_ms, t_comm = comm_only.launches[0].median_ms;
  row["t_gemm_ms"] = t_gemm;
  row["t_comm_ms"] = t_comm;
  row["t_seq_ms"] = seq.launches[0].median_ms;
  set_clock(row, kGemmCall, gemm.sensors, 0);
  if (fused_ok) {
    attempt(
        [&] {
          const LoopTiming fused = time_loop(gpus, timing, {[&](int i) {
            fused_all(comm, gpus, ranks, problem, rotation_set(i, num_sets), options.overrides);
          }});
          comm.check_status();
          const double t_fused = fused.launches[0].median_ms;
          const double hidden_ms = t_gemm + t_comm - t_fused;
          row["t_fused_ms"] = t_fused;
          row["host_fused_us"] = fused.launches[0].host_us;
          set_clock(row, kFusedCall, fused.sensors, 0);
          row["E"] = hidden_ms / t_comm;
          row["E_hideable"] = hidden_ms / std::min(t_gemm, t_comm);
          row["speedup"] = seq.launches[0].median_ms / t_fused;
        },
        &outcome.failure);
  }
  if (comm.get() != nullptr) attempt([&] { comm.destroy(); }, &outcome.failure);
  finish_row(row, report, options, outcome, counts.y * size_t(num_gpus), num_sets);
  return row;
}

}  // namespace

void run_ag(const Options& options, Report& report) {
  std::vector<Shape> shapes = options.shapes;
  if (options.shapes_arg == "sweep") {
    std::string error;
    shapes = all_gather_sweep_shapes(options.tp, &error);
    if (shapes.empty()) throw CallFailed(error);
  }
  GpuSet gpus(options.gpus, /*with_nccl=*/true);
  report.set_columns(ag_columns(options.check));
  report.add_note(std::to_string(gpus.size()) + " GPUs, one rank each; shapes M, N/P, K; times in ms: median of " +
                  std::to_string(options.iters) + " iterations after " + std::to_string(options.warmup) +
                  " warm-up, the slowest GPU's; T_gemm = cuBLAS on the gathered X, T_comm = ncclAllGather, "
                  "T_seq = both, T_fused = all_gather_gemm; overrides " + options.overrides.to_string());
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/true));
  if (options.check) {
    report.add_note("rule: each of the fused op's errors (max and L2, relative to the FP32 reference of the "
                    "gathered X) <= 1.1x the unfused path's (ncclAllGather + cuBLAS)");
  }
  report.print_header();
  double log_speedup_sum = 0, min_e = std::numeric_limits<double>::infinity(), min_hideable = min_e;
  int num_fused = 0, num_e_met = 0, num_compute_bound = 0, num_hideable_met = 0;
  OutcomeTally tally;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Row row = run_shape(gpus, options, shapes[i], i, report);
    note_sensor_failures(report, gpus.sensors());
    tally.add(row);
    report.add_row(row);
    const double* e = number_in(row, "E");
    if (e == nullptr) continue;
    ++num_fused;
    log_speedup_sum += std::log(*number_in(row, "speedup"));
    const double hideable = *number_in(row, "E_hideable");
    min_hideable = std::min(min_hideable, hideable);
    if (hideable >= kTargetE) ++num_hideable_met;
    if (*number_in(row, "t_comm_ms") <= *number_in(row, "t_gemm_ms")) {
      ++num_compute_bound;
      min_e = std::min(min_e, *e);
      if (*e >= kTargetE) ++num_e_met;
    }
  }
  char text[256];
  std::snprintf(text, sizeof(text),
                "ag: ran on %d of %zu shapes; E >= %.2f on %d of %d with T_comm <= T_gemm; E_hideable >= %.2f on %d "
                "of %d; speedup geomean %.3f",
                num_fused, shapes.size(), kTargetE, num_e_met, num_compute_bound, kTargetE, num_hideable_met,
                num_fused, num_fused > 0 ? std::exp(log_speedup_sum / num_fused) : 0.0);
  std::string line = text;
  Row summary = {{"shapes", double(shapes.size())}, {"fused_ran", double(num_fused)},
                 {"E_met", double(num_e_met)}, {"compute_bound", double(num_compute_bound)},
                 {"E_hideable_met", double(num_hideable_met)}};
  if (num_fused > 0) {
    summary["speedup_geomean"] = std::exp(log_speedup_sum / num_fused);
    if (num_compute_bound > 0) summary["E_min"] = min_e;
    summary["E_hideable_min"] = min_hideable;
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
