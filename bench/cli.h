// The benchmark's command line: options, the shape list, and their parsing. Pure C++ (no CUDA), so
// the CPU tests can link it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse::bench {

// One row of a sweep: a per-rank GEMM shape and the projection it comes from.
struct Shape {
  std::string projection;  // e.g. "llama3-70b.o_proj"; "custom" when it matches none
  int64_t m = 0;
  int64_t n = 0;
  int64_t k_per_rank = 0;
};

// The op of modes proxy and fused (--op): the GEMM + reduce-scatter or the all-gather + GEMM.
enum class FusedOp { kReduceScatter, kAllGather };

struct Options {
  std::string mode = "baseline";
  // Modes proxy's and fused's; --mode ag-proxy is --mode proxy --op ag, --mode ag is --mode fused --op ag.
  FusedOp op = FusedOp::kReduceScatter;
  int warmup = 20;
  int iters = 200;
  bool check = false;
  std::string json_path;  // empty: no JSON
  std::string csv_path;   // empty: no CSV
  std::string shapes_arg = "sweep";  // as given, for the record
  std::vector<Shape> shapes;
  int tp = 8;  // P: K per rank = K_total / P
  WeightLayout weight_layout = WeightLayout::kKxN;
  // --fp8: E4M3 inputs (modes gemm and proxy, either op; N x K weights) scaled tensorwise or rowwise,
  // promoted or with --fast-accum, or blockwise, promoted; kNone: BF16 inputs.
  Scaling scaling = Scaling::kNone;
  Accumulation accumulation = Accumulation::kPromoted;
  int gpus = 0;  // 0: every visible GPU
  std::optional<uint64_t> seed;  // unset: the benchmark draws one
  bool gate = true;              // see TimingOptions::gate
  bool sensors = true;           // see TimingOptions::read_sensors
  bool separate_loops = false;   // see TimingOptions::separate_loops
  bool timeline = false;         // mode proxy: record one more call's pushes (bench/timeline.h)
  // The library's config overrides for our calls (--overrides), and a second set timed beside them
  // in the same process (--compare; modes gemm and proxy).
  ConfigOverrides overrides;
  std::optional<ConfigOverrides> compare;
};

enum class ParseOutcome { kRun, kHelp, kError };

struct ParseResult {
  ParseOutcome outcome = ParseOutcome::kRun;
  Options options;
  std::string error;  // for kError: what is wrong, naming the option
};

// Parses the arguments after the program name. `mode_names` are the accepted --mode values.
ParseResult parse_args(const std::vector<std::string>& args, const std::vector<std::string>& mode_names);

std::string usage(const std::vector<std::string>& mode_names);

// docs/SPEC.md's 16 shapes: M in {512, 2048, 8192, 32768} for each projection, K per rank = K_total / tp.
// Fails (empty, with `error` set) if tp does not divide some projection's K.
std::vector<Shape> sweep_shapes(int tp, std::string* error);

// The all-gather + GEMM's sweep, the column-parallel partners of the sweep's projections (qkv and
// gate_up of Llama-3-70B, qkv and w1/w3 of Mixtral-8x22B): M in {512, 2048, 8192, 32768}, each
// shape's n = N / tp (the rank's columns) and k_per_rank = K (all of it). Fails like sweep_shapes.
std::vector<Shape> all_gather_sweep_shapes(int tp, std::string* error);

// The projection with this N and K_total, or "custom".
std::string projection_name(int64_t n, int64_t k_total);

// "own_lag=0,partial_rounds=2" -> overrides (fields block_n, group_rows, own_lag, partial_rounds;
// "none" or "" for none); false with `error` set on a bad entry or value.
bool parse_overrides(const std::string& text, ConfigOverrides* overrides, std::string* error);

// "kn" or "nk", as on the command line.
const char* layout_flag(WeightLayout layout);
// "rs" or "ag", as on the command line.
const char* op_flag(FusedOp op);

}  // namespace tpfuse::bench
