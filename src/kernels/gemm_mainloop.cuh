// The per-rank GEMM: a persistent, warp-specialized Hopper kernel (TMA loads, WGMMA, FP32
// accumulation) whose epilogue is a policy, so the same mainloop serves the plain GEMM (store the
// tile locally) and the fused op (push the tile to its owner, or reduce it there).
//
//   warpgroup 0        producer: one thread issues the TMA loads of A and W into a ring of stages,
//                      and leaves each step's work next to its first stage; two more threads may
//                      help the epilogue (run_persistent)
//   warpgroups 1, 2    consumers: WGMMA on each stage, then the epilogue of the tile
//
// An epilogue may also stream inputs of its own through the same ring, after a tile's K stages
// (the fused op's partials of an own tile): they then arrive while the tile is still being
// multiplied, as deep as the ring, instead of after it.
//
// The CTAs walk the tile schedule (plan/schedule.h) persistently, one step per wave of `grid` steps
// (persistent_step): CTA b's place in the wave moves on by one each wave.
//
// With clusters of two, CTAs 2p and 2p+1 take adjacent steps, which usually lie in the same tile
// column (the schedule goes column-major inside a raster group): then each CTA loads half of the W
// tile and multicasts it to both, halving W's traffic from L2. NOTE: the two CTAs run in lockstep:
// the same number of steps (a CTA whose step is past the end recomputes its partner's tile and
// stores nothing) over the same K, and every consumer releases each stage in both CTAs, so a stage
// is refilled (by either producer) only once all four consumers are done with it.
#pragma once

#include <cuda_bf16.h>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <utility>

#include "kernels/ptx.cuh"
#include "plan/schedule.h"

namespace tpfuse::kernels {

template <int kBlockM_, int kBlockN_, int kStages_, bool kWeightKMajor_, int kCluster_, int kStagedChunks_ = 0>
struct MainloopConfig {
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockK = 64;  // 128 bytes of BF16: one 128-byte-swizzled TMA row
  static constexpr int kStages = kStages_;
  // W stored N x K (nn.Linear, K contiguous) when true; K x N (N contiguous) when false.
  static constexpr bool kWeightKMajor = kWeightKMajor_;

  // Two consumer warpgroups, each owning a 64-row slab: stacked along M for 128-row tiles, side by
  // side along N for 64-row tiles.
  static constexpr int kConsumers = 2;
  static constexpr int kWgRows = 64;
  static constexpr int kWgAlongM = kBlockM / kWgRows;
  static constexpr int kWgAlongN = kConsumers / kWgAlongM;
  static constexpr int kWgCols = kBlockN / kWgAlongN;
  static constexpr int kAccPerThread = kWgRows * kWgCols / 128;
  static constexpr int kThreads = 128 * (kConsumers + 1);

  static constexpr int kCluster = kCluster_;  // CTAs sharing W tiles by multicast (1 or 2)

  static constexpr int kABytes = kBlockM * kBlockK * 2;
  static constexpr int kWBytes = kBlockN * kBlockK * 2;
  static constexpr int kWChunkBytes = 64 * kBlockK * 2;  // one 64-column chunk of an MN-major W tile
  // W tiles are loaded in pieces (split between the CTAs of a cluster): K-major, two halves of the
  // tile's rows; MN-major, its 64-column chunks.
  static constexpr int kWPieces = kWeightKMajor ? 2 : kBlockN / 64;
  static constexpr int kWPieceElems = kBlockN * kBlockK / kWPieces;
  static constexpr int kWPieceBoxRows = kWeightKMajor ? kBlockN / 2 : kBlockK;
  static constexpr int kWPieceBoxCols = kWeightKMajor ? kBlockK : 64;

  // Extra stages (see above) carry 8 KB pieces: a 64 x 64 BF16 chunk each, A's part of a stage
  // first, then W's.
  static constexpr int kPieceBytes = 64 * 64 * 2;
  static constexpr int kAPieces = kABytes / kPieceBytes;
  static constexpr int kPiecesPerStage = (kABytes + kWBytes) / kPieceBytes;
  static constexpr int kChunksPerSlab = kWgCols / 64;
  // Chunk buffers per consumer: a whole slab, or (prototype, plain GEMM) fewer, staged in batches.
  static constexpr int kStagedChunks = kStagedChunks_ > 0 ? kStagedChunks_ : kChunksPerSlab;

  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(kBlockM == 64 || kBlockM == 128, "tiles are one or two 64-row slabs");
  static_assert(kCluster == 1 || kCluster == 2, "clusters of one or two CTAs");
  static_assert(kWgCols == 128 || kWgCols == 192 || kWgCols == 256, "a consumer issues m64n{128,192,256} WGMMAs");
  static_assert(kABytes % kPieceBytes == 0 && kWBytes % kPieceBytes == 0, "a stage holds whole pieces");
};

// Epilogue staging: each consumer stages its whole slab, one 64 x 64 chunk per buffer.
constexpr int kChunkRows = 64;
constexpr int kChunkCols = 64;
constexpr int kChunkElems = kChunkRows * kChunkCols;

// A staged slab handed from a consumer to the epilogue's sender thread (epilogues that have one):
// where its chunk buffers go, and the flag to raise once they have landed there.
struct SlabHandoff {
  uint64_t staged;   // the consumer: the chunk buffers hold the slab, the fields below say where it goes
  uint64_t sent;     // the sender: its stores have read the chunk buffers, which may be staged again
  int destination;   // the epilogue's name for the tensor (the owner rank for the fused op); -1: nothing
  int row;
  int col;
  int num_chunks;
  uint32_t* flag;    // raised once the stores have landed; null: none
};

// A consumer's chunk buffers, where its epilogue stages a slab for TMA stores, and its hand-off.
struct ChunkBuffers {
  __nv_bfloat16 (*data)[kChunkElems];
  SlabHandoff* handoff;
};

// What a CTA does at one step of its persistent loop.
struct Work {
  Tile tile;
  bool store;             // false: a duplicate of the partner's tile, computed only to keep the pair in lockstep
  bool share_w;           // both CTAs of the pair need the same W tile: load half each, multicast
};
static_assert(sizeof(Work) <= 32, "the config's shared memory model (plan/config.cpp) counts 32 bytes a stage");

template <class Config>
struct alignas(1024) SharedStorage {
  __nv_bfloat16 a[Config::kStages][Config::kBlockM * Config::kBlockK];
  __nv_bfloat16 w[Config::kStages][Config::kBlockN * Config::kBlockK];
  __nv_bfloat16 chunks[Config::kConsumers][Config::kStagedChunks][kChunkElems];
  uint64_t full[Config::kStages];   // TMA bytes of a stage have landed
  uint64_t empty[Config::kStages];  // every consumer is done reading a stage
  // The step's work, left by the producer with the step's first K stage (the consumers read it once
  // that stage is full, and need not compute the schedule themselves).
  Work stage_work[Config::kStages];
  SlabHandoff handoff[Config::kConsumers];
  // An epilogue's watcher thread and the producer (epilogues that have one): the inputs of the next
  // tile with extra stages have arrived; the producer has taken that news.
  uint64_t extra_ready;
  uint64_t extra_taken;
};

// A position in the ring of stages (producer and consumers each keep their own).
struct StageCursor {
  int stage = 0;
  uint32_t phase = 0;  // parity of the stage's current use

  template <class Config>
  __device__ void advance() {
    if (++stage == Config::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// Piece q of a stage used as an extra stage (8 KB, 1024-byte aligned).
template <class Config>
__device__ __forceinline__ __nv_bfloat16* stage_piece(SharedStorage<Config>& smem, int stage, int q) {
  constexpr int kPieceElems = Config::kPieceBytes / 2;
  return q < Config::kAPieces ? smem.a[stage] + q * kPieceElems : smem.w[stage] + (q - Config::kAPieces) * kPieceElems;
}

struct MainloopParams {
  CUtensorMap a;  // m x k_per_rank, K-major, box 64 x kBlockM
  CUtensorMap w;  // K-major: box 64 x kBlockN; MN-major: box 64 x 64
  TileSchedule schedule;
  int num_k_blocks;
};

// The dynamic shared memory, aligned to 1024 bytes (swizzled TMA tiles need it; launches reserve the slack).
template <class Config>
__device__ __forceinline__ SharedStorage<Config>& aligned_shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  return *reinterpret_cast<SharedStorage<Config>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

template <class Epilogue>
struct KernelParams {
  MainloopParams mainloop;
  typename Epilogue::Params epilogue;
};

// The step of CTA `cta` in wave `wave`. A pair of CTAs moves on by a pair, so that it keeps two
// adjacent steps, the first even.
template <class Config>
__device__ __forceinline__ int step_of(int cta, int num_ctas, int wave) {
  return persistent_step(cta, num_ctas, wave, Config::kCluster);
}

// Steps run while this is true (for a pair: while its first step is a tile).
template <class Config>
__device__ __forceinline__ bool has_work(int step, int num_tiles) {
  return Config::kCluster == 1 ? step < num_tiles : (step & ~1) < num_tiles;
}

template <class Config>
__device__ __forceinline__ Work work_at(const TileSchedule& schedule, int step, int num_tiles) {
  if constexpr (Config::kCluster == 1) {
    return {schedule.tile(step), true, false};
  } else {
    const int partner = step ^ 1;
    const bool mine = step < num_tiles;
    const Tile tile = schedule.tile(mine ? step : partner);
    const Tile partner_tile = partner < num_tiles ? schedule.tile(partner) : tile;
    return {tile, mine, partner_tile.col_begin == tile.col_begin};
  }
}

// Calls fn(work) for each step of CTA `cta`, in the order the producer and the consumers take them.
template <class Config, class Fn>
__device__ __forceinline__ void for_each_work(const TileSchedule& schedule, int cta, int num_ctas, Fn&& fn) {
  const int num_tiles = schedule.num_tiles();
  for (int wave = 0, step = cta; has_work<Config>(step, num_tiles); step = step_of<Config>(cta, num_ctas, ++wave)) {
    fn(work_at<Config>(schedule, step, num_tiles));
  }
}

// One m64nNk16 WGMMA, A and W from shared memory, accumulating into `acc` (N/2 floats a thread).
template <int N, bool kWeightKMajor>
struct Wgmma {
  static constexpr auto kMajorW = kWeightKMajor ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN;
  using Op = std::conditional_t<
      N == 256, cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, kMajorW>,
      std::conditional_t<N == 192, cute::SM90::GMMA::MMA_64x192x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, kMajorW>,
                         cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, kMajorW>>>;

  template <size_t... I>
  __device__ __forceinline__ static void call(uint64_t desc_a, uint64_t desc_w, float* acc, bool accumulate,
                                              std::index_sequence<I...>) {
    Op::fma(desc_a, desc_w, acc[I]...,
            accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
  }
  __device__ __forceinline__ static void mma(uint64_t desc_a, uint64_t desc_w, float* acc, bool accumulate) {
    call(desc_a, desc_w, acc, accumulate, std::make_index_sequence<N / 2>{});
  }
};

// Where a consumer's 64-row slab sits inside the tile.
template <class Config>
struct Slab {
  int row;  // first row within the tile
  int col;  // first column within the tile
  __device__ static Slab of_consumer(int consumer) {
    return {(consumer % Config::kWgAlongM) * Config::kWgRows, (consumer / Config::kWgAlongM) * Config::kWgCols};
  }
};

// The producer thread: each tile's K stages, then the epilogue's extra stages of the tile, if any.
template <class Config, class Epilogue>
__device__ __forceinline__ void produce(const MainloopParams& p, const typename Epilogue::Params& epilogue,
                                        SharedStorage<Config>& smem, int cta, int num_ctas) {
  StageCursor ring;
  uint32_t extra_phase = 0;  // the epilogue's, across tiles
  const int num_tiles = p.schedule.num_tiles();
  const int cluster_rank = Config::kCluster == 1 ? 0 : int(ptx::cluster_cta_rank());
  for (int wave = 0, step = cta; has_work<Config>(step, num_tiles); step = step_of<Config>(cta, num_ctas, ++wave)) {
    const Work work = work_at<Config>(p.schedule, step, num_tiles);
    const int num_k_blocks = p.num_k_blocks;  // a register: the loop's asm clobbers memory
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      const int stage = ring.stage;
      ptx::mbarrier_wait(&smem.empty[stage], ring.phase ^ 1);
      if (kb == 0) smem.stage_work[stage] = work;  // published by the arrive below (a release)
      uint64_t* full = &smem.full[stage];
      // Both halves of a shared W tile arrive here: the expected bytes are the same either way.
      ptx::mbarrier_arrive_expect_tx(full, Config::kABytes + Config::kWBytes);
      const int k = kb * Config::kBlockK;
      ptx::tma_load_2d(smem.a[stage], &p.a, full, k, work.tile.row_begin);
#pragma unroll
      for (int piece = 0; piece < Config::kWPieces; ++piece) {
        __nv_bfloat16* dst = smem.w[stage] + piece * Config::kWPieceElems;
        const int x = Config::kWeightKMajor ? k : work.tile.col_begin + piece * 64;
        const int y = Config::kWeightKMajor ? work.tile.col_begin + piece * (Config::kBlockN / 2) : k;
        if (!work.share_w) {
          ptx::tma_load_2d(dst, &p.w, full, x, y);
        } else if (piece % Config::kCluster == cluster_rank) {
          ptx::tma_load_2d_multicast(dst, &p.w, full, x, y, (1u << Config::kCluster) - 1);
        }
      }
      ring.advance<Config>();
    }
    Epilogue::template produce_extra_stages<Config>(epilogue, work.tile, smem, ring, extra_phase);
  }
}

// Hands a stage back to the producers: this CTA's, and in a cluster the partner's too (see the NOTE
// at the top).
template <class Config>
__device__ __forceinline__ void release_stage(SharedStorage<Config>& smem, int stage) {
  if (threadIdx.x % 128 != 0) return;
  ptx::mbarrier_arrive(&smem.empty[stage]);
  if constexpr (Config::kCluster == 2) ptx::mbarrier_arrive_cluster(&smem.empty[stage], ptx::cluster_cta_rank() ^ 1);
}

// Accumulates one tile's slab over all K blocks. `ring` carries the position across tiles.
template <class Config>
__device__ __forceinline__ void consume_tile(const MainloopParams& p, SharedStorage<Config>& smem, Slab<Config> slab,
                                             float (&acc)[Config::kAccPerThread], StageCursor& ring) {
  using Mma = Wgmma<Config::kWgCols, Config::kWeightKMajor>;
  // Descriptor steps for 16 elements of K: 32 bytes along a K-major row, 16 rows of an MN-major chunk.
  constexpr uint64_t kStepA = 32 >> 4;
  constexpr uint64_t kStepW = Config::kWeightKMajor ? (32 >> 4) : ((16 * 128) >> 4);
  // Byte offset of the slab's columns inside a W stage (the same for both layouts: kWgCols x 64 BF16).
  const int w_offset_elems = slab.col * Config::kBlockK;

  int prev_stage = -1;
  const int num_k_blocks = p.num_k_blocks;  // a register: the loop's asm clobbers memory
  for (int kb = 0; kb < num_k_blocks; ++kb) {
    const int stage = ring.stage;
    ptx::mbarrier_wait(&smem.full[stage], ring.phase);
    const uint64_t desc_a = ptx::smem_desc_k_major_sw128(smem.a[stage] + slab.row * Config::kBlockK);
    const uint64_t desc_w = Config::kWeightKMajor
                                ? ptx::smem_desc_k_major_sw128(smem.w[stage] + w_offset_elems)
                                : ptx::smem_desc_mn_major_sw128(smem.w[stage] + w_offset_elems, Config::kWChunkBytes);
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < Config::kBlockK / 16; ++kk) {
      Mma::mma(desc_a + kk * kStepA, desc_w + kk * kStepW, acc, kb > 0 || kk > 0);
    }
    cute::warpgroup_commit_batch();
    // Keep one batch in flight; the one before it is done, so its stage goes back to the producer.
    cute::warpgroup_wait<1>();
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
    if (prev_stage >= 0) release_stage(smem, prev_stage);
    prev_stage = stage;
    ring.advance<Config>();
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
  if (prev_stage >= 0) release_stage(smem, prev_stage);
}

// The persistent body shared by every kernel: CTA `cta` of `num_ctas` walks its steps of the
// schedule, one per wave (with clusters of two, `num_ctas` is even and CTAs 2p, 2p+1 form a cluster).
// The epilogue is an object per consumer warpgroup:
//   Epilogue(params, consumer, ChunkBuffers);
//   end_tile<Config>(work, slab, acc, smem, ring) after each tile's K stages: its extra stages, if
//             any, and the store of the slab, in the order the epilogue needs;
//   finish() at the end;
// and Epilogue::produce_extra_stages<Config>(params, tile, smem, ring, extra_phase), which the
// producer thread calls after each tile's K stages (both sides must agree on the number of extra
// stages; extra_phase is the epilogue's to keep across tiles).
// Two more threads of the producer warpgroup may help the epilogue:
//   with Epilogue::kHasSender, warp 1 runs Epilogue::send<Config>(params, schedule, smem, cta,
//   num_ctas): it takes every consumer's staged slab of every step through smem.handoff, so that the
//   consumers go back to multiplying while the slab goes out;
//   with Epilogue::kHasWatcher, warp 2 runs Epilogue::watch<Config>(params, schedule, smem, cta,
//   num_ctas): it waits for the inputs of the tiles with extra stages ahead of the producer and
//   tells it through smem.extra_ready / extra_taken.
// Every thread of the CTA returns from here (none exits early), so callers may synchronize after it.
template <class Config, class Epilogue>
__device__ __forceinline__ void run_persistent(const MainloopParams& mainloop, const typename Epilogue::Params& epilogue_params,
                                               SharedStorage<Config>& smem, int cta, int num_ctas) {
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&mainloop.a);
    ptx::prefetch_tensor_map(&mainloop.w);
    for (int s = 0; s < Config::kStages; ++s) {
      ptx::mbarrier_init(&smem.full[s], 1);
      ptx::mbarrier_init(&smem.empty[s], Config::kConsumers * Config::kCluster);
    }
    for (int c = 0; c < Config::kConsumers; ++c) {
      ptx::mbarrier_init(&smem.handoff[c].staged, 1);
      ptx::mbarrier_init(&smem.handoff[c].sent, 1);
    }
    ptx::mbarrier_init(&smem.extra_ready, 1);
    ptx::mbarrier_init(&smem.extra_taken, 1);
    ptx::fence_barrier_init();
  }
  // The partner's barriers must be initialized before any multicast or remote arrive reaches them.
  if constexpr (Config::kCluster == 2) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<Config::kProducerRegs>();
    if (threadIdx.x == 0) produce<Config, Epilogue>(mainloop, epilogue_params, smem, cta, num_ctas);
    if constexpr (Epilogue::kHasSender) {
      if (threadIdx.x == 32) Epilogue::template send<Config>(epilogue_params, mainloop.schedule, smem, cta, num_ctas);
    }
    if constexpr (Epilogue::kHasWatcher) {
      if (threadIdx.x == 64) Epilogue::template watch<Config>(epilogue_params, mainloop.schedule, smem, cta, num_ctas);
    }
  } else {
    ptx::setmaxnreg_inc<Config::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer);
    Epilogue epilogue(epilogue_params, consumer, ChunkBuffers{smem.chunks[consumer], &smem.handoff[consumer]});
    float acc[Config::kAccPerThread];
    StageCursor ring;
    const int num_tiles = mainloop.schedule.num_tiles();
    for (int wave = 0, step = cta; has_work<Config>(step, num_tiles); step = step_of<Config>(cta, num_ctas, ++wave)) {
      // The ring is at the step's first K stage, which carries the step's work.
      ptx::mbarrier_wait(&smem.full[ring.stage], ring.phase);
      const Work work = smem.stage_work[ring.stage];
      consume_tile<Config>(mainloop, smem, slab, acc, ring);
      epilogue.template end_tile<Config>(work, slab, acc, smem, ring);
    }
    epilogue.finish();
  }
  // A CTA leaves only when its partner no longer multicasts into it or arrives on its barriers.
  if constexpr (Config::kCluster == 2) ptx::cluster_sync();
}

// The plain GEMM kernel: one rank, the whole grid.
template <class Config, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1) gemm_kernel(const __grid_constant__ KernelParams<Epilogue> params) {
  run_persistent<Config, Epilogue>(params.mainloop, params.epilogue, aligned_shared_storage<Config>(), blockIdx.x,
                                   gridDim.x);
}

}  // namespace tpfuse::kernels
