// The plain GEMM's kernel for M <= 64 rows: C^T = W^T A^T, so that W takes the WGMMA's 64-row side
// and A's few rows its narrow one (m64 n{8,16,32,64}): at these M the GEMM is a stream of W.
//
// A stage holding 64 x 64 of W and only kRows rows of A (the tiled kernel's 64-row A stage is
// mostly rows past M at decode sizes), the ring's depth is free of A's rows: 10 stages, the depth
// that measured fastest (deeper rings, up to the 25 that fit, were slower; docs/EXPERIMENTS.md).
//
// A tile is 64 columns of C by all of its rows, over the whole K loop; the CTAs walk the tiles
// persistently (tile cta, cta + grid, ...). Warp 0 of warpgroup 0 loads (one thread), warpgroup 1
// multiplies and stores each tile's accumulators straight to C (a few KB a tile: no staging).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include "core/ptx.cuh"
#include "gemm/mainloop.cuh"

namespace tpfuse::kernels {

template <int kRows_, bool kWeightKMajor_, DType kDType_>
struct SwapAbConfig {
  static constexpr int kRows = kRows_;  // A's rows a stage holds: M rounded up (the WGMMA's N)
  static constexpr int kCols = 64;      // C's columns a tile: the WGMMA's M
  // The inputs' element type: a stage holds kStageRowBytes of each row (gemm/variants.h).
  static constexpr DType kDType = kDType_;
  static constexpr int kInputBytes = element_bytes(kDType);
  static constexpr int kBlockK = kStageRowBytes / kInputBytes;
  using Element = ElementBits<kDType>;  // what the stages hold
  // W stored N x K (nn.Linear, K contiguous) when true; K x N (N contiguous) when false.
  static constexpr bool kWeightKMajor = kWeightKMajor_;
  static constexpr int kThreads = 256;

  static constexpr int kWBytes = kCols * kStageRowBytes;
  static constexpr int kABytes = kRows * kStageRowBytes;
  static constexpr int kStages = 10;

  struct Storage {
    Element w[kStages][kCols * kBlockK];  // 1024-byte aligned pieces (TMA SWIZZLE_128B)
    Element a[kStages][kRows * kBlockK];
    uint64_t full[kStages];
    uint64_t empty[kStages];
  };
  static_assert(kRows == 8 || kRows == 16 || kRows == 32 || kRows == 64, "a WGMMA's N of 8, 16, 32 or 64");
  static_assert(kWeightKMajor || kDType == DType::kBF16, "an MN-major W is BF16's only");
  static_assert(kABytes % 1024 == 0, "A's pieces stay 1024-byte aligned");
  static_assert(sizeof(Storage) + 1024 <= 232448, "the ring and its alignment slack fit the 227 KiB a block takes");
};

struct SwapAbParams {
  CUtensorMap a;  // m x k, K-major, box 64 x kRows (rows past m read as zeros)
  CUtensorMap w;  // K-major: box 64 x 64 (n rows); MN-major: box 64 x 64 (k rows)
  __nv_bfloat16* c;
  int m;
  int n;
  int num_tiles;  // ceil(n / 64)
  int num_k_blocks;
};

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1) swap_ab_gemm_kernel(const __grid_constant__ SwapAbParams p) {
  auto& smem = aligned_shared_storage<Config>();
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&p.a);
    ptx::prefetch_tensor_map(&p.w);
    for (int s = 0; s < Config::kStages; ++s) {
      ptx::mbarrier_init(&smem.full[s], 1);
      ptx::mbarrier_init(&smem.empty[s], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  StageCursor ring;
  if (threadIdx.x < 128) {
    if (threadIdx.x != 0) return;  // one thread loads; the others have nothing to wait for
    for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
      const int col = tile * Config::kCols;
      for (int kb = 0; kb < p.num_k_blocks; ++kb) {
        ptx::mbarrier_wait(&smem.empty[ring.stage], ring.phase ^ 1);
        uint64_t* full = &smem.full[ring.stage];
        ptx::mbarrier_arrive_expect_tx(full, Config::kWBytes + Config::kABytes);
        const int k = kb * Config::kBlockK;
        if constexpr (Config::kWeightKMajor) {
          ptx::tma_load_2d(smem.w[ring.stage], &p.w, full, k, col);
        } else {
          ptx::tma_load_2d(smem.w[ring.stage], &p.w, full, col, k);
        }
        ptx::tma_load_2d(smem.a[ring.stage], &p.a, full, k, 0);
        ring.advance<Config>();
      }
    }
    return;
  }

  // W from shared memory as the A operand (as stored), A's rows as the B operand (K-major).
  using Mma = WgmmaSS<Config::kDType, Config::kRows, kMajorW<Config::kWeightKMajor>, gmma::Major::K>;
  // Descriptor steps (16-byte units) for one WGMMA's K: its 32 bytes along a K-major row, its rows of
  // an MN-major piece (128 bytes each).
  constexpr uint64_t kStepA = (Mma::kK * Config::kInputBytes) >> 4;
  constexpr uint64_t kStepW = Config::kWeightKMajor ? kStepA : ((Mma::kK * 128) >> 4);
  float acc[Config::kRows / 2];
  const int lane = threadIdx.x % 32, warp = (threadIdx.x - 128) / 32;
  for (int tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    int prev_stage = -1;
    for (int kb = 0; kb < p.num_k_blocks; ++kb) {
      const int stage = ring.stage;
      ptx::mbarrier_wait(&smem.full[stage], ring.phase);
      const uint64_t desc_w = Config::kWeightKMajor ? ptx::smem_desc_k_major_sw128(smem.w[stage])
                                                    : ptx::smem_desc_mn_major_sw128(smem.w[stage], Config::kWBytes);
      const uint64_t desc_a = ptx::smem_desc_k_major_sw128(smem.a[stage]);
#pragma unroll
      for (int i = 0; i < Config::kRows / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < Config::kBlockK / Mma::kK; ++kk) {
        Mma::mma(desc_w + kk * kStepW, desc_a + kk * kStepA, acc, kb > 0 || kk > 0);
      }
      cute::warpgroup_commit_batch();
      // Keep one batch in flight; the one before it is done, so its stage goes back to the producer.
      cute::warpgroup_wait<1>();
#pragma unroll
      for (int i = 0; i < Config::kRows / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
      if (prev_stage >= 0 && threadIdx.x == 128) ptx::mbarrier_arrive(&smem.empty[prev_stage]);
      prev_stage = stage;
      ring.advance<Config>();
    }
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < Config::kRows / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    if (prev_stage >= 0 && threadIdx.x == 128) ptx::mbarrier_arrive(&smem.empty[prev_stage]);

    // The accumulator of an m64nN WGMMA: thread (warp w, lane l) holds rows 16w + l/4 (+8) and
    // columns 8j + 2(l%4) (+1); its rows are C's columns here, its columns C's rows.
    const int n_base = tile * Config::kCols + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < Config::kRows / 8; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = n_base + 8 * half;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * j + 2 * (lane % 4) + e;
          if (m < p.m && n < p.n) p.c[int64_t(m) * p.n + n] = __float2bfloat16_rn(acc[4 * j + 2 * half + e]);
        }
      }
    }
  }
}

}  // namespace tpfuse::kernels
