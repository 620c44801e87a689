// Config choice: a pure function of the problem and the device (no CUDA), so it is testable on a CPU
// and every choice can print itself.
#pragma once

#include <cstddef>
#include <string>

#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// What the config choice needs to know about the GPU.
struct DeviceInfo {
  int num_sms = 132;
  int max_smem_per_block = 232448;  // bytes of dynamic shared memory a block may opt in to (H100/H200)
  int cc_major = 9;
  int cc_minor = 0;
};

// An own_lag so large that every own tile comes after every foreign one.
constexpr int kOwnTilesLast = 1 << 30;

// One compiled GEMM mainloop variant and how it is launched.
struct GemmConfig {
  int block_m = 128;             // rows of a tile (one 64-row slab per consumer warpgroup)
  int block_n = 256;             // columns of a tile
  int block_k = 64;              // K per pipeline stage (128 bytes of BF16: one TMA swizzle row)
  int stages = 4;                // shared-memory pipeline depth (as many as fit, at most 4)
  int consumer_warpgroups = 2;   // warpgroups issuing WGMMA; one more warpgroup produces (TMA)
  int group_rows = 32;           // raster group inside a segment: row tiles visited together for L2
                                 // reuse (32 / P, see select_gemm_config)
  // CTAs of a cluster sharing W tiles by TMA multicast (1 or 2). 1: clusters of two measured slower
  // (bench/results/2026-11-29-h200-6b5e4ef): TPFUSE_CLUSTER_SIZE=2 keeps them for tuning.
  int cluster_size = 1;
  int num_ctas = 0;              // persistent grid size
  int own_lag = 0;               // rounds from a peer's tile to the own tile of the same rows (schedule.h)
  int segments_per_tile = 1;     // 2: 128-row tiles over two ranks' 64-row segments (schedule.h)
  int staged_chunks = 0;         // prototype: chunk buffers per consumer (0: a whole slab)

  int threads() const { return 128 * (consumer_warpgroups + 1); }
  // Shared memory the kernel needs: the stages of A and W tiles, the epilogue staging, barriers.
  size_t smem_bytes() const;
  std::string to_string() const;
};

// Picks the GEMM config for one rank's partial product. Fails (never aborts) on an unsupported device.
Status select_gemm_config(const Problem& problem, const DeviceInfo& device, GemmConfig* config);

// Sets config->stages to as many as fit in shared memory with its tile (at most 4, at least 2).
Status fit_stages(const DeviceInfo& device, GemmConfig* config);

}  // namespace tpfuse
