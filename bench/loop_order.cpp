#include "loop_order.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tpfuse::bench {

std::vector<int> launch_order(int num_launches, int iteration, const std::optional<AlternatePair>& alternate) {
  std::vector<int> order(size_t(std::max(num_launches, 0)));
  std::iota(order.begin(), order.end(), 0);
  if (alternate && (iteration / kAlternationPass) % 2 == 1) {
    const auto [a, b] = *alternate;
    if (a != b && a >= 0 && b >= 0 && a < num_launches && b < num_launches) std::swap(order[a], order[b]);
  }
  return order;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double placed_median(const std::vector<double>& own_place, const std::vector<double>& other_place) {
  if (own_place.empty()) return median(other_place);
  if (other_place.empty()) return median(own_place);
  return std::sqrt(median(own_place) * median(other_place));
}

}  // namespace tpfuse::bench
