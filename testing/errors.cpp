#include "testing/errors.h"

#include <cmath>
#include <limits>

namespace tpfuse::testing {

namespace {

double relative(double diff, double ref) {
  if (ref > 0) return diff / ref;
  return diff == 0 ? 0.0 : std::numeric_limits<double>::infinity();
}

}  // namespace

void ErrorSums::add(double out, double ref) {
  if (!std::isfinite(out)) {
    ++num_nonfinite;
    return;
  }
  const double diff = std::fabs(out - ref);
  max_abs_diff = std::fmax(max_abs_diff, diff);
  max_abs_ref = std::fmax(max_abs_ref, std::fabs(ref));
  sum_sq_diff += diff * diff;
  sum_sq_ref += ref * ref;
}

void ErrorSums::merge(const ErrorSums& other) {
  max_abs_diff = std::fmax(max_abs_diff, other.max_abs_diff);
  max_abs_ref = std::fmax(max_abs_ref, other.max_abs_ref);
  sum_sq_diff += other.sum_sq_diff;
  sum_sq_ref += other.sum_sq_ref;
  num_nonfinite += other.num_nonfinite;
}

ErrorStats ErrorSums::stats() const {
  ErrorStats stats;
  if (num_nonfinite > 0) {
    stats.max_rel = stats.norm_rel = std::numeric_limits<double>::quiet_NaN();
    return stats;
  }
  stats.max_rel = relative(max_abs_diff, max_abs_ref);
  stats.norm_rel = relative(std::sqrt(sum_sq_diff), std::sqrt(sum_sq_ref));
  return stats;
}

bool within_tolerance(ErrorStats path, ErrorStats baseline, double factor) {
  // Written so that a NaN anywhere fails; factor * 0 = 0 makes an exact baseline demand exactness.
  return path.max_rel <= factor * baseline.max_rel && path.norm_rel <= factor * baseline.norm_rel;
}

}  // namespace tpfuse::testing
