#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>

#include "testing/gpu_check.h"
#include "modes.h"

namespace tpfuse::bench {

std::vector<Shape> op_shapes(const Options& options) {
  if (options.op != FusedOp::kAllGather || options.shapes_arg != "sweep") return options.shapes;
  std::string error;
  std::vector<Shape> shapes = all_gather_sweep_shapes(options.tp, &error);
  if (shapes.empty()) throw CallFailed(error);
  return shapes;
}

std::vector<Row> run_shapes(size_t num_shapes, GpuSet& gpus, Report& report,
                            const std::function<Row(size_t shape_index)>& run_shape) {
  std::vector<Row> rows;
  for (size_t i = 0; i < num_shapes; ++i) {
    rows.push_back(run_shape(i));
    note_sensor_failures(report, gpus.sensors());
    report.add_row(rows.back());
  }
  return rows;
}

int ColumnSpread::count_if(const std::function<bool(double)>& test) const {
  return int(std::count_if(values_.begin(), values_.end(), test));
}

double ColumnSpread::geomean() const {
  double log_sum = 0;
  for (const double value : values_) log_sum += std::log(value);
  return std::exp(log_sum / double(values_.size()));
}

double ColumnSpread::min() const { return *std::min_element(values_.begin(), values_.end()); }

double ColumnSpread::max() const { return *std::max_element(values_.begin(), values_.end()); }

ColumnSpread column_spread(const std::vector<Row>& rows, const std::string& key) {
  std::vector<double> values;
  for (const Row& row : rows) {
    if (const double* value = number_in(row, key)) values.push_back(*value);
  }
  return ColumnSpread(std::move(values));
}

void add_geomean(const ColumnSpread& spread, const std::string& key, const std::string& label, bool with_max,
                 std::string& line, Row& summary) {
  if (spread.empty()) return;
  char text[128];
  if (with_max) {
    std::snprintf(text, sizeof(text), "; %s max %.3f, geomean %.3f", label.c_str(), spread.max(), spread.geomean());
    summary[key + "_max"] = spread.max();
  } else {
    std::snprintf(text, sizeof(text), "; %s geomean %.3f", label.c_str(), spread.geomean());
  }
  line += text;
  summary[key + "_geomean"] = spread.geomean();
}

std::vector<Column> shape_columns() {
  return {
      {"proj", "proj", 23, Format::kText},
      {"m", "M", 6, Format::kInteger},
      {"n", "N", 6, Format::kInteger},
      {"k_per_rank", "K/P", 6, Format::kInteger},
  };
}

Row shape_row(const Shape& shape) {
  return {
      {"proj", shape.projection},
      {"m", double(shape.m)},
      {"n", double(shape.n)},
      {"k_per_rank", double(shape.k_per_rank)},
  };
}

void add_error_columns(std::vector<Column>& columns, const std::string& key, const std::string& label) {
  for (const auto& [measure, suffix] : {std::pair{"_max_rel", "_maxrel"}, std::pair{"_norm_rel", "_l2rel"}}) {
    const std::string header = label + suffix;
    columns.push_back({key + measure, header, std::max(10, int(header.size())), Format::kScientific, 2});
  }
}

void set_errors(Row& row, const std::string& key, const ErrorStats& stats) {
  row[key + "_max_rel"] = stats.max_rel;
  row[key + "_norm_rel"] = stats.norm_rel;
}

namespace {

std::string loop_key(const std::string& loop, const std::string& name) {
  return loop.empty() ? name : loop + "_" + name;
}

// A column of a timed call: as wide as its header, at least 5.
void add_call_column(std::vector<Column>& columns, const std::string& key, const std::string& header, Format format,
                     int precision, bool shown) {
  columns.push_back({key, header, std::max(5, int(header.size())), format, precision, shown});
}

}  // namespace

void add_loop_sensor_columns(std::vector<Column>& columns, const std::string& loop, const std::string& label) {
  const std::string suffix = label.empty() ? "" : "_" + label;
  columns.insert(columns.end(), {
      {loop_key(loop, "power_w"), "W" + suffix, std::max(4, int(1 + suffix.size())), Format::kInteger},
      {loop_key(loop, "power_read_w"), "W_read" + suffix, 6, Format::kFixed, 1, false},
      {loop_key(loop, "energy_j"), "J" + suffix, 8, Format::kFixed, 3, false},
      {loop_key(loop, "energy_steps"), "steps" + suffix, 5, Format::kInteger, 0, false},
      {loop_key(loop, "loop_s"), "loop_s" + suffix, 7, Format::kFixed, 3, false},
      {loop_key(loop, "sensor_readings"), "readings" + suffix, 8, Format::kInteger, 0, false},
  });
}

void add_call_columns(std::vector<Column>& columns, const std::vector<TimedCall>& calls, bool separate_loops) {
  for (const TimedCall& c : calls) {
    add_call_column(columns, "t_" + c.key + "_ms", "T_" + c.label + "(ms)", Format::kFixed, 4, true);
  }
  for (const TimedCall& c : calls) {
    add_call_column(columns, "tflops_" + c.key, "TF_" + c.tag, Format::kFixed, 1, !c.variant);
  }
  for (const TimedCall& c : calls) {
    add_call_column(columns, "host_" + c.key + "_us", "H_" + c.tag + "(us)", Format::kFixed, 1, !c.variant);
  }
  add_clock_columns(columns, calls);
  for (const TimedCall& c : calls) {
    add_call_column(columns, "power_" + c.key + "_w", "W_" + c.tag, Format::kInteger, 0, separate_loops && !c.variant);
  }
}

void add_clock_columns(std::vector<Column>& columns, const std::vector<TimedCall>& calls) {
  for (const TimedCall& c : calls) {
    add_call_column(columns, "mhz_" + c.key, "MHz_" + c.tag, Format::kInteger, 0, !c.variant);
  }
}

void set_call(Row& row, const TimedCall& call, const LoopTiming& loop, size_t index, double flops) {
  const LaunchTiming& launch = loop.launches.at(index);
  row["t_" + call.key + "_ms"] = launch.median_ms;
  row["tflops_" + call.key] = tflops(flops, launch.median_ms);
  row["host_" + call.key + "_us"] = launch.host_us;
  set_clock(row, call, loop.sensors, index);
  const LoopSensors& sensors = loop.sensors;
  if (index < sensors.launch_power_w.size()) set_if_read(row, "power_" + call.key + "_w", sensors.launch_power_w[index]);
}

void set_clock(Row& row, const TimedCall& call, const LoopSensors& sensors, size_t index) {
  if (index < sensors.sm_clock_mhz.size()) set_if_read(row, "mhz_" + call.key, sensors.sm_clock_mhz[index]);
}

void set_if_read(Row& row, const std::string& key, const std::optional<double>& value) {
  if (value) row[key] = *value;
}

void set_loop_sensors(Row& row, const LoopSensors& sensors, const std::string& loop) {
  set_if_read(row, loop_key(loop, "power_w"), sensors.power_w);
  set_if_read(row, loop_key(loop, "power_read_w"), sensors.power_read_w);
  set_if_read(row, loop_key(loop, "energy_j"), sensors.energy_j);
  row[loop_key(loop, "energy_steps")] = double(sensors.energy_steps);
  row[loop_key(loop, "loop_s")] = sensors.seconds;
  row[loop_key(loop, "sensor_readings")] = double(sensors.num_readings);
}

std::string call_order(const Options& options) {
  if (options.separate_loops) return "each in a loop of its own (--separate-loops)";
  if (options.compare) {
    return "interleaved, the two compared calls trading places every " + std::to_string(kAlternationPass) +
           " iterations (each one's time the geometric mean of its medians in the two places)";
  }
  return "interleaved";
}

std::string timing_columns_note(const Options& options, GpuSensors& sensors, bool multi_gpu) {
  std::string note = "H_*(us): the host's time to queue one call (no CUDA graph), median over the iterations; ";
  if (!options.sensors) return note + "MHz and W left empty: --no-sensors";
  if (!sensors.available()) return note + "MHz and W left empty: " + sensors.unavailable_reason();
  const auto text = [](double value) {
    std::ostringstream out;
    out << value;
    return out.str();
  };
  note += "MHz_*: NVML's SM clock, read every " + std::to_string(kSensorPeriod.count()) + " ms while " +
          (options.separate_loops ? "that call's loop" : "that call") + " ran, median";
  if (multi_gpu) note += " (the lowest of the GPUs' medians)";
  const std::string over_steps = "from the energy counter's increase between its first and last step inside them (none "
                                 "over fewer than " + std::to_string(kMinEnergySteps) + " steps)";
  note += "; W: mean power" + std::string(multi_gpu ? " per GPU" : "") +
          " over the timed loop (all its calls and the gaps between them), " + over_steps +
          ", or the mean of the power readings on a GPU without the counter; JSON and CSV also: the power readings' "
          "mean, the energy, the counter's steps, the loop's seconds and number of readings";
  if (options.separate_loops) {
    note += "; W_*: a call's own mean power over its timed iterations, " + over_steps + "; each call's loop is "
            "warmed up for at least " + text(kSettleSeconds) + " s and timed for at least " +
            text(kSeparateTimedSeconds) + " s";
  }
  return note;
}

void note_sensor_failures(Report& report, GpuSensors& sensors) {
  for (const std::string& failure : sensors.take_failures()) {
    report.add_note("sensor reading failed, its column stays empty from here: " + failure);
  }
}

void add_outcome_columns(std::vector<Column>& columns, bool check) {
  if (check) columns.push_back({"rule", "rule", 4, Format::kText});
  columns.insert(columns.end(), {
      {"wrong", "#wrong", 9, Format::kInteger},
      {"input_sets", "sets", 4, Format::kInteger, 0, false},
      {"status", "status", 0, Format::kText},
  });
}

void finish_row(Row& row, Report& report, const Options& options, const Outcome& outcome, size_t output_count,
                int num_sets) {
  const bool failed = !outcome.failure.empty();
  const uint64_t wrong = failed && !options.check ? uint64_t(output_count) : outcome.wrong;
  if (failed || wrong > 0 || outcome.rule_failed) report.count_failure();
  row["wrong"] = double(wrong);
  row["status"] = failed ? outcome.failure : std::string("ok");
  row["input_sets"] = double(num_sets);
}

void OutcomeTally::add(const Row& row) {
  if (const double* count = number_in(row, "wrong")) wrong += uint64_t(*count);
  if (const auto it = row.find("rule"); it != row.end() && std::get<std::string>(it->second) != "pass") {
    ++rule_failures;
  }
}

void OutcomeTally::summarize(const Options& options, std::string& line, Row& summary) const {
  if (options.check) {
    line += "; rule failures " + std::to_string(rule_failures);
    summary["rule_failures"] = double(rule_failures);
  }
  line += "; #wrong " + std::to_string(wrong);
  summary["wrong"] = double(wrong);
}

Problem make_problem(const Shape& shape, const Options& options) {
  Problem problem{shape.m, shape.n, shape.k_per_rank, options.tp, options.weight_layout};
  if (options.scaling != Scaling::kNone) {
    problem.dtype = DType::kE4M3;
    problem.scaling = options.scaling;
    problem.accumulation = options.accumulation;
  }
  return problem;
}

Problem gathered_gemm(const AllGatherProblem& problem) {
  return Problem{problem.m, problem.n_per_rank, problem.k, 1, problem.weight_layout};
}

TimingOptions timing_options(const Options& options) {
  TimingOptions timing;
  timing.warmup = options.warmup;
  timing.iters = options.iters;
  timing.gate = options.gate;
  timing.separate_loops = options.separate_loops;
  timing.read_sensors = options.sensors;
  return timing;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

uint64_t tensor_seed(uint64_t run_seed, uint64_t shape_index, int gpu, int set, int tensor) {
  uint64_t seed = run_seed;
  for (const uint64_t part : {shape_index, uint64_t(gpu), uint64_t(set), uint64_t(tensor)}) {
    seed = (seed ^ part) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;  // FNV-style mixing
  }
  return seed;
}

size_t rotation_budget_bytes(int device) {
  size_t free_bytes = 0, total_bytes = 0;
  TESTING_CHECK(cudaSetDevice(device));
  TESTING_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes / 2;
}

std::vector<DeviceBuffer> random_bf16_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed) {
  std::vector<DeviceBuffer> sets;
  TESTING_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(bf16));
    fill_random_bf16(sets.back().as<bf16>(), count, tensor_seed(seed, 0, 0, s, 0), gpu.stream);
  }
  return sets;
}

std::vector<DeviceBuffer> poisoned_bf16_sets(Gpu& gpu, size_t count, int num_sets) {
  std::vector<DeviceBuffer> sets;
  TESTING_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(bf16));
    poison_bf16(sets.back().as<bf16>(), count, gpu.stream);
  }
  return sets;
}

bool attempt(const std::function<void()>& step, std::string* failure) {
  try {
    step();
    return true;
  } catch (const OpFailed& e) {
    if (failure->empty()) *failure = e.what();
    return false;
  }
}

const double* number_in(const Row& row, const std::string& key) {
  const auto it = row.find(key);
  return it == row.end() ? nullptr : std::get_if<double>(&it->second);
}

}  // namespace tpfuse::bench
