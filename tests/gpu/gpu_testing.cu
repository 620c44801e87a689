#include "gpu_testing.cuh"

namespace tpfuse::testing {

ErrorSums error_sums(const std::vector<bf16>& out, const std::vector<float>& ref) {
  ErrorSums sums;
  for (size_t i = 0; i < out.size(); ++i) sums.add(__bfloat162float(out[i]), ref[i]);
  return sums;
}

int64_t first_mismatch(const std::vector<bf16>& out, const std::vector<float>& ref) {
  for (size_t i = 0; i < out.size(); ++i) {
    const bf16 expected = __float2bfloat16(ref[i]);
    if (*reinterpret_cast<const uint16_t*>(&out[i]) != *reinterpret_cast<const uint16_t*>(&expected)) return int64_t(i);
  }
  return -1;
}

std::string element_at(int64_t index, int64_t cols) {
  return "row " + std::to_string(index / cols) + ", column " + std::to_string(index % cols);
}

}  // namespace tpfuse::testing
