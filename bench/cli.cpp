#include "cli.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "shapes_table.h"

namespace tpfuse::bench {

namespace {

struct Projection {
  const char* name;
  int64_t n;
  int64_t k_total;
};

// From python/tpfuse/shapes.json, the table the Python benchmark reads too (shapes_table.h is generated).
constexpr Projection kProjections[] = {TPFUSE_SHAPES_row_parallel};

// The column-parallel layers that pair with them: X all-gathered, N split over the ranks.
constexpr Projection kColumnProjections[] = {TPFUSE_SHAPES_column_parallel};

constexpr int64_t kSweepTokens[] = {TPFUSE_SHAPES_tokens};
constexpr int kMaxTp = 8;

// A decimal integer in [min, max], or nullopt.
std::optional<int64_t> parse_int(const std::string& text, int64_t min, int64_t max) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-')) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size() || value < min || value > max) return std::nullopt;
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

// "M,N,Kpr;M,N,Kpr" -> shapes; false with `error` set on a bad entry.
bool parse_shape_list(const std::string& text, int tp, std::vector<Shape>* shapes, std::string* error) {
  constexpr int64_t kMaxExtent = std::numeric_limits<int32_t>::max();
  for (const std::string& entry : split(text, ';')) {
    const std::vector<std::string> fields = split(entry, ',');
    if (fields.size() != 3) {
      *error = "--shapes: '" + entry + "' is not M,N,Kpr (three integers separated by commas)";
      return false;
    }
    int64_t values[3];
    for (int i = 0; i < 3; ++i) {
      const std::optional<int64_t> value = parse_int(fields[i], 1, kMaxExtent);
      if (!value) {
        *error = "--shapes: in '" + entry + "', '" + fields[i] + "' is not an integer in 1.." +
                 std::to_string(kMaxExtent);
        return false;
      }
      values[i] = *value;
    }
    shapes->push_back({projection_name(values[1], values[2] * tp), values[0], values[1], values[2]});
  }
  return true;
}

}  // namespace

bool parse_overrides(const std::string& text, ConfigOverrides* overrides, std::string* error) {
  ConfigOverrides o;
  if (text != "none" && !text.empty()) {
    for (const std::string& entry : split(text, ',')) {
      const size_t eq = entry.find('=');
      const std::string key = entry.substr(0, eq);
      int* field = key == "block_n" ? &o.block_n
                   : key == "group_rows" ? &o.group_rows
                   : key == "split_k" ? &o.split_k
                   : key == "swap_ab" ? &o.swap_ab
                   : key == "own_lag" ? &o.own_lag
                   : key == "partial_rounds" ? &o.partial_rounds
                   : key == "shared_tiles" ? &o.shared_tiles
                   : key == "idle_copiers" ? &o.idle_copiers
                   : key == "register_epilogue" ? &o.register_epilogue
                   : nullptr;
      if (eq == std::string::npos || field == nullptr) {
        *error = "'" + entry + "' is not FIELD=VALUE with FIELD one of block_n, group_rows, split_k, swap_ab, own_lag, partial_rounds, shared_tiles, idle_copiers, register_epilogue";
        return false;
      }
      const std::optional<int64_t> value = parse_int(entry.substr(eq + 1), -1, std::numeric_limits<int32_t>::max());
      if (!value) {
        *error = "in '" + entry + "', '" + entry.substr(eq + 1) + "' is not an integer";
        return false;
      }
      *field = int(*value);
    }
  }
  const Status valid = validate(o);
  if (!valid.ok()) {
    *error = valid.message();
    return false;
  }
  *overrides = o;
  return true;
}

std::string projection_name(int64_t n, int64_t k_total) {
  for (const Projection& p : kProjections) {
    if (p.n == n && p.k_total == k_total) return p.name;
  }
  return "custom";
}

const char* layout_flag(WeightLayout layout) { return layout == WeightLayout::kNxK ? "nk" : "kn"; }

const char* op_flag(FusedOp op) { return op == FusedOp::kAllGather ? "ag" : "rs"; }

std::vector<Shape> sweep_shapes(int tp, std::string* error) {
  std::vector<Shape> shapes;
  for (const Projection& p : kProjections) {
    if (p.k_total % tp != 0) {
      *error = "--tp " + std::to_string(tp) + ": K = " + std::to_string(p.k_total) + " of " + p.name +
               " is not divisible by it";
      return {};
    }
    for (int64_t m : kSweepTokens) shapes.push_back({p.name, m, p.n, p.k_total / tp});
  }
  return shapes;
}

std::vector<Shape> all_gather_sweep_shapes(int tp, std::string* error) {
  std::vector<Shape> shapes;
  for (const Projection& p : kColumnProjections) {
    if (p.n % tp != 0 || (p.n / tp) % 8 != 0) {
      *error = "--tp " + std::to_string(tp) + ": N = " + std::to_string(p.n) + " of " + p.name +
               " does not split into multiples of 8";
      return {};
    }
    for (int64_t m : kSweepTokens) shapes.push_back({p.name, m, p.n / tp, p.k_total});
  }
  return shapes;
}

std::string usage(const std::vector<std::string>& mode_names) {
  std::string modes;
  for (const std::string& name : mode_names) modes += (modes.empty() ? "" : "|") + name;
  return "Usage: tpfuse_bench [options]\n"
         "Times the row-parallel linear layer (per-rank GEMM, then reduce-scatter) over a shape sweep.\n"
         "\n"
         "  --mode " + modes + "\n"
         "                   baseline: cuBLAS GEMM, NCCL reduce-scatter and both in sequence, on every GPU\n"
         "                   gemm: tpfuse's GEMM against cuBLAS on the per-rank shapes, on GPU 0\n"
         "                   proxy: a fused op's rank 0 alone (P ranks emulated on GPU 0, its incoming data\n"
         "                   preset) against tpfuse's GEMM, on GPU 0; --op rs (default): the GEMM +\n"
         "                   reduce-scatter, its partials preset; --op ag: the all-gather + GEMM, its peers'\n"
         "                   blocks of X preset, on the column-parallel layers' sweep (M,N,K: M x N/P x K)\n"
         "                   fused: a fused op on every GPU against its unfused path: T_fused, E, E_hideable,\n"
         "                   speedup; --op rs (default): the GEMM + reduce-scatter against cuBLAS + NCCL's\n"
         "                   reduce-scatter (2 or more GPUs); --op ag: the all-gather + GEMM against\n"
         "                   ncclAllGather + cuBLAS (the column-parallel sweep, M,N,K: M x N/P x K)\n"
         "                   ag: fused --op ag\n"
         "                   ag-proxy: proxy --op ag\n"
         "                   p2p: write bandwidth from GPU 0 into GPU 1 and back by SM stores, TMA stores\n"
         "                   and the copy engine (needs 2 GPUs; ignores the shapes)\n"
         "                   (default: baseline)\n"
         "  --op rs|ag       modes proxy's and fused's op (default rs)\n"
         "  --warmup N       warm-up iterations per timing (default 20)\n"
         "  --iters N        timed iterations; the median is reported (default 200)\n"
         "  --check          check results against an FP32 reference on the GPU\n"
         "  --shapes S       'sweep' (docs/SPEC.md's 16 shapes, the default) or a list 'M,N,Kpr;M,N,Kpr'\n"
         "                   (Kpr: K per rank)\n"
         "  --tp P           tensor-parallel degree: K per rank = K_total / P in the sweep (default 8)\n"
         "  --layout kn|nk   weight layout: kn = K/P x N row-major (default), nk = N x K/P (nn.Linear)\n"
         "  --fp8 S          modes gemm and proxy (either op): E4M3 inputs scaled S = tensorwise, rowwise or\n"
         "                   blockwise (A's per row and 128 of K, W's per 128 x 128 block; promoted only, on\n"
         "                   shapes of M a multiple of 4 and Kpr of 128); needs --layout nk; against cuBLASLt's\n"
         "                   scaled FP8 GEMM with the same scales; promoted every 128 K\n"
         "  --fast-accum     with --fp8 tensorwise or rowwise: the tensor cores' own accumulation, ours and\n"
         "                   cuBLASLt's\n"
         "  --gpus N         use GPUs 0..N-1 (default: every visible GPU)\n"
         "  --seed N         seed of the random inputs (default: drawn at start, and printed)\n"
         "  --no-gate        align GPUs only by synchronizing (host launch time then counts in the times)\n"
         "  --no-sensors     do not read the SM clock and power while timing (to see that reading them does\n"
         "                   not change the times)\n"
         "  --separate-loops time each call in a loop of its own (its warm-up, then its iterations) instead of\n"
         "                   interleaving the calls, so that each runs at the clock its own power draw sets\n"
         "                   (then MHz_* split a ratio of times into cycles and clock: bench/clock_split.py)\n"
         "  --timeline       mode proxy: after the timed loop, record one more fused call's pushes (issue time,\n"
         "                   bytes, owner; %globaltimer) and report their timeline: the share of the pushed\n"
         "                   bytes issued by 25/50/75% of the call, and in JSON the inputs of bench/projection.py\n"
         "  --overrides O    the library's config overrides for our calls, e.g. 'own_lag=0,partial_rounds=2'\n"
         "                   (fields block_n, group_rows, split_k, swap_ab, own_lag, partial_rounds,\n"
         "                   shared_tiles, idle_copiers, register_epilogue; default none)\n"
         "  --compare O      modes gemm and proxy: also time our calls with overrides O, interleaved with\n"
         "                   the others, and report the ratio (a before/after in one process); the two\n"
         "                   compared calls trade places every 16 iterations, and each one's time is the\n"
         "                   geometric mean of its medians in the two places\n"
         "  --json FILE      write the results as JSON\n"
         "  --csv FILE       write the results as CSV\n"
         "  --help           print this help\n"
         "\n"
         "Modes gemm, proxy and fused also report, per call: H_*(us), the host's time to queue one call\n"
         "(no CUDA graph), median; MHz_*, the SM clock while that call ran (NVML, sampled), median; and per\n"
         "timed loop W, the mean power per GPU. Without NVML (or with --no-sensors) MHz and W stay empty\n"
         "and a note says why. GPU 0's max SM clock and power limit are in the metadata.\n"
         "\n"
         "Exit status: 0 all good, 1 a wrong result or a failed call, 2 bad arguments.\n";
}

ParseResult parse_args(const std::vector<std::string>& args, const std::vector<std::string>& mode_names) {
  ParseResult result;
  Options& options = result.options;
  auto fail = [&result](std::string message) {
    result.outcome = ParseOutcome::kError;
    result.error = std::move(message);
    return result;
  };

  std::optional<std::string> op;  // --op, resolved with --mode after the loop
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;  // --flag=value
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> std::optional<std::string> {
      if (inline_value) return inline_value;
      if (i + 1 < args.size()) return args[++i];
      return std::nullopt;
    };
    auto int_value = [&](int64_t min, int64_t max, int64_t* out) -> bool {
      const std::optional<std::string> text = value();
      if (!text) {
        result.error = flag + ": missing value";
        return false;
      }
      const std::optional<int64_t> number = parse_int(*text, min, max);
      if (!number) {
        result.error = flag + ": expected an integer in " + std::to_string(min) + ".." + std::to_string(max) +
                       ", got '" + *text + "'";
        return false;
      }
      *out = *number;
      return true;
    };
    auto no_value = [&]() {
      if (!inline_value) return true;
      result.error = flag + " takes no value";
      return false;
    };

    int64_t number = 0;
    if (flag == "--help" || flag == "-h") {
      result.outcome = ParseOutcome::kHelp;
      return result;
    } else if (flag == "--mode") {
      const std::optional<std::string> text = value();
      if (!text) return fail("--mode: missing value");
      if (std::find(mode_names.begin(), mode_names.end(), *text) == mode_names.end()) {
        std::string known;
        for (const std::string& name : mode_names) known += (known.empty() ? "" : ", ") + name;
        return fail("--mode: unknown mode '" + *text + "' (known: " + known + ")");
      }
      options.mode = *text;
    } else if (flag == "--op") {
      const std::optional<std::string> text = value();
      if (!text) return fail("--op: missing value (rs or ag)");
      if (*text != "rs" && *text != "ag") return fail("--op: expected rs or ag, got '" + *text + "'");
      op = *text;
    } else if (flag == "--warmup") {
      if (!int_value(0, 1000000, &number)) return fail(result.error);
      options.warmup = int(number);
    } else if (flag == "--iters") {
      if (!int_value(1, 1000000, &number)) return fail(result.error);
      options.iters = int(number);
    } else if (flag == "--check") {
      if (!no_value()) return fail(result.error);
      options.check = true;
    } else if (flag == "--no-gate") {
      if (!no_value()) return fail(result.error);
      options.gate = false;
    } else if (flag == "--no-sensors") {
      if (!no_value()) return fail(result.error);
      options.sensors = false;
    } else if (flag == "--separate-loops") {
      if (!no_value()) return fail(result.error);
      options.separate_loops = true;
    } else if (flag == "--timeline") {
      if (!no_value()) return fail(result.error);
      options.timeline = true;
    } else if (flag == "--json" || flag == "--csv") {
      const std::optional<std::string> text = value();
      if (!text || text->empty()) return fail(flag + ": missing file name");
      (flag == "--json" ? options.json_path : options.csv_path) = *text;
    } else if (flag == "--shapes") {
      const std::optional<std::string> text = value();
      if (!text || text->empty()) return fail("--shapes: missing value ('sweep' or 'M,N,Kpr;M,N,Kpr')");
      options.shapes_arg = *text;
    } else if (flag == "--tp") {
      if (!int_value(1, kMaxTp, &number)) return fail(result.error);
      options.tp = int(number);
    } else if (flag == "--layout") {
      const std::optional<std::string> text = value();
      if (!text) return fail("--layout: missing value (kn or nk)");
      if (*text == "kn") {
        options.weight_layout = WeightLayout::kKxN;
      } else if (*text == "nk") {
        options.weight_layout = WeightLayout::kNxK;
      } else {
        return fail("--layout: expected kn or nk, got '" + *text + "'");
      }
    } else if (flag == "--fp8") {
      const std::optional<std::string> text = value();
      if (text == std::string("tensorwise")) {
        options.scaling = Scaling::kTensorwise;
      } else if (text == std::string("rowwise")) {
        options.scaling = Scaling::kRowwise;
      } else if (text == std::string("blockwise")) {
        options.scaling = Scaling::kBlockwise;
      } else {
        return fail("--fp8: expected tensorwise, rowwise or blockwise, got '" + text.value_or("") + "'");
      }
    } else if (flag == "--fast-accum") {
      options.accumulation = Accumulation::kFast;
    } else if (flag == "--gpus") {
      if (!int_value(1, 1024, &number)) return fail(result.error);
      options.gpus = int(number);
    } else if (flag == "--overrides" || flag == "--compare") {
      const std::optional<std::string> text = value();
      if (!text) return fail(flag + ": missing value (e.g. own_lag=0)");
      ConfigOverrides parsed;
      std::string error;
      if (!parse_overrides(*text, &parsed, &error)) return fail(flag + ": " + error);
      if (flag == "--overrides") {
        options.overrides = parsed;
      } else {
        options.compare = parsed;
      }
    } else if (flag == "--seed") {
      // Seeds stay below 2^53 so that the JSON (a double) records them exactly.
      if (!int_value(0, (int64_t(1) << 53) - 1, &number)) return fail(result.error);
      options.seed = uint64_t(number);
    } else {
      return fail("unknown argument '" + args[i] + "'");
    }
  }

  // --mode ag-proxy is --mode proxy --op ag, --mode ag is --mode fused --op ag.
  if (options.mode == "ag-proxy" || options.mode == "ag") {
    if (op == "rs") {
      return fail("--op rs: --mode " + options.mode + " is the all-gather's (--mode " +
                  (options.mode == "ag" ? "fused" : "proxy") + " --op ag)");
    }
    op = "ag";
  } else if (op && options.mode != "proxy" && options.mode != "fused") {
    return fail("--op: only modes proxy and fused take it");
  }
  if (op == "ag") options.op = FusedOp::kAllGather;
  if (options.scaling != Scaling::kNone) {
    const bool served = options.mode == "gemm" || options.mode == "proxy" || options.mode == "ag-proxy";
    if (!served) return fail("--fp8: modes gemm and proxy only");
    if (options.weight_layout != WeightLayout::kNxK) return fail("--fp8: E4M3 weights are N x K (--layout nk)");
    if (options.scaling == Scaling::kBlockwise && options.accumulation == Accumulation::kFast) {
      return fail("--fast-accum: blockwise scales are promoted only");
    }
  } else if (options.accumulation == Accumulation::kFast) {
    return fail("--fast-accum: only with --fp8");
  }

  // The shapes depend on --tp, which may come after --shapes.
  std::string error;
  if (options.shapes_arg == "sweep") {
    options.shapes = sweep_shapes(options.tp, &error);
    if (options.shapes.empty()) return fail(error);
  } else if (!parse_shape_list(options.shapes_arg, options.tp, &options.shapes, &error)) {
    return fail(error);
  }
  // Blockwise scales cover 128 of K each, and cuBLASLt's need M a multiple of 4: on the shapes the op
  // runs (the all-gather's sweep is the column-parallel layers').
  if (options.scaling == Scaling::kBlockwise) {
    const bool column_sweep = options.op == FusedOp::kAllGather && options.shapes_arg == "sweep";
    for (const Shape& s : column_sweep ? all_gather_sweep_shapes(options.tp, &error) : options.shapes) {
      if (s.m % 4 != 0 || s.k_per_rank % kScaleBlock != 0) {
        return fail("--fp8 blockwise: shape " + std::to_string(s.m) + "," + std::to_string(s.n) + "," +
                    std::to_string(s.k_per_rank) + " needs M a multiple of 4 and K per rank one of 128");
      }
    }
  }
  return result;
}

}  // namespace tpfuse::bench
