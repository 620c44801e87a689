// The config choices over a grid of problems, devices and overrides, as one digest: a change of any
// choice (the plain GEMM's, the reduce-scatter's, the all-gather's, or an error) changes it. A
// change of the config code that means to keep every choice keeps the digest; one that means to
// change choices updates kChoicesDigest, and its commit says which choices and why.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gemm/config.h"
#include "ops/ag_gemm/config.h"
#include "ops/gemm_rs/config.h"
#include "tpfuse/problem.h"

namespace tpfuse {
namespace {

constexpr uint64_t kChoicesDigest = 0x5c4964a331f0eae0;
constexpr int64_t kChoices = 1797120;

// FNV-1a over the choices' texts.
struct Digest {
  uint64_t value = 0xcbf29ce484222325ull;
  int64_t count = 0;

  void add(const std::string& text) {
    for (const char c : text) value = (value ^ uint8_t(c)) * 0x100000001b3ull;
    value = (value ^ uint8_t('\n')) * 0x100000001b3ull;
    ++count;
  }
  template <class Config>
  void add(const Status& status, const Config& config) {
    add(status.ok() ? config.to_string() : status.to_string());
  }
};

// None, and each that bears on the choice of tiles: their width, the splits of K, shared tiles
// and their epilogue.
std::vector<ConfigOverrides> override_sets() {
  std::vector<ConfigOverrides> sets(1);
  for (const int block_n : {256, 192, 128, 64}) sets.emplace_back().block_n = block_n;
  for (const int split_k : {1, 2, 4, 8}) sets.emplace_back().split_k = split_k;
  for (const int shared_tiles : {0, 1}) sets.emplace_back().shared_tiles = shared_tiles;
  for (const int registers : {0, 1}) sets.emplace_back().register_epilogue = registers;
  return sets;
}

TEST(ConfigChoices, UnchangedOverAGrid) {
  Digest digest;
  const std::vector<ConfigOverrides> overrides = override_sets();
  for (const int num_sms : {132, 114}) {
    for (const int smem : {232448, 200 * 1024, 160 * 1024, 100 * 1024}) {
      const DeviceInfo device{num_sms, smem, 9, 0};
      for (const ConfigOverrides& o : overrides) {
        for (const int p : {1, 2, 4, 8}) {
          for (const int64_t rows : {1, 2, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 768, 1024, 1536,
                                     2048, 4096}) {
            for (const int64_t n : {264, 512, 1024, 1280, 2048, 3072, 4096, 6144, 8192}) {
              for (const int64_t k : {32, 128, 512, 1024, 2048, 3584, 6144, 8192}) {
                const Problem problem{rows * p, n, k, p, WeightLayout::kNxK};
                GemmConfig gemm;
                digest.add(select_plain_gemm_config(problem, device, o, &gemm), gemm);
                GemmRsConfig rs;
                digest.add(select_gemm_rs_config(problem, device, o, &rs), rs);
                AllGatherConfig ag;
                digest.add(select_all_gather_config(AllGatherProblem{rows * p, n, k, p, WeightLayout::kNxK}, device,
                                                    o, &ag),
                           ag);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(digest.count, kChoices);
  EXPECT_EQ(digest.value, kChoicesDigest) << "digest 0x" << std::hex << digest.value;
}

}  // namespace
}  // namespace tpfuse
