// A scalar CPU reference for GEMM + reduce-scatter on tiny shapes, docs/SPEC.md's error measures over
// host vectors, and the exact mode's inputs. Pure C++ (no CUDA headers): BF16 values are their raw bits in a uint16_t.
//
// Buffers are row-major and flat: A_r is m x k_per_rank; W_r is k_per_rank x n (kKxN) or
// n x k_per_rank (kNxK); a partial is m x n; rank d's output is rows_per_rank x n.
// Wrong buffer sizes throw std::invalid_argument: this is test support, not the library's API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testing/errors.h"
#include "tpfuse/problem.h"

namespace tpfuse::testing {

// ---- BF16 ----

// Rounds to the nearest BF16, ties to even; NaN stays a (quiet) NaN, overflow gives infinity.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t bits);
// True if x is exactly a BF16 value (8 significant bits, float's exponent range).
bool is_bf16_exact(double x);
std::vector<double> bf16_to_double(const std::vector<uint16_t>& bits);

// ---- Reference ----

// One rank's inputs, BF16 bits, laid out as the problem says.
struct RankInputs {
  std::vector<uint16_t> a;  // m x k_per_rank
  std::vector<uint16_t> w;  // k_per_rank x n (kKxN) or n x k_per_rank (kNxK)
};

// C_r = A_r @ W_r (m x n): the exact products of the BF16 inputs, summed in double.
std::vector<double> reference_partial(const Problem& problem, const std::vector<uint16_t>& a_bf16,
                                      const std::vector<uint16_t>& w_bf16);

// out_d = sum over r (in rank order, in double) of rows [d*m/P, (d+1)*m/P) of partials[r].
// Returns P outputs of rows_per_rank x n.
std::vector<std::vector<double>> reference_reduce_scatter(const Problem& problem,
                                                          const std::vector<std::vector<double>>& partials);

// What the unfused path (cuBLAS GEMM with BF16 output, then a BF16 sum reduce-scatter) computes,
// simplified: each partial rounded to BF16, summed in float in rank order, rounded to BF16 once.
// (NCCL's ring adds in a rotated order and may round at every hop; this is the lenient baseline.)
std::vector<std::vector<uint16_t>> unfused_reduce_scatter(const Problem& problem,
                                                          const std::vector<std::vector<double>>& partials);

// ---- Error measures (docs/SPEC.md, "Correctness") ----

// Over a whole output. If ref is all zero, a measure is 0 when out == ref and +inf otherwise.
ErrorStats error_stats(const std::vector<double>& out, const std::vector<double>& ref);
// Over all ranks' outputs together (out[d] against ref[d]).
ErrorStats error_stats(const std::vector<std::vector<double>>& out, const std::vector<std::vector<double>>& ref);
ErrorStats error_stats(const std::vector<std::vector<uint16_t>>& out_bf16,
                       const std::vector<std::vector<double>>& ref);

// ---- Exact mode ----

// Inputs whose every product, partial sum and total over the P ranks is an integer of magnitude at
// most 256, hence exact in BF16 (8 significant bits) and in any FP32 summation order: a and w in
// {-1, 0, 1}, and each row of A_r has at most 256 / P nonzeros (at random columns), so that
// |C_r[i][j]| <= 256 / P and |sum_r C_r[i][j]| <= 256. Deterministic for a given seed.
std::vector<RankInputs> make_exact_inputs(const Problem& problem, uint64_t seed);

// Random inputs for the tolerance checks: uniform in [-1, 1), rounded to BF16; no zeros.
std::vector<RankInputs> make_random_inputs(const Problem& problem, uint64_t seed);

struct Mismatch {
  bool found = false;
  int rank = -1;
  int64_t row = -1;  // row of that rank's output (rows_per_rank x n)
  int64_t col = -1;
  double got = 0;
  double expected = 0;
  std::string to_string() const;  // "rank 2, row 3, col 5: got 1, expected 2" or "no mismatch"
};

// The first element (rank, then row, then column) where the BF16 output differs from the reference.
// Values are compared, so +0 and -0 are equal; a NaN is always a mismatch.
Mismatch first_mismatch(const Problem& problem, const std::vector<std::vector<uint16_t>>& out_bf16,
                        const std::vector<std::vector<double>>& ref);

}  // namespace tpfuse::testing
