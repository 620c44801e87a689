// Mode fused: a fused op on the G GPUs one process drives, against its unfused path: a local
// communicator of G ranks, rank g on GPU g (problem.world_size = G). Per shape, in one run and on the
// same rotated inputs: the unfused path's T_gemm, T_comm and T_seq (both on one stream), T_fused (the
// op's local call, slowest GPU), and docs/SPEC.md's
//   E = (T_gemm + T_comm - T_fused) / T_comm,   E_hideable = (T_gemm + T_comm - T_fused) / min(T_gemm, T_comm),
//   speedup = T_seq / T_fused.
// With --check, every GPU's fused output and the unfused path's against an FP32 reference, and
// docs/SPEC.md's rule: each fused error <= 1.1x the unfused path's. The op (--op; --mode ag is --mode
// fused --op ag), as in mode proxy:
//   rs  the GEMM + reduce-scatter against cuBLAS then NCCL's reduce-scatter, as mode baseline times them
//       (T_comm: the faster of NCCL's ring and symmetric-window reduce-scatters); K per rank is
//       K_total / --tp; 2 or more GPUs
//   ag  the all-gather + GEMM against ncclAllGather of X then cuBLAS on the gathered X; shapes M, n
//       (N / G), K, the default sweep the column-parallel layers' (cli.h)
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "baselines.h"
#include "local_comm.h"
#include "modes.h"
#include "testing/gpu_check.h"
#include "tpfuse/tpfuse.h"
#include "unfused.h"

namespace tpfuse::bench {

namespace {

constexpr double kTargetE = 0.9;

// The timed loops whose SM clock the driver reports (add_clock_columns, set_clock): T_gemm's and T_fused's.
const TimedCall kGemmCall{"gemm", "gemm", "gemm"};
const TimedCall kFusedCall{"fused", "fused", "fus"};

// ---- The ops: one shape's buffers of both paths, their check and their calls ----

// Both ops' checks end here: the fused op's errors against the unfused path's, docs/SPEC.md's rule.
void judge(const ErrorSums& fused, const ErrorStats& unfused, Row& row, Outcome& outcome) {
  const ErrorStats stats = fused.stats();
  set_errors(row, "fused", stats);
  const bool pass = within_tolerance(stats, unfused);
  row["rule"] = std::string(pass ? "pass" : "FAIL");
  outcome.rule_failed = !pass;
  outcome.wrong += fused.num_nonfinite;
}


// The GEMM + reduce-scatter: the unfused path's buffers are mode baseline's (unfused.h), with NCCL's
// symmetric windows beside them; the fused op's outputs are each GPU's m/G x n rows.
class ReduceScatterOp {
 public:
  using OpProblem = Problem;
  static constexpr const char* kName = "fused";
  static constexpr int kMinGpus = 2;

  static OpProblem problem(const Shape& shape, const Options& options, int num_gpus) {
    Problem problem = make_problem(shape, options);
    problem.world_size = num_gpus;
    return problem;
  }
  // T_ring, T_sym, T_comm, T_seq and its path.
  static std::vector<Column> comm_columns() { return bench::comm_columns(); }
  static void add_check_columns(std::vector<Column>& columns) { add_symmetric_error_columns(columns); }
  static std::vector<std::string> notes(const Options& options, int num_gpus) {
    std::vector<std::string> notes;
    if (num_gpus != options.tp) {
      notes.push_back("the fused op and the reduce-scatter run over the " + std::to_string(num_gpus) + " GPUs (P = " +
                      std::to_string(num_gpus) + "), while the GEMMs keep K/P of P = " + std::to_string(options.tp));
    }
    notes.push_back(comm_note(options.check));
    return notes;
  }
  static constexpr const char* kRule = "rule: each of the fused op's errors (max and L2, relative to the FP32 "
                                       "reference reduce-scatter) <= 1.1x the unfused path's (cuBLAS + NCCL)";

  // The communicator first: its receive buffers (2 m n BF16 per GPU) come out of the rotation's budget.
  ReduceScatterOp(GpuSet& gpus, const Problem& problem, const Options& options, size_t shape_index, Row& row)
      : gpus_(gpus),
        problem_(problem),
        counts_(rank_counts(problem, gpus.size(), /*with_comm=*/true)),
        num_sets_(rotation_sets(counts_.bf16_bytes() + counts_.out * sizeof(bf16) + symmetric_bytes_per_set(counts_),
                                gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device))),
        unfused_(make_unfused_buffers(gpus, counts_, num_sets_, *options.seed, shape_index)),
        symmetric_(gpus, unfused_) {
    if (!symmetric_.available()) row["note"] = "no symmetric window: " + symmetric_.reason();
    for (Gpu& gpu : gpus) fused_out_.push_back(poisoned_bf16_sets(gpu, counts_.out, num_sets_));
  }

  int num_sets() const { return num_sets_; }
  // Every GPU's rows of the output.
  size_t output_count() const { return counts_.partial; }

  // The unfused path (both reduce-scatters) always, the fused op where `fused_ok`, against the FP32
  // reference; the rule into `row`. Returns whether the fused op still runs.
  bool check(const LocalCommunicator& comm, bool fused_ok, const ConfigOverrides& overrides, Row& row,
             Outcome& outcome) {
    const References refs = make_references(gpus_, unfused_, problem_);
    const UnfusedErrors unfused_errors = check_unfused(gpus_, unfused_, problem_, refs);
    const ErrorStats unfused_stats = unfused_errors.reduce_scatter.stats();
    set_errors(row, "unfused", unfused_stats);
    outcome.wrong = unfused_errors.gemm.num_nonfinite + unfused_errors.reduce_scatter.num_nonfinite;
    outcome.wrong += check_symmetric_into(row, gpus_, unfused_, symmetric_, refs);
    ErrorSums fused_errors;
    if (fused_ok) {
      fused_ok = attempt([&] { fused_errors = check_fused(comm, refs, overrides); }, &outcome.failure);
    }
    if (fused_ok) judge(fused_errors, unfused_stats, row, outcome);
    return fused_ok;
  }

  UnfusedTimes time_unfused(const TimingOptions& timing) {
    return bench::time_unfused(gpus_, unfused_, problem_, timing, &symmetric_);
  }
  static void set_comm_times(Row& row, const UnfusedTimes& times) { bench::set_comm_times(row, times); }

  // Every rank's fused op on input set `set`, each on its GPU's stream.
  void fused_all(const LocalCommunicator& comm, int set, const ConfigOverrides& overrides) {
    std::vector<const void*> a, w;
    std::vector<void*> out;
    std::vector<cudaStream_t> streams;
    for (int g = 0; g < gpus_.size(); ++g) {
      a.push_back(unfused_.ranks[g].a[set].get());
      w.push_back(unfused_.ranks[g].w[set].get());
      out.push_back(fused_out_[g][set].get());
      streams.push_back(gpus_[g].stream);
    }
    check_op(gemm_reduce_scatter_local(comm.get(), problem_, a.data(), w.data(), nullptr, out.data(), streams.data(),
                                       overrides));
  }

 private:
  // Runs the fused op once on input set 0 into poisoned outputs and measures it against `refs`.
  ErrorSums check_fused(const LocalCommunicator& comm, const References& refs, const ConfigOverrides& overrides) {
    std::vector<const bf16*> out_ptrs;
    for (int g = 0; g < gpus_.size(); ++g) {
      TESTING_CHECK(cudaSetDevice(gpus_[g].device));
      poison_bf16(fused_out_[g][0].as<bf16>(), counts_.out, gpus_[g].stream);
      out_ptrs.push_back(fused_out_[g][0].as<bf16>());
    }
    fused_all(comm, 0, overrides);
    gpus_.synchronize();
    comm.check_status();
    return measure_outputs(gpus_, out_ptrs, refs, counts_.out);
  }

  GpuSet& gpus_;
  Problem problem_;
  RankCounts counts_;
  int num_sets_;
  UnfusedBuffers unfused_;
  SymmetricBuffers symmetric_;
  std::vector<std::vector<DeviceBuffer>> fused_out_;  // [gpu][input set], m/G x n
};

// The all-gather + GEMM: per GPU its rows of X, its columns of W, the gathered X (the all-gather's
// output, the unfused GEMM's input) and both paths' Y, one of each per input set.
class AllGatherOp {
 public:
  using OpProblem = AllGatherProblem;
  static constexpr const char* kName = "ag";
  static constexpr int kMinGpus = 1;

  // The shape's n is this rank's columns, its k_per_rank all of K.
  static OpProblem problem(const Shape& shape, const Options& options, int num_gpus) {
    return AllGatherProblem{shape.m, shape.n, shape.k_per_rank, num_gpus, options.weight_layout};
  }
  static std::vector<Column> comm_columns() {
    return {{"t_comm_ms", "T_comm(ms)", 10, Format::kFixed, 4}, {"t_seq_ms", "T_seq(ms)", 10, Format::kFixed, 4}};
  }
  static void add_check_columns(std::vector<Column>&) {}
  static std::vector<std::string> notes(const Options&, int) {
    return {"shapes M, N/P, K; T_gemm = cuBLAS on the gathered X, T_comm = ncclAllGather, T_seq = both, T_fused = "
            "all_gather_gemm"};
  }
  static constexpr const char* kRule = "rule: each of the fused op's errors (max and L2, relative to the FP32 "
                                       "reference of the gathered X) <= 1.1x the unfused path's (ncclAllGather + "
                                       "cuBLAS)";

  AllGatherOp(GpuSet& gpus, const AllGatherProblem& problem, const Options& options, size_t shape_index, Row&)
      : gpus_(gpus), problem_(problem) {
    x_count_ = size_t(problem.rows_per_rank()) * size_t(problem.k);
    const size_t w_count = size_t(problem.k) * size_t(problem.n_per_rank);
    const size_t gathered_count = size_t(problem.m) * size_t(problem.k);
    y_count_ = size_t(problem.m) * size_t(problem.n_per_rank);
    const size_t set_bytes = (x_count_ + w_count + gathered_count + 2 * y_count_) * sizeof(bf16);
    num_sets_ = rotation_sets(set_bytes, gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));
    ranks_.resize(gpus.size());
    for (int g = 0; g < gpus.size(); ++g) {
      ranks_[g].x = random_bf16_sets(gpus[g], x_count_, num_sets_, tensor_seed(*options.seed, shape_index, g, 0, kX));
      ranks_[g].w = random_bf16_sets(gpus[g], w_count, num_sets_, tensor_seed(*options.seed, shape_index, g, 0, kW));
      ranks_[g].gathered = poisoned_bf16_sets(gpus[g], gathered_count, num_sets_);
      ranks_[g].y_unfused = poisoned_bf16_sets(gpus[g], y_count_, num_sets_);
      ranks_[g].y_fused = poisoned_bf16_sets(gpus[g], y_count_, num_sets_);
    }
  }

  int num_sets() const { return num_sets_; }
  // Every GPU's Y.
  size_t output_count() const { return y_count_ * size_t(gpus_.size()); }

  // Both paths once on input set 0 into poisoned outputs (where the fused op runs), each GPU's Y against
  // the FP32 reference of the gathered X (NCCL's gather of set 0, checked bit for bit against the fused
  // op's own gather by the GPU tests); the rule into `row`. Returns whether the fused op still runs.
  bool check(const LocalCommunicator& comm, bool fused_ok, const ConfigOverrides& overrides, Row& row,
             Outcome& outcome) {
    if (!fused_ok) return false;
    ErrorSums unfused, fused;
    if (!attempt([&] { check_paths(comm, overrides, &unfused, &fused); }, &outcome.failure)) return false;
    set_errors(row, "unfused", unfused.stats());
    outcome.wrong = unfused.num_nonfinite;
    judge(fused, unfused.stats(), row, outcome);
    return true;
  }

  UnfusedTimes time_unfused(const TimingOptions& timing) {
    UnfusedTimes times;
    const LoopTiming gemm = time_loop(gpus_, timing, {[&](int i) { gemm_all(rotation_set(i, num_sets_)); }});
    times.gemm = gemm.launches[0].median_ms;
    times.gemm_host_us = gemm.launches[0].host_us;
    times.gemm_sensors = gemm.sensors;
    times.comm = time_median_ms(gpus_, timing, [&](int i) { all_gather_all(rotation_set(i, num_sets_)); });
    times.seq = time_median_ms(gpus_, timing, [&](int i) {
      all_gather_all(rotation_set(i, num_sets_));
      gemm_all(rotation_set(i, num_sets_));
    });
    return times;
  }
  static void set_comm_times(Row& row, const UnfusedTimes& times) {
    row["t_comm_ms"] = times.comm;
    row["t_seq_ms"] = times.seq;
  }

  void fused_all(const LocalCommunicator& comm, int set, const ConfigOverrides& overrides) {
    std::vector<const void*> x, w;
    std::vector<void*> y;
    std::vector<cudaStream_t> streams;
    for (int g = 0; g < gpus_.size(); ++g) {
      x.push_back(ranks_[g].x[set].get());
      w.push_back(ranks_[g].w[set].get());
      y.push_back(ranks_[g].y_fused[set].get());
      streams.push_back(gpus_[g].stream);
    }
    check_op(all_gather_gemm_local(comm.get(), problem_, x.data(), w.data(), nullptr, y.data(), nullptr,
                                   streams.data(), overrides));
  }

 private:
  enum Tensor { kX, kW };

  struct RankSets {
    std::vector<DeviceBuffer> x, w, gathered, y_unfused, y_fused;
  };

  void all_gather_all(int set) {
    TESTING_CHECK(ncclGroupStart());
    for (int g = 0; g < gpus_.size(); ++g) {
      TESTING_CHECK(ncclAllGather(ranks_[g].x[set].get(), ranks_[g].gathered[set].get(), x_count_, ncclBfloat16,
                                  gpus_[g].comm, gpus_[g].stream));
    }
    TESTING_CHECK(ncclGroupEnd());
  }

  void gemm_all(int set) {
    for (int g = 0; g < gpus_.size(); ++g) {
      TESTING_CHECK(cudaSetDevice(gpus_[g].device));
      cublas_gemm(gpus_[g].cublas, gathered_gemm(problem_), ranks_[g].gathered[set].get(), ranks_[g].w[set].get(),
                  ranks_[g].y_unfused[set].get());
    }
  }

  void check_paths(const LocalCommunicator& comm, const ConfigOverrides& overrides, ErrorSums* unfused,
                   ErrorSums* fused) {
    for (int g = 0; g < gpus_.size(); ++g) {
      TESTING_CHECK(cudaSetDevice(gpus_[g].device));
      poison_bf16(ranks_[g].y_unfused[0].as<bf16>(), y_count_, gpus_[g].stream);
      poison_bf16(ranks_[g].y_fused[0].as<bf16>(), y_count_, gpus_[g].stream);
    }
    all_gather_all(0);
    gemm_all(0);
    fused_all(comm, 0, overrides);
    gpus_.synchronize();
    comm.check_status();
    for (int g = 0; g < gpus_.size(); ++g) {
      TESTING_CHECK(cudaSetDevice(gpus_[g].device));
      DeviceBuffer ref(gpus_[g].device, y_count_ * sizeof(float));
      reference_gemm(gathered_gemm(problem_), ranks_[g].gathered[0].as<bf16>(), ranks_[g].w[0].as<bf16>(),
                     ref.as<float>(), gpus_[g].stream);
      unfused->merge(measure_error(ranks_[g].y_unfused[0].as<bf16>(), ref.as<float>(), y_count_, gpus_[g].stream));
      fused->merge(measure_error(ranks_[g].y_fused[0].as<bf16>(), ref.as<float>(), y_count_, gpus_[g].stream));
    }
  }

  GpuSet& gpus_;
  AllGatherProblem problem_;
  size_t x_count_ = 0, y_count_ = 0;
  int num_sets_ = 1;
  std::vector<RankSets> ranks_;
};

// ---- The driver: the same for both ops ----

template <class Op>
std::vector<Column> fused_columns(bool check) {
  std::vector<Column> columns = shape_columns();
  columns.push_back({"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4});
  const std::vector<Column> comm = Op::comm_columns();
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
    Op::add_check_columns(columns);
  }
  columns.push_back({"note", "note", 0, Format::kText, 0, false});
  add_outcome_columns(columns, check);
  return columns;
}

template <class Op>
Row run_shape(GpuSet& gpus, const Options& options, const Shape& shape, size_t shape_index, Report& report) {
  const int num_gpus = gpus.size();
  const typename Op::OpProblem problem = Op::problem(shape, options, num_gpus);
  Row row = shape_row(shape);
  if (problem.m % num_gpus != 0) {
    row["status"] = "skipped: M not divisible by " + std::to_string(num_gpus) + " GPUs";
    return row;
  }

  // The communicator first: its buffers come out of the rotation's budget.
  Outcome outcome;
  LocalCommunicator comm;
  bool fused_ok = attempt(
      [&] {
        std::vector<int> devices;
        for (Gpu& gpu : gpus) devices.push_back(gpu.device);
        comm.create(devices, problem);
      },
      &outcome.failure);
  Op op(gpus, problem, options, shape_index, row);
  gpus.synchronize();
  if (options.check) fused_ok = op.check(comm, fused_ok, options.overrides, row, outcome);

  const TimingOptions timing = timing_options(options);
  const UnfusedTimes times = op.time_unfused(timing);
  row["t_gemm_ms"] = times.gemm;
  Op::set_comm_times(row, times);
  row["host_gemm_us"] = times.gemm_host_us;
  set_clock(row, kGemmCall, times.gemm_sensors, 0);
  set_loop_sensors(row, times.gemm_sensors, "gemm");
  if (fused_ok) {
    attempt(
        [&] {
          const int num_sets = op.num_sets();
          const LoopTiming fused = time_loop(gpus, timing, {[&](int i) {
            op.fused_all(comm, rotation_set(i, num_sets), options.overrides);
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
  finish_row(row, report, options, outcome, op.output_count(), op.num_sets());
  return row;
}

// The closing line: docs/SPEC.md's targets over the shapes the fused op ran on.
void summarize(const char* name, const Options& options, size_t num_shapes, const std::vector<Row>& rows,
               Report& report) {
  std::vector<Row> compute_bound;  // of the rows the fused op ran on, those with T_comm <= T_gemm
  for (const Row& row : rows) {
    if (number_in(row, "E") != nullptr && *number_in(row, "t_comm_ms") <= *number_in(row, "t_gemm_ms")) {
      compute_bound.push_back(row);
    }
  }
  const ColumnSpread e = column_spread(compute_bound, "E");
  const ColumnSpread e_hideable = column_spread(rows, "E_hideable");
  const ColumnSpread speedup = column_spread(rows, "speedup");
  const auto meeting = [](double value) { return value >= kTargetE; };
  const auto minimum = [](const ColumnSpread& spread) {
    if (spread.empty()) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f", spread.min());
    return std::string(text);
  };
  char text[256];
  std::snprintf(text, sizeof(text),
                "%s: ran on %d of %zu shapes; E >= %.2f on %d of %d with T_comm <= T_gemm (min %s); "
                "E_hideable >= %.2f on %d of %d (min %s)",
                name, e_hideable.count(), num_shapes, kTargetE, e.count_if(meeting), e.count(), minimum(e).c_str(),
                kTargetE, e_hideable.count_if(meeting), e_hideable.count(), minimum(e_hideable).c_str());
  std::string line = text;
  Row summary = {{"shapes", double(num_shapes)},
                 {"fused_ran", double(e_hideable.count())},
                 {"compute_bound", double(e.count())},
                 {"E_met", double(e.count_if(meeting))},
                 {"E_hideable_met", double(e_hideable.count_if(meeting))}};
  // Minima of nothing stay out of the JSON (null), not infinity.
  if (!e.empty()) summary["E_min"] = e.min();
  if (!e_hideable.empty()) summary["E_hideable_min"] = e_hideable.min();
  add_geomean(speedup, "speedup", "speedup", /*with_max=*/false, line, summary);
  OutcomeTally(rows).summarize(options, line, summary);
  report.set_summary(line, summary);
}

template <class Op>
void run_fused_of(const Options& options, Report& report) {
  const int num_gpus = options.gpus;
  if (num_gpus < Op::kMinGpus) {
    int visible = 0;
    TESTING_CHECK(cudaGetDeviceCount(&visible));
    const std::string count = visible == num_gpus ? std::to_string(visible) + " visible"
                                                  : std::to_string(num_gpus) + " in use, --gpus";
    report.add_note("fused mode needs " + std::to_string(Op::kMinGpus) + " or more GPUs (" + count +
                    "): use --mode proxy");
    return;
  }
  const std::vector<Shape> shapes = op_shapes(options);
  GpuSet gpus(num_gpus, /*with_nccl=*/true);
  report.set_columns(fused_columns<Op>(options.check));
  report.add_note("op " + std::string(op_flag(options.op)) + ", " + std::to_string(num_gpus) +
                  " GPUs, one rank each; times in ms: median of " + std::to_string(options.iters) +
                  " iterations after " + std::to_string(options.warmup) + " warm-up, slowest GPU; E = (T_gemm + T_comm "
                  "- T_fused) / T_comm, E_hideable = the same over min(T_gemm, T_comm), speedup = T_seq / T_fused; "
                  "overrides " + options.overrides.to_string());
  for (const std::string& note : Op::notes(options, num_gpus)) report.add_note(note);
  report.add_note("*_gemm: T_gemm's loop (one call queues every GPU's cuBLAS GEMM), *_fus: T_fused's (one call of "
                  "the local fused op queues every GPU's rank); " +
                  timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/true));
  if (options.check) report.add_note(Op::kRule);
  report.print_header();

  const std::vector<Row> rows = run_shapes(shapes.size(), gpus, report, [&](size_t i) {
    return run_shape<Op>(gpus, options, shapes[i], i, report);
  });
  summarize(Op::kName, options, shapes.size(), rows, report);
}

}  // namespace

void run_fused(const Options& options, Report& report) {
  if (options.op == FusedOp::kAllGather) {
    run_fused_of<AllGatherOp>(options, report);
  } else {
    run_fused_of<ReduceScatterOp>(options, report);
  }
}

}  // namespace tpfuse::bench
