// Problem: the shape of one row-parallel linear layer on one rank. Pure C++.
#pragma once

#include <cstdint>
#include <string>

#include "tpfuse/status.h"

namespace tpfuse {

// The largest tensor-parallel degree (ranks of one NVLink node).
constexpr int kMaxWorldSize = 8;

// How the weight's K-slice is stored.
enum class WeightLayout {
  kKxN,  // K/P x N, row-major (N contiguous)
  kNxK,  // N x K/P, row-major: PyTorch's nn.Linear weight (K contiguous)
};

const char* to_string(WeightLayout layout);

// The element type of the GEMM's inputs (A and W; the all-gather's X too). Accumulation is FP32 and
// outputs are BF16 whatever the inputs. The compiled variants (src/gemm/variants.h) say which types
// run; another type is new rows of that table and a mainloop input, not another op.
enum class DType {
  kBF16,
  kE4M3,  // FP8 (e4m3): a K-major weight (kNxK) only, scaled (Scaling) and accumulated (Accumulation) as asked
};

const char* to_string(DType dtype);

// Bytes of one element of `dtype` (0 for a value that is not a DType).
constexpr int element_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 2;
    case DType::kE4M3: return 1;
  }
  return 0;
}

// How inputs of E4M3 are scaled back: each rank's product A_r @ W_r is multiplied in FP32 by
// a_scale * w_scale (InputScales; blockwise, each 128 of K's sums by their blocks') before anything
// else is done with it (the bias, the rounding to BF16, the reduction over ranks: the scales differ by
// rank). BF16 inputs take kNone. The all-gather's X_r is scaled likewise: rowwise and blockwise, its
// rows' scales are gathered with them; tensorwise, this rank's one scale serves every gathered row (as
// torch's fused_all_gather_scaled_matmul).
enum class Scaling {
  kNone,
  kTensorwise,  // one scale for A_r, one for W_r
  kRowwise,     // one for each row of A_r (m; the all-gather's X_r: m/P), one for each output column of W_r (n)
  // DeepSeek-V3's: one for each row of A_r and kScaleBlock of K (m x k_per_rank/kScaleBlock, row-major),
  // one for each kScaleBlock x kScaleBlock block of W_r (ceil(n/kScaleBlock) x k_per_rank/kScaleBlock,
  // row-major). Applied where each 128 of K is added into the FP32 accumulators, so kPromoted only, and
  // k_per_rank a multiple of kScaleBlock. The all-gather's X_r: (m/P) x k/kScaleBlock, gathered with
  // its rows.
  kBlockwise,
};

// The K extent of a blockwise scale, and the N extent of a weight's (Scaling::kBlockwise).
constexpr int64_t kScaleBlock = 128;

const char* to_string(Scaling scaling);

// How E4M3 products are accumulated; BF16 inputs ignore it.
enum class Accumulation {
  kPromoted,  // the tensor cores' partial sums over each 128 of K added into FP32 registers
  kFast,      // the tensor cores' own accumulation, which keeps fewer bits (torch's use_fast_accum)
};

const char* to_string(Accumulation accumulation);

// The scales of E4M3 inputs (Scaling): FP32 device pointers, a_scale for A_r (or the all-gather's X),
// w_scale for W_r. Null for BF16 inputs.
struct InputScales {
  const float* a = nullptr;
  const float* w = nullptr;
};

// The type of every output (C, Y, the reduce-scatter's out) and of the partials the reduce-scatter
// moves between ranks, whatever the inputs' dtype.
constexpr DType kOutputDType = DType::kBF16;

// The rows an op splits over the ranks may be `batch` sequences of s = m/batch rows each (row i*s + t
// is token t of sequence i, as a [batch, s, hidden] tensor flattened): then every rank holds its
// shard of each sequence, tokens [d*s/P, (d+1)*s/P) on rank d, sequence after sequence (sequence
// parallelism on dimension 1, as TorchTitan shards). batch = 1 is the plain split of the rows
// (dimension 0). Where batch > 1 and P > 1, a shard must be whole slabs: s/P a multiple of
// kSequenceShardRows (64), so that no slab of a tile straddles two sequences.
constexpr int64_t kSequenceShardRows = 64;

// Rank r holds A_r (m x k_per_rank, row-major) and W_r; it computes C_r = A_r @ W_r (m x n), and the
// partials are reduce-scattered over rows: rank d keeps rows [d*m/P, (d+1)*m/P) of sum_r C_r, or
// with batch > 1 its shard of every sequence (above), (batch * s/P) x n.
struct Problem {
  int64_t m = 0;           // tokens: rows of A_r and of every partial product
  int64_t n = 0;           // output features
  int64_t k_per_rank = 0;  // this rank's slice of the reduction dimension
  int world_size = 1;      // P, the tensor-parallel degree
  WeightLayout weight_layout = WeightLayout::kNxK;
  DType dtype = DType::kBF16;  // of A_r and W_r
  int64_t batch = 1;           // sequences the rows hold (above); 1: the rows are split as they are
  Scaling scaling = Scaling::kNone;                    // E4M3 inputs: kTensorwise, kRowwise or kBlockwise
  Accumulation accumulation = Accumulation::kPromoted;  // E4M3 inputs

  int64_t rows_per_rank() const { return m / world_size; }
  double flops_per_rank() const { return 2.0 * double(m) * double(n) * double(k_per_rank); }
  std::string to_string() const;
};

// Checks the shape: P in 1..8, m divisible by P (m/P need not be a multiple of 8 or of a tile), a dtype
// the compiled variants take, k_per_rank whole 16-byte units of it (multiples of 8 BF16, 16 E4M3) and n
// whole 16-byte units of the BF16 output (and, with a K x N weight, of the inputs' dtype); batch >= 1
// dividing m, each sequence splitting over the ranks, and (with batch > 1 and P > 1) shards of whole slabs
// (kUnsupported otherwise); E4M3 with a kNxK weight and a scaling (blockwise: promoted accumulation and
// k_per_rank a multiple of kScaleBlock), BF16 with none. The message names the bad argument and its value.
Status validate(const Problem& problem);

// The column-parallel layer's shape on one rank (all_gather_gemm, tpfuse/all_gather.h): rank r holds
// X_r (m/P x k, its rows of the activations) and W_r (its n_per_rank output columns) and computes
// Y_r = AllGather_rows(X) @ W_r, m x n_per_rank. With batch > 1, X_r holds this rank's shard of each
// sequence and the gathered rows are in sequence order: Y row i*s + r*s/P + j is X_r's row
// i*s/P + j times W_r.
struct AllGatherProblem {
  int64_t m = 0;           // tokens: rows of the gathered X and of Y
  int64_t n_per_rank = 0;  // this rank's output columns (N / P)
  int64_t k = 0;           // features of X (the whole reduction dimension)
  int world_size = 1;      // P
  WeightLayout weight_layout = WeightLayout::kNxK;  // W_r: k x n_per_rank (kKxN) or n_per_rank x k (kNxK)
  DType dtype = DType::kBF16;                       // of X_r and W_r
  int64_t batch = 1;                                // sequences the rows hold (as Problem's)
  Scaling scaling = Scaling::kNone;                    // as Problem's
  Accumulation accumulation = Accumulation::kPromoted;  // as Problem's

  int64_t rows_per_rank() const { return m / world_size; }
  double flops_per_rank() const { return 2.0 * double(m) * double(n_per_rank) * double(k); }
  std::string to_string() const;
};

// The same rules as Problem's, for a GEMM of m x n_per_rank x k split over P; the message names the
// bad field.
Status validate(const AllGatherProblem& problem);

// Checks that a device pointer argument is non-null and 16-byte aligned. `name` goes into the message.
Status validate_operand(const void* ptr, const char* name);

}  // namespace tpfuse
