#include "gpu_testing.cuh"

namespace tpfuse::testing {

ErrorSums error_sums(const std::vector<bf16>& out, const std::vector<float>& ref) {
  ErrorSums sums;
  for (size_t i = 0; i < out.size(); ++i) sums.add(__bfloat162float(out[i]), ref[i]);
  return sums;
}

namespace {

// Whether `out` differs from the BF16 of `reference` in any bit.
bool differs(bf16 out, float reference) {
  const bf16 expected = __float2bfloat16(reference);
  return *reinterpret_cast<const uint16_t*>(&out) != *reinterpret_cast<const uint16_t*>(&expected);
}

}  // namespace

int64_t first_mismatch(const std::vector<bf16>& out, const std::vector<float>& ref) {
  for (size_t i = 0; i < out.size(); ++i) {
    if (differs(out[i], ref[i])) return int64_t(i);
  }
  return -1;
}

std::string element_at(int64_t index, int64_t cols) {
  return "row " + std::to_string(index / cols) + ", column " + std::to_string(index % cols);
}

std::string mismatch_at(const std::vector<bf16>& out, const std::vector<float>& ref, int64_t index, int64_t cols) {
  if (index < 0) return "none";
  int64_t differ = 0;
  for (size_t i = 0; i < out.size(); ++i) differ += differs(out[i], ref[i]);
  return element_at(index, cols) + ": " + std::to_string(__bfloat162float(out[size_t(index)])) + ", expected " +
         std::to_string(__bfloat162float(__float2bfloat16(ref[size_t(index)]))) + " (" + std::to_string(differ) +
         " of " + std::to_string(out.size()) + " differ)";
}

}  // namespace tpfuse::testing
