// The CPU reference: BF16 rounding, GEMM in both weight layouts, reduce-scatter, docs/SPEC.md's error
// measures and the 1.1x rule, and the exact mode.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "testing/reference.h"

namespace tpfuse::testing {
namespace {

std::vector<uint16_t> bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(float_to_bf16(v));
  return out;
}

// W (k x n, row-major) transposed to n x k.
std::vector<uint16_t> transpose(const std::vector<uint16_t>& w, int64_t k, int64_t n) {
  std::vector<uint16_t> t(w.size());
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) t[size_t(j * k + i)] = w[size_t(i * n + j)];
  return t;
}

std::vector<std::vector<double>> partials_of(const Problem& p, const std::vector<RankInputs>& inputs) {
  std::vector<std::vector<double>> partials;
  for (const RankInputs& in : inputs) partials.push_back(reference_partial(p, in.a, in.w));
  return partials;
}

TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);      // tie, to even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3F82);  // tie, to even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC040), -3.0f);
  EXPECT_TRUE(is_bf16_exact(256));
  EXPECT_TRUE(is_bf16_exact(-255));
  EXPECT_FALSE(is_bf16_exact(257));  // 9 significant bits
  EXPECT_TRUE(is_bf16_exact(258));
  EXPECT_FALSE(is_bf16_exact(0.1));
  for (int v = -256; v <= 256; ++v) EXPECT_EQ(bf16_to_float(float_to_bf16(float(v))), float(v)) << v;
}

TEST(Reference, HandComputedPartial) {
  // A = [1 2; 3 4], W = [5 6; 7 8]: A @ W = [19 22; 43 50].
  const Problem kxn{2, 2, 2, 1, WeightLayout::kKxN};
  const std::vector<double> c = reference_partial(kxn, bf16({1, 2, 3, 4}), bf16({5, 6, 7, 8}));
  EXPECT_EQ(c, (std::vector<double>{19, 22, 43, 50}));
  // The same W as nn.Linear stores it (n x k): [5 7; 6 8].
  const Problem nxk{2, 2, 2, 1, WeightLayout::kNxK};
  EXPECT_EQ(reference_partial(nxk, bf16({1, 2, 3, 4}), bf16({5, 7, 6, 8})), c);
  // A non-square one: (1 x 3) @ (3 x 2), with a fraction.
  const Problem p{1, 2, 3, 1, WeightLayout::kKxN};
  EXPECT_EQ(reference_partial(p, bf16({0.5f, -1, 2}), bf16({1, 2, 3, 4, 5, 6})), (std::vector<double>{7.5, 9}));
}

TEST(Reference, LayoutsAgreeOnTransposedW) {
  const Problem kxn{5, 24, 16, 1, WeightLayout::kKxN};
  const std::vector<RankInputs> in = make_random_inputs(kxn, 7);
  Problem nxk = kxn;
  nxk.weight_layout = WeightLayout::kNxK;
  EXPECT_EQ(reference_partial(kxn, in[0].a, in[0].w), reference_partial(nxk, in[0].a, transpose(in[0].w, 16, 24)));
}

TEST(Reference, WrongSizesThrow) {
  const Problem p{2, 2, 2, 1, WeightLayout::kKxN};
  EXPECT_THROW(reference_partial(p, bf16({1, 2, 3}), bf16({1, 2, 3, 4})), std::invalid_argument);
  EXPECT_THROW(reference_reduce_scatter(Problem{4, 2, 2, 2, WeightLayout::kKxN}, {{0, 0, 0, 0, 0, 0, 0, 0}}),
               std::invalid_argument);
}

TEST(Reference, ReduceScatterSumsIntoTheOwnersRows) {
  // P = 2, m = 4 (2 rows per rank), n = 2. Partial r holds 100*r + the element's index.
  const Problem p{4, 2, 8, 2, WeightLayout::kKxN};
  std::vector<std::vector<double>> partials(2, std::vector<double>(8));
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < 8; ++e) partials[size_t(r)][size_t(e)] = 100.0 * r + e;
  const auto out = reference_reduce_scatter(p, partials);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], (std::vector<double>{100, 102, 104, 106}));  // rows 0-1: e + (100 + e)
  EXPECT_EQ(out[1], (std::vector<double>{108, 110, 112, 114}));  // rows 2-3

  // P = 8 with one row per rank: rank d gets row d of the sum over all ranks.
  const Problem q{8, 8, 8, 8, WeightLayout::kKxN};
  std::vector<std::vector<double>> ones(8, std::vector<double>(64));
  for (int r = 0; r < 8; ++r)
    for (int e = 0; e < 64; ++e) ones[size_t(r)][size_t(e)] = double(1 << r) * (e / 8 + 1);
  const auto rs = reference_reduce_scatter(q, ones);
  for (int d = 0; d < 8; ++d)
    for (int j = 0; j < 8; ++j) EXPECT_EQ(rs[size_t(d)][size_t(j)], 255.0 * (d + 1)) << d << "," << j;
}

TEST(ErrorMeasures, KnownVectors) {
  const ErrorStats e = error_stats(std::vector<double>{1, 2, 3}, std::vector<double>{1, 2, 4});
  EXPECT_DOUBLE_EQ(e.max_rel, 0.25);
  EXPECT_DOUBLE_EQ(e.norm_rel, 1.0 / std::sqrt(21.0));

  const ErrorStats exact = error_stats(std::vector<double>{1, -2}, std::vector<double>{1, -2});
  EXPECT_EQ(exact.max_rel, 0.0);
  EXPECT_EQ(exact.norm_rel, 0.0);

  // Over the whole output: the max and the norms span all ranks.
  const ErrorStats whole = error_stats(std::vector<std::vector<double>>{{0, 3}, {4, 0}},
                                       std::vector<std::vector<double>>{{0, 3}, {2, 8}});
  EXPECT_DOUBLE_EQ(whole.max_rel, 8.0 / 8.0);
  EXPECT_DOUBLE_EQ(whole.norm_rel, std::sqrt(4.0 + 64.0) / std::sqrt(9.0 + 4.0 + 64.0));

  // A zero reference: exact output is 0 error, anything else infinite.
  EXPECT_EQ(error_stats(std::vector<double>{0, 0}, std::vector<double>{0, 0}).max_rel, 0.0);
  EXPECT_TRUE(std::isinf(error_stats(std::vector<double>{0, 1}, std::vector<double>{0, 0}).norm_rel));
  // A NaN in the output is never small.
  const ErrorStats nan = error_stats(std::vector<double>{std::nan(""), 1}, std::vector<double>{1, 1});
  EXPECT_FALSE(within_tolerance(nan, ErrorStats{1, 1}));
}

TEST(ErrorMeasures, WithinTolerance) {
  EXPECT_TRUE(within_tolerance({0.1, 0.01}, {0.1, 0.01}));
  EXPECT_TRUE(within_tolerance({0.109, 0.0109}, {0.1, 0.01}));
  EXPECT_FALSE(within_tolerance({0.111, 0.01}, {0.1, 0.01}));   // max_rel over 1.1x
  EXPECT_FALSE(within_tolerance({0.1, 0.0111}, {0.1, 0.01}));   // norm_rel over 1.1x
  EXPECT_TRUE(within_tolerance({0.0, 0.0}, {0.1, 0.01}));
  EXPECT_TRUE(within_tolerance({0.0, 0.0}, {0.0, 0.0}));        // exact baseline, exact fused
  EXPECT_FALSE(within_tolerance({1e-12, 0.0}, {0.0, 0.0}));     // exact baseline demands exactness
  EXPECT_TRUE(within_tolerance({0.15, 0.015}, {0.1, 0.01}, 1.5));
}

// Unfused (BF16 partials, float sum, BF16 out) against the exact reference on random inputs: a small,
// nonzero error. A fused-style sum (own partial in FP32, peers' partials in BF16, one rounding) passes
// the 1.1x rule; a sum that drops or doubles a peer's partial fails it.
TEST(ErrorMeasures, OnePointOneRuleOnRandomInputs) {
  for (int P : {2, 4, 8}) {
    const Problem p{16 * P, 48, 64, P, WeightLayout::kNxK};
    const auto inputs = make_random_inputs(p, 1234 + P);
    const auto partials = partials_of(p, inputs);
    const auto ref = reference_reduce_scatter(p, partials);
    const ErrorStats unfused = error_stats(unfused_reduce_scatter(p, partials), ref);
    EXPECT_GT(unfused.max_rel, 0.0);
    EXPECT_LT(unfused.max_rel, 0.02);
    EXPECT_LT(unfused.norm_rel, 0.01);

    // mode 0: fused as designed; 1: peer 0's partial missing; 2: peer 0's partial added twice.
    for (int mode = 0; mode < 3; ++mode) {
      const int64_t rows = p.rows_per_rank(), n = p.n;
      std::vector<std::vector<uint16_t>> out(size_t(P), std::vector<uint16_t>(size_t(rows * n)));
      for (int d = 0; d < P; ++d) {
        for (int64_t e = 0; e < rows * n; ++e) {
          float sum = float(partials[size_t(d)][size_t(d * rows * n + e)]);
          for (int r = 0; r < P; ++r) {
            if (r == d) continue;
            const float peer = bf16_to_float(float_to_bf16(float(partials[size_t(r)][size_t(d * rows * n + e)])));
            const bool first_peer = r == (d == 0 ? 1 : 0);
            if (first_peer && mode == 1) continue;
            sum += (first_peer && mode == 2) ? 2 * peer : peer;
          }
          out[size_t(d)][size_t(e)] = float_to_bf16(sum);
        }
      }
      const ErrorStats fused = error_stats(out, ref);
      EXPECT_EQ(within_tolerance(fused, unfused), mode == 0)
          << "P=" << P << " mode " << mode << ": fused " << fused.max_rel << "/" << fused.norm_rel << ", unfused "
          << unfused.max_rel << "/" << unfused.norm_rel;
    }
  }
}

TEST(ExactMode, EveryPartialAndTotalIsExactInBf16) {
  for (int P : {1, 2, 4, 8}) {
    for (int64_t k : {8, 24, 64, 1024}) {
      for (WeightLayout layout : {WeightLayout::kKxN, WeightLayout::kNxK}) {
        const Problem p{4 * P, 40, k, P, layout};
        const auto inputs = make_exact_inputs(p, 99 + P);
        ASSERT_EQ(inputs.size(), size_t(P));
        for (const RankInputs& in : inputs) {
          ASSERT_EQ(in.a.size(), size_t(p.m * k));
          ASSERT_EQ(in.w.size(), size_t(k * p.n));
          for (uint16_t v : in.a) ASSERT_TRUE(v == float_to_bf16(0) || v == float_to_bf16(1) || v == float_to_bf16(-1));
        }
        const auto partials = partials_of(p, inputs);
        double largest = 0;
        for (const auto& partial : partials) {
          for (double v : partial) {
            ASSERT_TRUE(is_bf16_exact(v)) << v;
            ASSERT_LE(std::fabs(v), 256.0 / P);
          }
        }
        const auto ref = reference_reduce_scatter(p, partials);
        for (const auto& out : ref) {
          for (double v : out) {
            ASSERT_TRUE(is_bf16_exact(v)) << v;
            largest = std::max(largest, std::fabs(v));
          }
        }
        // Not trivially zero, and large sums show up where k allows them.
        EXPECT_GE(largest, 2.0) << "P=" << P << " k=" << k;
        // Exact inputs make the unfused path exact too.
        const auto unfused = unfused_reduce_scatter(p, partials);
        EXPECT_FALSE(first_mismatch(p, unfused, ref).found);
        const ErrorStats e = error_stats(unfused, ref);
        EXPECT_EQ(e.max_rel, 0.0);
        EXPECT_EQ(e.norm_rel, 0.0);
      }
    }
  }
}

TEST(ExactMode, SameSeedSameInputs) {
  const Problem p{16, 16, 64, 2, WeightLayout::kKxN};
  const auto x = make_exact_inputs(p, 5), y = make_exact_inputs(p, 5), z = make_exact_inputs(p, 6);
  EXPECT_EQ(x[1].a, y[1].a);
  EXPECT_EQ(x[1].w, y[1].w);
  EXPECT_NE(x[1].a, z[1].a);
}

TEST(ExactMode, FirstMismatchReportsRankRowCol) {
  const Problem p{32, 16, 64, 4, WeightLayout::kKxN};
  const auto partials = partials_of(p, make_exact_inputs(p, 3));
  const auto ref = reference_reduce_scatter(p, partials);
  auto out = unfused_reduce_scatter(p, partials);
  ASSERT_FALSE(first_mismatch(p, out, ref).found);
  EXPECT_EQ(first_mismatch(p, out, ref).to_string(), "no mismatch");

  // Corrupt rank 2, row 3, col 5 and, later, rank 3 row 0: the first is reported.
  out[2][3 * 16 + 5] = float_to_bf16(bf16_to_float(out[2][3 * 16 + 5]) + 1);
  out[3][0] = float_to_bf16(1000);
  const Mismatch mm = first_mismatch(p, out, ref);
  ASSERT_TRUE(mm.found);
  EXPECT_EQ(mm.rank, 2);
  EXPECT_EQ(mm.row, 3);
  EXPECT_EQ(mm.col, 5);
  EXPECT_EQ(mm.got, mm.expected + 1);
  EXPECT_EQ(mm.to_string().rfind("rank 2, row 3, col 5: got ", 0), 0u) << mm.to_string();

  // A NaN is a mismatch; -0 equals +0.
  out = unfused_reduce_scatter(p, partials);
  out[0][0] = 0x7FC0;
  EXPECT_TRUE(first_mismatch(p, out, ref).found);
  std::vector<std::vector<double>> zeros(4, std::vector<double>(8 * 16, 0.0));
  std::vector<std::vector<uint16_t>> negative_zeros(4, std::vector<uint16_t>(8 * 16, 0x8000));
  EXPECT_FALSE(first_mismatch(p, negative_zeros, zeros).found);
}

}  // namespace
}  // namespace tpfuse::testing
