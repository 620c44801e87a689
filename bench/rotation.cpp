#include "rotation.h"

#include <algorithm>

namespace tpfuse::bench {

int rotation_sets(size_t bytes_per_set, size_t l2_bytes, size_t budget_bytes) {
  constexpr size_t kL2Multiple = 4;
  if (bytes_per_set == 0) return 1;
  const size_t wanted = (kL2Multiple * l2_bytes + bytes_per_set - 1) / bytes_per_set;
  const size_t affordable = budget_bytes / bytes_per_set;
  return int(std::max<size_t>(1, std::min({wanted, affordable, size_t(kMaxRotationSets)})));
}

int rotation_set(int call, int num_sets) {
  if (num_sets < 3) return call % num_sets;
  // One set further on each time the calls wrap around the sets.
  return (call + call / num_sets) % num_sets;
}

}  // namespace tpfuse::bench
