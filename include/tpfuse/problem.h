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

// Rank r holds A_r (m x k_per_rank, row-major) and W_r; it computes C_r = A_r @ W_r (m x n), and the
// partials are reduce-scattered over rows: rank d keeps rows [d*m/P, (d+1)*m/P) of sum_r C_r.
struct Problem {
  int64_t m = 0;           // tokens: rows of A_r and of every partial product
  int64_t n = 0;           // output features
  int64_t k_per_rank = 0;  // this rank's slice of the reduction dimension
  int world_size = 1;      // P, the tensor-parallel degree
  WeightLayout weight_layout = WeightLayout::kNxK;

  int64_t rows_per_rank() const { return m / world_size; }
  double flops_per_rank() const { return 2.0 * double(m) * double(n) * double(k_per_rank); }
  std::string to_string() const;
};

// Checks the shape: P in 1..8, m divisible by P (m/P need not be a multiple of 8 or of a tile), n and
// k_per_rank multiples of 8.
// The message names the bad argument and its value.
Status validate(const Problem& problem);

// Checks that a device pointer argument is non-null and 16-byte aligned. `name` goes into the message.
Status validate_operand(const void* ptr, const char* name);

}  // namespace tpfuse
