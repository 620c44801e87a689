#include "tpfuse/problem.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>

#include "gemm/variants.h"

namespace tpfuse {

namespace {

Status check_extent(const char* name, int64_t value) {
  if (value <= 0) {
    return Status::InvalidArgument("problem." + std::string(name) + " = " + std::to_string(value) +
                                   " must be positive");
  }
  if (value > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("problem." + std::string(name) + " = " + std::to_string(value) +
                                   " exceeds INT32_MAX (2147483647): the kernels use 32-bit indices");
  }
  return Status::Ok();
}

// Rows of `dtype` elements must be whole 16-byte units (TMA and vector loads).
Status check_row_bytes(const char* name, int64_t value, DType dtype) {
  const int64_t elements_per_16_bytes = 16 / element_bytes(dtype);
  if (value % elements_per_16_bytes != 0) {
    return Status::InvalidArgument("problem." + std::string(name) + " = " + std::to_string(value) +
                                   " is not a multiple of " + std::to_string(elements_per_16_bytes) + " (" +
                                   to_string(dtype) + " rows must be multiples of 16 bytes)");
  }
  return Status::Ok();
}

// A dtype the compiled variants take (gemm/variants.h).
Status check_dtype(DType dtype) {
  if (variants_take(dtype)) return Status::Ok();
  const std::string name = to_string(dtype);
  return Status::Unsupported("problem.dtype = " + (name == "unknown" ? std::to_string(int(dtype)) : name) +
                             " is not supported: no compiled GEMM variant takes it");
}

// E4M3 inputs come with their scaling and a K-major weight (FP8 WGMMA reads K-major operands only);
// BF16 ones with no scaling. Blockwise scales are applied at each 128-K promotion (kPromoted), one
// scale per 128 of K (k_per_rank a multiple of kScaleBlock).
Status check_scaling(DType dtype, WeightLayout layout, Scaling scaling, Accumulation accumulation,
                     int64_t k_per_rank) {
  if (scaling != Scaling::kNone && scaling != Scaling::kTensorwise && scaling != Scaling::kRowwise &&
      scaling != Scaling::kBlockwise) {
    return Status::InvalidArgument("problem.scaling = " + std::to_string(int(scaling)) +
                                   " is not a Scaling (kNone, kTensorwise, kRowwise or kBlockwise)");
  }
  if (accumulation != Accumulation::kPromoted && accumulation != Accumulation::kFast) {
    return Status::InvalidArgument("problem.accumulation = " + std::to_string(int(accumulation)) +
                                   " is not an Accumulation (kPromoted or kFast)");
  }
  if (dtype == DType::kBF16) {
    if (scaling == Scaling::kNone) return Status::Ok();
    return Status::InvalidArgument(std::string("problem.scaling = ") + to_string(scaling) +
                                   " with BF16 inputs: scales are for E4M3 inputs (BF16 takes kNone)");
  }
  if (scaling == Scaling::kNone) {
    return Status::InvalidArgument(std::string("problem.dtype = ") + to_string(dtype) +
                                   " needs a scaling (kTensorwise, kRowwise or kBlockwise), not kNone");
  }
  if (layout != WeightLayout::kNxK) {
    return Status::Unsupported(std::string("problem.weight_layout = ") + to_string(layout) + " with " +
                               to_string(dtype) + " inputs: FP8 takes an N x K weight (K contiguous) only");
  }
  if (scaling == Scaling::kBlockwise) {
    if (accumulation != Accumulation::kPromoted) {
      return Status::InvalidArgument("problem.accumulation = fast with blockwise scaling: its scales are applied "
                                     "where each 128 of K is promoted into FP32 (kPromoted only)");
    }
    if (k_per_rank % kScaleBlock != 0) {
      return Status::InvalidArgument("problem.k_per_rank = " + std::to_string(k_per_rank) +
                                     " is not a multiple of " + std::to_string(kScaleBlock) +
                                     " (blockwise scales cover 128 of K each)");
    }
  }
  return Status::Ok();
}

// The sequences the rows hold (tpfuse/problem.h): each divides over the ranks, and with several
// sequences a rank's shard of one is whole slabs.
Status check_batch(int64_t m, int world_size, int64_t batch) {
  if (batch < 1 || batch > m) {
    return Status::InvalidArgument("problem.batch = " + std::to_string(batch) + " must be in 1..m (" +
                                   std::to_string(m) + ")");
  }
  if (m % batch != 0) {
    return Status::InvalidArgument("problem.batch = " + std::to_string(batch) + " does not divide problem.m = " +
                                   std::to_string(m) + " into sequences of equal length");
  }
  const int64_t sequence = m / batch;
  if (sequence % world_size != 0) {
    return Status::InvalidArgument("a sequence of " + std::to_string(sequence) + " rows (problem.m / problem.batch) "
                                   "does not divide over world_size = " + std::to_string(world_size));
  }
  const int64_t shard = sequence / world_size;
  if (batch > 1 && world_size > 1 && shard % kSequenceShardRows != 0) {
    return Status::Unsupported("a rank's shard of each of the " + std::to_string(batch) + " sequences is " +
                               std::to_string(shard) + " rows; with batch > 1 the kernels need a multiple of " +
                               std::to_string(kSequenceShardRows) + " (whole slabs)");
  }
  return Status::Ok();
}

}  // namespace

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kE4M3: return "E4M3";
  }
  return "unknown";
}

const char* to_string(Scaling scaling) {
  switch (scaling) {
    case Scaling::kNone: return "none";
    case Scaling::kTensorwise: return "tensorwise";
    case Scaling::kRowwise: return "rowwise";
    case Scaling::kBlockwise: return "blockwise";
  }
  return "unknown";
}

const char* to_string(Accumulation accumulation) {
  switch (accumulation) {
    case Accumulation::kPromoted: return "promoted";
    case Accumulation::kFast: return "fast";
  }
  return "unknown";
}

const char* to_string(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kKxN: return "KxN";
    case WeightLayout::kNxK: return "NxK";
  }
  return "unknown";
}

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "m=" << m << " n=" << n << " k_per_rank=" << k_per_rank << " world_size=" << world_size
     << " weight_layout=" << tpfuse::to_string(weight_layout) << " dtype=" << tpfuse::to_string(dtype);
  if (batch != 1) os << " batch=" << batch;
  if (dtype != DType::kBF16) {
    os << " scaling=" << tpfuse::to_string(scaling) << " accumulation=" << tpfuse::to_string(accumulation);
  }
  return os.str();
}

Status validate(const Problem& problem) {
  if (problem.world_size < 1 || problem.world_size > kMaxWorldSize) {
    return Status::InvalidArgument("problem.world_size = " + std::to_string(problem.world_size) +
                                   " is out of range: tpfuse supports 1 to " + std::to_string(kMaxWorldSize) +
                                   " ranks");
  }
  TPFUSE_RETURN_IF_ERROR(check_extent("m", problem.m));
  TPFUSE_RETURN_IF_ERROR(check_extent("n", problem.n));
  TPFUSE_RETURN_IF_ERROR(check_extent("k_per_rank", problem.k_per_rank));
  // Any m that splits evenly over the ranks: a segment of m/P rows need not fill whole tiles.
  if (problem.m % problem.world_size != 0) {
    return Status::InvalidArgument("problem.m = " + std::to_string(problem.m) +
                                   " is not divisible by world_size = " + std::to_string(problem.world_size));
  }
  // The dtype first: it says how many elements make the 16 bytes a row must be whole units of.
  TPFUSE_RETURN_IF_ERROR(check_dtype(problem.dtype));
  // n counts the output's BF16 columns, and with a K x N weight its rows' inputs too.
  TPFUSE_RETURN_IF_ERROR(check_row_bytes(
      "n", problem.n, problem.weight_layout == WeightLayout::kKxN ? problem.dtype : kOutputDType));
  TPFUSE_RETURN_IF_ERROR(check_row_bytes("k_per_rank", problem.k_per_rank, problem.dtype));
  if (problem.weight_layout != WeightLayout::kKxN && problem.weight_layout != WeightLayout::kNxK) {
    return Status::InvalidArgument("problem.weight_layout = " + std::to_string(int(problem.weight_layout)) +
                                   " is not a WeightLayout (kKxN or kNxK)");
  }
  TPFUSE_RETURN_IF_ERROR(check_scaling(problem.dtype, problem.weight_layout, problem.scaling, problem.accumulation,
                                       problem.k_per_rank));
  return check_batch(problem.m, problem.world_size, problem.batch);
}

std::string AllGatherProblem::to_string() const {
  std::ostringstream os;
  os << "m=" << m << " n_per_rank=" << n_per_rank << " k=" << k << " world_size=" << world_size
     << " weight_layout=" << tpfuse::to_string(weight_layout) << " dtype=" << tpfuse::to_string(dtype);
  if (batch != 1) os << " batch=" << batch;
  if (dtype != DType::kBF16) {
    os << " scaling=" << tpfuse::to_string(scaling) << " accumulation=" << tpfuse::to_string(accumulation);
  }
  return os.str();
}

Status validate(const AllGatherProblem& problem) {
  // The same rules as the reduce-scatter's problem: a GEMM of m x n_per_rank x k, m split over P.
  Problem gemm;
  gemm.m = problem.m;
  gemm.n = problem.n_per_rank;
  gemm.k_per_rank = problem.k;
  gemm.world_size = problem.world_size;
  gemm.weight_layout = problem.weight_layout;
  gemm.dtype = problem.dtype;
  gemm.batch = problem.batch;
  gemm.scaling = problem.scaling;
  gemm.accumulation = problem.accumulation;
  const Status s = validate(gemm);
  if (s.ok()) return s;
  // Name the all-gather's fields.
  std::string message = s.message();
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"problem.n ", "problem.n_per_rank "},
                                 {"problem.k_per_rank ", "problem.k "}}) {
    const size_t at = message.find(from);
    if (at != std::string::npos) message.replace(at, from.size(), to);
  }
  return Status(s.code(), message);
}

Status validate_operand(const void* ptr, const char* name) {
  const std::string what = name != nullptr ? name : "pointer";
  if (ptr == nullptr) return Status::InvalidArgument(what + " must not be null");
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (address % 16 != 0) {
    std::ostringstream os;
    os << what << " = 0x" << std::hex << address << " is not 16-byte aligned";
    return Status::InvalidArgument(os.str());
  }
  return Status::Ok();
}

}  // namespace tpfuse
