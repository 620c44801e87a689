// The benchmark's modes, and what they share. A mode runs every shape of the options on
// options.gpus GPUs, adds one report row per shape as it finishes, and ends with a summary line;
// adding a mode is adding one such function and its name in main.cu's table.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "testing/device_buffer.h"
#include "gpus.h"
#include "testing/reference.h"
#include "report.h"
#include "timing.h"
#include "tpfuse/problem.h"

namespace tpfuse::bench {

using ModeFn = void (*)(const Options& options, Report& report);

// T_gemm (cuBLAS), T_comm (NCCL reduce-scatter), T_seq (both on one stream) on every GPU.
void run_baseline(const Options& options, Report& report);
// tpfuse::gemm against cuBLAS on the per-rank shapes, on GPU 0.
void run_gemm(const Options& options, Report& report);
// The solo-rank proxy of a fused op (options.op) on GPU 0: rank 0 of P emulated ranks alone, against
// tpfuse::gemm.
void run_proxy(const Options& options, Report& report);
// A fused op (options.op) on every GPU against its unfused path (cuBLAS + NCCL's reduce-scatter, or
// ncclAllGather + cuBLAS): T_fused, E, E_hideable, speedup.
void run_fused(const Options& options, Report& report);
// Write bandwidth from GPU 0 into GPU 1 and back: SM stores, TMA stores, copy engine (no shapes).
void run_p2p(const Options& options, Report& report);

// ---- Shared by the modes ----

// The shapes of a mode that runs options.op: the all-gather's sweep (cli.h) for the all-gather with
// --shapes left at 'sweep', else options.shapes.
std::vector<Shape> op_shapes(const Options& options);

// Runs `run_shape` on shapes 0 .. num_shapes - 1 in turn, adding each row to the report as it finishes
// (after a note for each sensor reading that failed meanwhile); returns the rows, for the summary.
std::vector<Row> run_shapes(size_t num_shapes, GpuSet& gpus, Report& report,
                            const std::function<Row(size_t shape_index)>& run_shape);

// A column's numbers over the rows of a sweep that have it: the summaries' figures.
class ColumnSpread {
 public:
  explicit ColumnSpread(std::vector<double> values) : values_(std::move(values)) {}
  bool empty() const { return values_.empty(); }
  int count() const { return int(values_.size()); }
  int count_if(const std::function<bool(double)>& test) const;
  double geomean() const;  // of a non-empty spread of positive numbers
  double min() const;
  double max() const;

 private:
  std::vector<double> values_;
};
ColumnSpread column_spread(const std::vector<Row>& rows, const std::string& key);
// A summary's geomean of `key` (and its maximum with `with_max`): appends "; <label> geomean G" (or
// "; <label> max M, geomean G") to `line`, and "<key>_geomean" (and "<key>_max") to `summary`; nothing
// where the spread is empty.
void add_geomean(const ColumnSpread& spread, const std::string& key, const std::string& label, bool with_max,
                 std::string& line, Row& summary);

// proj, M, N, K/P: the first columns of every mode.
std::vector<Column> shape_columns();
Row shape_row(const Shape& shape);

// docs/SPEC.md's two error measures of one path: columns "<key>_max_rel" and "<key>_norm_rel", headed
// "<label>_maxrel" and "<label>_l2rel"; set_errors fills them.
void add_error_columns(std::vector<Column>& columns, const std::string& key, const std::string& label);
void set_errors(Row& row, const std::string& key, const ErrorStats& stats);

// How the calls of one shape are timed, for the notes: interleaved (a compared pair alternating its
// order), or each in a loop of its own.
std::string call_order(const Options& options);

// A timed loop's sensors: the column "<loop>_power_w" (headed "W_<label>"; "power_w" and "W" for an
// empty `loop`), the mean power per GPU over the loop, in the table, and in JSON and CSV only
// "<loop>_power_read_w", "<loop>_energy_j" (all GPUs), "<loop>_loop_s", "<loop>_sensor_readings";
// set_loop_sensors fills them. A call's own columns: TimedCall below.
void add_loop_sensor_columns(std::vector<Column>& columns, const std::string& loop = "",
                             const std::string& label = "");
void set_loop_sensors(Row& row, const LoopSensors& sensors, const std::string& loop = "");
// A timed call of a mode. Its columns are the driver's (add_call_columns, set_call): "t_<key>_ms"
// (T_<label>(ms)), "tflops_<key>" (TF_<tag>), "host_<key>_us" (H_<tag>(us), the host's time to queue it),
// "mhz_<key>" (MHz_<tag>, the SM clock while it ran), "power_<key>_w" (W_<tag>, its own power: in the
// table with --separate-loops).
struct TimedCall {
  std::string key;
  std::string label;
  std::string tag;
  bool variant = false;  // a compared variant (--compare): only its time in the table
};

// The columns of `calls`, by measure: every call's time, then TFLOP/s, host time, clock, power.
void add_call_columns(std::vector<Column>& columns, const std::vector<TimedCall>& calls, bool separate_loops);
// Fills `call`'s columns from launch `index` of `loop`; `flops`: one call's.
void set_call(Row& row, const TimedCall& call, const LoopTiming& loop, size_t index, double flops);
// The clock columns alone, for a mode whose calls' other columns are its own; add_call_columns and
// set_call include them. set_clock fills `call`'s from launch `index` of a loop's `sensors`.
void add_clock_columns(std::vector<Column>& columns, const std::vector<TimedCall>& calls);
void set_clock(Row& row, const TimedCall& call, const LoopSensors& sensors, size_t index);
// A number, or nothing where the sensor gave none.
void set_if_read(Row& row, const std::string& key, const std::optional<double>& value);
// The note on how the host times, the SM clock and the power are measured, or why the sensors'
// columns stay empty. `multi_gpu`: the loops run on several GPUs.
std::string timing_columns_note(const Options& options, GpuSensors& sensors, bool multi_gpu);
// A note for each sensor reading that has failed since the last call (its column stays empty).
void note_sensor_failures(Report& report, GpuSensors& sensors);

// How a shape of a mode that calls tpfuse ended.
struct Outcome {
  std::string failure;       // the first failed tpfuse call (see attempt); empty: none
  uint64_t wrong = 0;        // output elements the check found not finite
  bool rule_failed = false;  // the check found an error outside its tolerance
};

// The last columns of a mode that calls tpfuse: the rule (pass/FAIL, the mode sets it; with --check),
// #wrong, the input sets (JSON and CSV only), the status.
void add_outcome_columns(std::vector<Column>& columns, bool check);
// Fills them but the rule, and counts a failed shape in `report`. Without --check a failed call's
// output was never measured: all `output_count` elements of it count as wrong.
void finish_row(Row& row, Report& report, const Options& options, const Outcome& outcome, size_t output_count,
                int num_sets);

// The outcome columns over the rows of a sweep, for the summary.
struct OutcomeTally {
  uint64_t wrong = 0;
  int rule_failures = 0;

  OutcomeTally() = default;
  explicit OutcomeTally(const std::vector<Row>& rows) {
    for (const Row& row : rows) add(row);
  }
  void add(const Row& row);
  // Appends "; rule failures N" (with --check) and "; #wrong N" to the line, and their numbers.
  void summarize(const Options& options, std::string& line, Row& summary) const;
};

// One rank's problem for this shape: world_size = --tp, the layout of --layout.
Problem make_problem(const Shape& shape, const Options& options);
// The all-gather + GEMM's whole product as a plain GEMM: the gathered X (m x k) times the rank's W.
Problem gathered_gemm(const AllGatherProblem& problem);
TimingOptions timing_options(const Options& options);
double tflops(double flops, double ms);

// A seed per tensor, so that every rank, input set and shape draws different numbers.
uint64_t tensor_seed(uint64_t run_seed, uint64_t shape_index, int gpu, int set, int tensor);

// Half of the device's free memory: what the rotated input sets may take, leaving room for the
// check's FP32 references.
size_t rotation_budget_bytes(int device);

// `num_sets` buffers of `count` elements of T on the GPU, each filled by
// fill(T* data, count, seed, stream) with a seed of its own drawn from `seed`.
template <class T, class Fill>
std::vector<DeviceBuffer> filled_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed, Fill&& fill) {
  std::vector<DeviceBuffer> sets;
  TESTING_CHECK(cudaSetDevice(gpu.device));
  for (int s = 0; s < num_sets; ++s) {
    sets.emplace_back(gpu.device, count * sizeof(T));
    fill(sets.back().as<T>(), count, tensor_seed(seed, 0, 0, s, 0), gpu.stream);
  }
  return sets;
}

// `num_sets` BF16 buffers of `count` elements on `device`, random (seeded per set from `seed`) or poisoned.
std::vector<DeviceBuffer> random_bf16_sets(Gpu& gpu, size_t count, int num_sets, uint64_t seed);
std::vector<DeviceBuffer> poisoned_bf16_sets(Gpu& gpu, size_t count, int num_sets);

// Runs `step`, a part of a shape that calls tpfuse: an OpFailed it throws goes into `failure` (the
// first of the shape is kept) instead of ending the sweep. Returns whether `step` succeeded.
bool attempt(const std::function<void()>& step, std::string* failure);

// The row's number under `key`, or null if it has none.
const double* number_in(const Row& row, const std::string& key);

}  // namespace tpfuse::bench
