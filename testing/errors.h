// docs/SPEC.md's error measures and the 1.1x rule, written once for the CPU tests, the GPU tests and the
// benchmark. Pure C++.
#pragma once

#include <cstdint>

namespace tpfuse::testing {

// A path passes when each of its errors is at most this factor times the baseline's (docs/SPEC.md).
constexpr double kErrorFactor = 1.1;

struct ErrorStats {
  double max_rel = 0;   // max|out - ref| / max|ref|
  double norm_rel = 0;  // ||out - ref||_2 / ||ref||_2
};

// The sums behind ErrorStats, kept apart so that the outputs of several ranks (or of the GPU's
// blocks) can be measured together.
struct ErrorSums {
  double max_abs_diff = 0;
  double max_abs_ref = 0;
  double sum_sq_diff = 0;
  double sum_sq_ref = 0;
  uint64_t num_nonfinite = 0;  // NaN or Inf outputs (left-over poison included); not in the sums

  void add(double out, double ref);
  void merge(const ErrorSums& other);
  // NaN measures if any output was not finite; a zero reference gives 0 if out == ref, else +inf.
  ErrorStats stats() const;
};

// Each of `path`'s measures at most `factor` times the baseline's. When the baseline is exact (a
// measure of 0) the path must be exact too; NaN never passes.
bool within_tolerance(ErrorStats path, ErrorStats baseline, double factor = kErrorFactor);

}  // namespace tpfuse::testing
