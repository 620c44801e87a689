#include "testing/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace tpfuse::testing {

namespace {

void check_size(const char* name, size_t actual, int64_t expected) {
  if (int64_t(actual) != expected) {
    throw std::invalid_argument(std::string(name) + " has " + std::to_string(actual) + " elements, expected " +
                                std::to_string(expected));
  }
}

void check_ranks(const Problem& problem, const char* name, size_t num) {
  if (problem.world_size < 1 || problem.m % problem.world_size != 0) {
    throw std::invalid_argument("problem.m = " + std::to_string(problem.m) + " is not divisible by world_size = " +
                                std::to_string(problem.world_size));
  }
  check_size(name, num, problem.world_size);
}

// splitmix64: a small, portable generator, so a seed gives the same inputs with any standard library.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t bound) { return next() % bound; }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

uint16_t bf16_of_int(int v) { return float_to_bf16(float(v)); }

}  // namespace

// ---- BF16 ----

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;  // round to nearest, ties to even; carries into the exponent as it should
  return uint16_t(bits >> 16);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}

bool is_bf16_exact(double x) {
  const float f = float(x);
  if (double(f) != x) return false;
  return bf16_to_float(float_to_bf16(f)) == f;
}

std::vector<double> bf16_to_double(const std::vector<uint16_t>& bits) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

// ---- Reference ----

std::vector<double> reference_partial(const Problem& problem, const std::vector<uint16_t>& a_bf16,
                                      const std::vector<uint16_t>& w_bf16) {
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  check_size("a", a_bf16.size(), m * k);
  check_size("w", w_bf16.size(), k * n);
  const std::vector<double> a = bf16_to_double(a_bf16);
  const std::vector<double> w = bf16_to_double(w_bf16);
  // A product of two BF16 values has at most 16 significant bits, so it is exact in double; the sum's
  // rounding (about 1e-16 relative) is far below BF16's (4e-3). Integer inputs (exact mode) sum exactly.
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double* c_row = &c[size_t(i * n)];
    for (int64_t kk = 0; kk < k; ++kk) {
      const double a_ik = a[size_t(i * k + kk)];
      if (a_ik == 0.0) continue;
      for (int64_t j = 0; j < n; ++j) {
        const double w_kj = problem.weight_layout == WeightLayout::kKxN ? w[size_t(kk * n + j)] : w[size_t(j * k + kk)];
        c_row[j] += a_ik * w_kj;
      }
    }
  }
  return c;
}

std::vector<std::vector<double>> reference_reduce_scatter(const Problem& problem,
                                                          const std::vector<std::vector<double>>& partials) {
  check_ranks(problem, "partials", partials.size());
  const int64_t rows = problem.rows_per_rank(), n = problem.n;
  std::vector<std::vector<double>> out(size_t(problem.world_size), std::vector<double>(size_t(rows * n), 0.0));
  for (int r = 0; r < problem.world_size; ++r) {
    check_size("partials[r]", partials[size_t(r)].size(), problem.m * n);
    for (int d = 0; d < problem.world_size; ++d) {
      const double* segment = &partials[size_t(r)][size_t(d * rows * n)];
      for (int64_t e = 0; e < rows * n; ++e) out[size_t(d)][size_t(e)] += segment[e];
    }
  }
  return out;
}

std::vector<std::vector<uint16_t>> unfused_reduce_scatter(const Problem& problem,
                                                          const std::vector<std::vector<double>>& partials) {
  check_ranks(problem, "partials", partials.size());
  const int64_t rows = problem.rows_per_rank(), n = problem.n;
  std::vector<std::vector<uint16_t>> out(size_t(problem.world_size));
  for (int d = 0; d < problem.world_size; ++d) {
    std::vector<float> sum(size_t(rows * n), 0.0f);
    for (int r = 0; r < problem.world_size; ++r) {
      check_size("partials[r]", partials[size_t(r)].size(), problem.m * n);
      const double* segment = &partials[size_t(r)][size_t(d * rows * n)];
      for (int64_t e = 0; e < rows * n; ++e) sum[size_t(e)] += bf16_to_float(float_to_bf16(float(segment[e])));
    }
    out[size_t(d)].resize(sum.size());
    for (size_t e = 0; e < sum.size(); ++e) out[size_t(d)][e] = float_to_bf16(sum[e]);
  }
  return out;
}

// ---- Error measures ----

ErrorStats error_stats(const std::vector<double>& out, const std::vector<double>& ref) {
  check_size("out", out.size(), int64_t(ref.size()));
  ErrorSums sums;
  for (size_t i = 0; i < ref.size(); ++i) sums.add(out[i], ref[i]);
  return sums.stats();
}

ErrorStats error_stats(const std::vector<std::vector<double>>& out, const std::vector<std::vector<double>>& ref) {
  check_size("out", out.size(), int64_t(ref.size()));
  ErrorSums sums;
  for (size_t d = 0; d < ref.size(); ++d) {
    check_size("out[d]", out[d].size(), int64_t(ref[d].size()));
    for (size_t i = 0; i < ref[d].size(); ++i) sums.add(out[d][i], ref[d][i]);
  }
  return sums.stats();
}

ErrorStats error_stats(const std::vector<std::vector<uint16_t>>& out_bf16,
                       const std::vector<std::vector<double>>& ref) {
  std::vector<std::vector<double>> out;
  out.reserve(out_bf16.size());
  for (const auto& o : out_bf16) out.push_back(bf16_to_double(o));
  return error_stats(out, ref);
}

// ---- Exact mode ----

std::vector<RankInputs> make_exact_inputs(const Problem& problem, uint64_t seed) {
  if (problem.world_size < 1 || problem.world_size > 256) {
    throw std::invalid_argument("problem.world_size = " + std::to_string(problem.world_size) +
                                " is out of range for the exact mode");
  }
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  const int64_t nonzeros_per_row = std::min<int64_t>(k, 256 / problem.world_size);
  Rng rng{seed};
  std::vector<RankInputs> inputs(size_t(problem.world_size));
  std::vector<int64_t> columns(static_cast<size_t>(k));
  for (RankInputs& in : inputs) {
    in.a.assign(size_t(m * k), bf16_of_int(0));
    for (int64_t i = 0; i < m; ++i) {
      // The first nonzeros_per_row entries of a partial Fisher-Yates shuffle: distinct random columns.
      std::iota(columns.begin(), columns.end(), int64_t(0));
      for (int64_t t = 0; t < nonzeros_per_row; ++t) {
        std::swap(columns[size_t(t)], columns[size_t(t + int64_t(rng.below(uint64_t(k - t))))]);
        in.a[size_t(i * k + columns[size_t(t)])] = bf16_of_int(rng.below(2) == 0 ? -1 : 1);
      }
    }
    // W's layout does not matter to its distribution: every entry is drawn the same way.
    in.w.resize(size_t(k * n));
    for (uint16_t& w : in.w) w = bf16_of_int(int(rng.below(3)) - 1);
  }
  return inputs;
}

std::vector<RankInputs> make_random_inputs(const Problem& problem, uint64_t seed) {
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  Rng rng{seed};
  auto draw = [&rng]() {
    for (;;) {
      const uint16_t v = float_to_bf16(float(2.0 * rng.uniform() - 1.0));
      if (bf16_to_float(v) != 0.0f) return v;
    }
  };
  std::vector<RankInputs> inputs(size_t(std::max(problem.world_size, 0)));
  for (RankInputs& in : inputs) {
    in.a.resize(size_t(m * k));
    for (uint16_t& a : in.a) a = draw();
    in.w.resize(size_t(k * n));
    for (uint16_t& w : in.w) w = draw();
  }
  return inputs;
}

std::string Mismatch::to_string() const {
  if (!found) return "no mismatch";
  std::ostringstream os;
  os << "rank " << rank << ", row " << row << ", col " << col << ": got " << got << ", expected " << expected;
  return os.str();
}

Mismatch first_mismatch(const Problem& problem, const std::vector<std::vector<uint16_t>>& out_bf16,
                        const std::vector<std::vector<double>>& ref) {
  check_ranks(problem, "out", out_bf16.size());
  check_size("ref", ref.size(), problem.world_size);
  const int64_t rows = problem.rows_per_rank(), n = problem.n;
  for (int d = 0; d < problem.world_size; ++d) {
    check_size("out[d]", out_bf16[size_t(d)].size(), rows * n);
    check_size("ref[d]", ref[size_t(d)].size(), rows * n);
    for (int64_t e = 0; e < rows * n; ++e) {
      const double got = bf16_to_float(out_bf16[size_t(d)][size_t(e)]);
      const double expected = ref[size_t(d)][size_t(e)];
      if (!(got == expected)) {
        Mismatch mismatch;
        mismatch.found = true;
        mismatch.rank = d;
        mismatch.row = e / n;
        mismatch.col = e % n;
        mismatch.got = got;
        mismatch.expected = expected;
        return mismatch;
      }
    }
  }
  return Mismatch{};
}

}  // namespace tpfuse::testing
