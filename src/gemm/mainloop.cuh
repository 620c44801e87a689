// The per-rank GEMM: a persistent, warp-specialized Hopper kernel (TMA loads, WGMMA, FP32
// accumulation) whose epilogue is a policy, so the same mainloop serves the plain GEMM (store the
// tile locally) and the fused ops (the reduce-scatter pushes a tile to its owner, or reduces it).
//
//   warpgroup 0        producer: one thread issues the TMA loads of A and W into a ring of stages,
//                      and leaves each step's tile next to its first stage; three more threads may
//                      help the epilogue (Role, run_persistent)
//   warpgroups 1, 2    consumers: WGMMA on each stage, then the epilogue of the tile
//
// An epilogue may also stream inputs of its own through the same ring, after a tile's K stages
// (the reduce-scatter's partials of an own tile): they then arrive while the tile is still being
// multiplied, as deep as the ring, instead of after it.
//
// The CTAs walk a schedule (gemm/raster.h, gemm/split_k.h, or an op's) persistently, one step per
// wave of `grid` steps (CtaSteps, gemm/tile.h). A schedule has num_tiles() and tile(step); a step
// multiplies its tile over all K blocks, or over its slice of them where the schedule splits K
// (k_slice_of, gemm/split_k.h).
#pragma once

#include <cuda.h>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <utility>

#include "core/ptx.cuh"
#include "gemm/shared_storage.h"
#include "gemm/split_k.h"
#include "gemm/tile.h"
#include "gemm/variants.h"

namespace tpfuse::kernels {

// A compiled variant (gemm/variants.h) in one weight layout, with the op's shared-memory part.
template <int kBlockM_, int kBlockN_, int kStages_, bool kWeightKMajor_, int kStagedChunks_, int kConsumers_,
          DType kDType_, bool kPromoted_, bool kBlockScaled_, class OpSync_>
struct MainloopConfig {
  // The inputs' (A's and W's) element type. A stage holds kStageRowBytes of each row whatever it is,
  // so its K extent is the dtype's (64 BF16, 128 E4M3) and its bytes are the same.
  static constexpr DType kDType = kDType_;
  // E4M3 inputs are scaled: each slab's accumulators, once its K loop is done (scale_slab). Promoted,
  // each stage's WGMMA sums land in a second set of accumulators and are added into the first in FP32.
  static constexpr bool kScaled = kDType != DType::kBF16;
  static constexpr bool kPromoted = kPromoted_;
  static_assert(!kPromoted || kScaled, "promotion is E4M3's");
  // Blockwise scales (Scaling::kBlockwise) multiply each stage's sums as they are promoted, instead of
  // the slab's accumulators after its K loop: one stage is one 128 of K of the scales.
  static constexpr bool kBlockScaled = kBlockScaled_;
  static constexpr int kInputBytes = element_bytes(kDType);
  using Element = ElementBits<kDType>;  // what the stages hold
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockK = kStageRowBytes / kInputBytes;
  static constexpr int kStages = kStages_;
  // W stored N x K (nn.Linear, K contiguous) when true; K x N (N contiguous) when false.
  static constexpr bool kWeightKMajor = kWeightKMajor_;

  // Consumer warpgroups, each owning a 64-row slab: two stacked along M for 128-row tiles, two side
  // by side along N for 64-row tiles, or one holding a whole 64-row tile.
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kWgRows = 64;
  static constexpr int kWgAlongM = kBlockM / kWgRows;
  static constexpr int kWgAlongN = kConsumers / kWgAlongM;
  static_assert(kWgAlongN >= 1, "a consumer for every 64 rows");
  static constexpr int kWgCols = kBlockN / kWgAlongN;
  static constexpr int kAccPerThread = kWgRows * kWgCols / 128;
  static constexpr int kThreads = 128 * (1 + kConsumers);

  static constexpr int kABytes = kBlockM * kStageRowBytes;
  static constexpr int kWBytes = kBlockN * kStageRowBytes;
  // One 64-column chunk of an MN-major W tile: kBlockK rows of 64 BF16 (an MN-major W is BF16's only:
  // FP8 WGMMA takes K-major operands).
  static constexpr int kWChunkBytes = 64 * kStageRowBytes;
  static_assert(kWeightKMajor || kDType == DType::kBF16, "an MN-major W is BF16's only");
  // W tiles are loaded in pieces: K-major, two halves of the tile's rows; MN-major, its 64-column chunks.
  static constexpr int kWPieces = kWeightKMajor ? 2 : kBlockN / 64;
  static constexpr int kWPieceElems = kBlockN * kBlockK / kWPieces;
  static constexpr int kWPieceBoxRows = kWeightKMajor ? kBlockN / 2 : kBlockK;
  static constexpr int kWPieceBoxCols = kWeightKMajor ? kBlockK : 64;

  // Extra stages (see above) carry 8 KB pieces: a 64 x 64 BF16 chunk each (partials, whatever the
  // inputs' dtype), A's part of a stage first, then W's.
  static constexpr int kPieceBytes = 64 * 64 * 2;
  static constexpr int kAPieces = kABytes / kPieceBytes;
  static constexpr int kPiecesPerStage = (kABytes + kWBytes) / kPieceBytes;
  static constexpr int kChunksPerSlab = kWgCols / 64;
  // Chunk buffers per consumer for the epilogue's staging: the whole slab, or fewer (the slab staged
  // in batches, so that a fourth stage fits).
  static constexpr int kStagedChunks = kStagedChunks_ > 0 ? kStagedChunks_ : kChunksPerSlab;
  static_assert(kChunksPerSlab % kStagedChunks == 0, "a slab is staged in equal batches");

  using OpSync = OpSync_;
  using Storage = SharedStorage<kBlockM, kBlockN, kStages, kStagedChunks, kConsumers, kDType, OpSync>;

  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(kBlockM == 64 || kBlockM == 128, "tiles are one or two 64-row slabs");
  static_assert(kWgCols == 64 || kWgCols == 128 || kWgCols == 192 || kWgCols == 256,
                "a consumer issues m64n{64,128,192,256} WGMMAs");
  static_assert(kABytes % kPieceBytes == 0 && kWBytes % kPieceBytes == 0, "a stage holds whole pieces");
  static_assert(!kBlockScaled ||
                    (kPromoted && kBlockK == kScaleBlock && (kWgCols == kScaleBlock || kWgCols == 192) && kWgAlongN == 1),
                "blockwise scales: promoted stages of one scale block, a slab over one or two blocks of W's scales");
};

template <class Config>
using StorageOf = typename Config::Storage;

// A consumer's chunk buffers (gemm/shared_storage.h).
using ChunkBuffer = uint16_t[kChunkElems];

// The roles of a CTA's threads, as CUTLASS names its warp-group roles. Warpgroup 0 is the
// producer warpgroup: one thread of each of its warps works, in Role's order: the producer (the TMA
// loads of the ring), and the epilogue's sender, watcher and copier where the epilogue has them
// (run_persistent); its other threads idle. Every thread of warpgroup w >= 1 is a consumer, of slab
// w - 1.
enum class Role { kProducer, kSender, kWatcher, kCopier, kConsumer };

// The one place that maps threads (threadIdx.x) to roles: the thread of each role of the producer
// warpgroup (lane 0 of its warp 0, 1, 2, 3), and the warpgroup of a thread, whose consumers are
// warpgroups 1 and up.
template <Role kRole>
inline constexpr uint32_t kRoleThread = 32 * uint32_t(kRole);
static_assert(kRoleThread<Role::kCopier> < 128, "the producer warpgroup's roles");
__device__ __forceinline__ int warpgroup_of(uint32_t thread) { return thread / 128; }
inline constexpr int kProducerWarpgroup = 0;

// Synchronizes the 128 threads of consumer warpgroup `consumer` (named barrier 1 + consumer; 0 is
// the CTA's).
__device__ __forceinline__ void consumer_sync(int consumer) { ptx::named_barrier_sync(1 + consumer, 128); }

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

// Piece q of a stage used as an extra stage (8 KB, 1024-byte aligned): a chunk of BF16, whatever the
// inputs' dtype.
template <class Config>
__device__ __forceinline__ uint16_t* stage_piece(StorageOf<Config>& smem, int stage, int q) {
  constexpr int kPieceElems = Config::kPieceBytes / Config::kInputBytes;  // of the stage's elements
  return reinterpret_cast<uint16_t*>(q < Config::kAPieces ? smem.a[stage] + q * kPieceElems
                                                          : smem.w[stage] + (q - Config::kAPieces) * kPieceElems);
}

template <class Schedule>
struct MainloopParams {
  CUtensorMap a;       // m x k_per_rank, K-major, box kBlockK x kBlockM
  CUtensorMap a_last;  // the same, box kBlockK x the rows of the last row tile (launch.cuh)
  CUtensorMap w;       // K-major: box kBlockK x kBlockN / 2; MN-major: box 64 x kBlockK
  Schedule schedule;
  int num_k_blocks;
  int a_last_row;      // tiles from this row on load A through a_last
  int a_last_bytes;    // what a stage's load through a_last brings
  // E4M3 inputs' scales (tpfuse::Scaling), FP32: A row i's is a_scale[i * a_scale_step], output
  // column j's w_scale[j * w_scale_step] (step 0: one for the tensor). Rows from scale_rows on and
  // columns from scale_cols on are never stored and read none. Blockwise (k_scale_blocks > 0, the
  // scales of a row): A row i's over K block b is a_scale[i * k_scale_blocks + b], W's for output
  // columns [128 c, 128 c + 128) w_scale[c * k_scale_blocks + b].
  const float* a_scale;
  const float* w_scale;
  int a_scale_step;
  int w_scale_step;
  int scale_rows;
  int scale_cols;
  int k_scale_blocks;
};

// The dynamic shared memory, aligned to 1024 bytes (swizzled TMA tiles need it; launches reserve the slack).
template <class Config>
__device__ __forceinline__ StorageOf<Config>& aligned_shared_storage() {
  extern __shared__ uint8_t smem_raw[];
  return *reinterpret_cast<StorageOf<Config>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// Where a tile's rows of A are loaded from: a tensor map and the coordinates of its first row (for a
// layered map, core/tensor_map.h, its layer and parity too). The plain GEMM and the
// reduce-scatter load A_r itself, the mainloop's map; an op whose A arrives from peers chooses the
// map, and waits for the rows first.
struct ALoad {
  const CUtensorMap* map;
  int row;
  int layer;
  int parity;
  int bytes;  // what a stage's load brings
  // A layered map's tile may also come in two 64-row halves from two maps (each with 64-row boxes):
  // the lower one from here when lower_map is set.
  const CUtensorMap* lower_map = nullptr;
  int lower_row = 0;
  int lower_layer = 0;
  int lower_parity = 0;
};

// What an epilogue does not define itself (it derives from this): no helper threads, A from the
// mainloop's own map, no barriers of its own, nothing before or during a tile's K loop, no extra
// stages.
struct EpilogueBase {
  static constexpr bool kHasSender = false;
  static constexpr bool kHasWatcher = false;
  static constexpr bool kHasCopier = false;
  static constexpr bool kLayeredA = false;
  // E4M3 inputs: whether a tile's A rows arrive from peers (then a_load waits for them, which only
  // the producer may, and the epilogue says where their scales are: scale_row, a_scale).
  static constexpr bool kAFromPeers = false;

  template <class Config, class Params, class Mainloop>
  __device__ static ALoad a_load(const Params&, const Mainloop& mainloop, const Tile& tile) {
    if (tile.row_begin >= mainloop.a_last_row) return {&mainloop.a_last, tile.row_begin, 0, 0, mainloop.a_last_bytes};
    return {&mainloop.a, tile.row_begin, 0, 0, Config::kABytes};
  }
  template <class Config, class Storage>
  __device__ static void init(Storage&) {}
  template <class Config>
  __device__ void begin_tile(const Tile&, const KSlice&) {}
  template <class Config, class Acc, class Storage>
  __device__ void after_k_block(int, Acc&, Storage&) {}
  template <class Config, class Params, class Storage>
  __device__ static void produce_extra_stages(const Params&, const Tile&, const KSlice&, Storage&, StageCursor&,
                                              uint32_t&) {}
  // E4M3 inputs: A row `row`'s scale (rows as a_load counts them), MainloopParams' own.
  template <class Mainloop>
  __device__ float a_scale(const Mainloop& m, int row) const {
    return row < m.scale_rows ? __ldg(m.a_scale + row * m.a_scale_step) : 0.0f;
  }
  // Blockwise: A row `row`'s scales (one a K block) as the K loop reads them, found once a tile (the
  // loop's asm clobbers memory: what it reads from the parameters is read, and worked out, again at
  // every block). Here an offset into MainloopParams' scales, -1 past the last row (scales 0): one
  // register a row beside the promoted tile's two sets.
  template <class Mainloop>
  __device__ int a_block_scales(const Mainloop& m, int row) const {
    return row < m.scale_rows ? row * m.k_scale_blocks : -1;
  }
  template <class Mainloop>
  __device__ float a_block_scale(const Mainloop& m, int scales, int k_block) const {
    return scales < 0 ? 0.0f : __ldg(m.a_scale + scales + k_block);
  }
};

// Calls fn(step, tile) for each step of CTA `cta`, in the order the producer and the consumers take them.
template <class Schedule, class Fn>
__device__ __forceinline__ void for_each_step(const Schedule& schedule, int cta, int num_ctas, Fn&& fn) {
  const int num_tiles = schedule.num_tiles();
  for (CtaSteps steps(cta, num_ctas); steps.step() < num_tiles; steps.next()) fn(steps.step(), schedule.tile(steps.step()));
}

namespace gmma = cute::SM90::GMMA;

// The m64nNkK WGMMA atom for inputs of a dtype, both operands in shared memory, for each N the
// kernels issue: BF16's k16 ones, and E4M3's k32 ones for the widths its variants take.
template <DType kDType, int N, gmma::Major A, gmma::Major B>
struct WgmmaAtom;
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 8, A, B> { using Op = gmma::MMA_64x8x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 16, A, B> { using Op = gmma::MMA_64x16x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 32, A, B> { using Op = gmma::MMA_64x32x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 64, A, B> { using Op = gmma::MMA_64x64x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 128, A, B> { using Op = gmma::MMA_64x128x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 192, A, B> { using Op = gmma::MMA_64x192x16_F32BF16BF16_SS<A, B>; };
template <gmma::Major A, gmma::Major B>
struct WgmmaAtom<DType::kBF16, 256, A, B> { using Op = gmma::MMA_64x256x16_F32BF16BF16_SS<A, B>; };
// E4M3's k32 atoms read both operands K-major (TN).
template <>
struct WgmmaAtom<DType::kE4M3, 128, gmma::Major::K, gmma::Major::K> { using Op = gmma::MMA_64x128x32_F32E4M3E4M3_SS_TN<>; };
template <>
struct WgmmaAtom<DType::kE4M3, 192, gmma::Major::K, gmma::Major::K> { using Op = gmma::MMA_64x192x32_F32E4M3E4M3_SS_TN<>; };
template <>
struct WgmmaAtom<DType::kE4M3, 256, gmma::Major::K, gmma::Major::K> { using Op = gmma::MMA_64x256x32_F32E4M3E4M3_SS_TN<>; };

// One m64nNkK WGMMA on inputs of kDType, both operands from shared memory (each K- or MN-major),
// accumulating into `acc` (N/2 floats a thread). Its K is 32 bytes of each row: 16 BF16, 32 E4M3.
template <DType kDType, int N, gmma::Major kMajorA, gmma::Major kMajorB>
struct WgmmaSS {
  using Op = typename WgmmaAtom<kDType, N, kMajorA, kMajorB>::Op;
  static constexpr int kK = 32 / element_bytes(kDType);

  template <size_t... I>
  __device__ __forceinline__ static void call(uint64_t desc_a, uint64_t desc_b, float* acc, bool accumulate,
                                              std::index_sequence<I...>) {
    Op::fma(desc_a, desc_b, acc[I]..., accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero);
  }
  __device__ __forceinline__ static void mma(uint64_t desc_a, uint64_t desc_b, float* acc, bool accumulate) {
    call(desc_a, desc_b, acc, accumulate, std::make_index_sequence<N / 2>{});
  }
};

// W's major-ness as stored: K-major (N x K) or MN-major (K x N).
template <bool kWeightKMajor>
inline constexpr gmma::Major kMajorW = kWeightKMajor ? gmma::Major::K : gmma::Major::MN;

// The tiled kernel's WGMMA: A (K-major) by W.
template <DType kDType, int N, bool kWeightKMajor>
using Wgmma = WgmmaSS<kDType, N, gmma::Major::K, kMajorW<kWeightKMajor>>;

// Where a consumer's 64-row slab sits inside the tile.
template <class Config>
struct Slab {
  int row;  // first row within the tile
  int col;  // first column within the tile
  __device__ static Slab of_consumer(int consumer) {
    return {(consumer % Config::kWgAlongM) * Config::kWgRows, (consumer / Config::kWgAlongM) * Config::kWgCols};
  }
};

// The producer thread: each step's K stages (its tile's, or its slice of them), then the
// epilogue's extra stages of the tile, if any.
template <class Config, class Epilogue, class Schedule>
__device__ __forceinline__ void produce(const MainloopParams<Schedule>& p, const typename Epilogue::Params& epilogue,
                                        StorageOf<Config>& smem, int cta, int num_ctas) {
  StageCursor ring;
  uint32_t extra_phase = 0;  // the epilogue's, across tiles
  for_each_step(p.schedule, cta, num_ctas, [&](int step, const Tile& tile) {
    const ALoad a = Epilogue::template a_load<Config>(epilogue, p, tile);
    const KSlice k_slice = k_slice_of(p.schedule, step, p.num_k_blocks);  // registers: the loop's asm clobbers memory
    for (int kb = 0; kb < k_slice.num_k_blocks; ++kb) {
      const int stage = ring.stage;
      ptx::mbarrier_wait(&smem.ring.empty[stage], ring.phase ^ 1);
      if (kb == 0) smem.ring.stage_tile[stage] = tile;  // published by the arrive below (a release)
      uint64_t* full = &smem.ring.full[stage];
      ptx::mbarrier_arrive_expect_tx(full, a.bytes + Config::kWBytes);
      const int k = (k_slice.k_block_begin + kb) * Config::kBlockK;
      if constexpr (Epilogue::kLayeredA) {
        ptx::tma_load_4d(smem.a[stage], a.map, full, k, a.row, a.layer, a.parity);
        if (a.lower_map != nullptr) {
          ptx::tma_load_4d(smem.a[stage] + kSlabRows * Config::kBlockK, a.lower_map, full, k, a.lower_row,
                           a.lower_layer, a.lower_parity);
        }
      } else {
        ptx::tma_load_2d(smem.a[stage], a.map, full, k, a.row);
      }
#pragma unroll
      for (int piece = 0; piece < Config::kWPieces; ++piece) {
        typename Config::Element* dst = smem.w[stage] + piece * Config::kWPieceElems;
        const int x = Config::kWeightKMajor ? k : tile.col_begin + piece * 64;
        const int y = Config::kWeightKMajor ? tile.col_begin + piece * (Config::kBlockN / 2) : k;
        ptx::tma_load_2d(dst, &p.w, full, x, y);
      }
      ring.advance<Config>();
    }
    Epilogue::template produce_extra_stages<Config>(epilogue, tile, k_slice, smem, ring, extra_phase);
  });
}

// Hands a stage back to the producer.
template <class Config>
__device__ __forceinline__ void release_stage(StorageOf<Config>& smem, int stage) {
  if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(&smem.ring.empty[stage]);
}

// The WGMMAs of one K block (a stage) of a slab, accumulating into `acc` (on the previous sums where
// `accumulate`), committed as one batch.
template <class Config>
__device__ __forceinline__ void issue_k_block(StorageOf<Config>& smem, int stage, Slab<Config> slab, float* acc,
                                              bool accumulate) {
  using Mma = Wgmma<Config::kDType, Config::kWgCols, Config::kWeightKMajor>;
  // Descriptor steps (16-byte units) for one WGMMA's K: its 32 bytes along a K-major row, its rows of
  // an MN-major chunk (128 bytes each).
  constexpr uint64_t kStepA = (Mma::kK * Config::kInputBytes) >> 4;
  constexpr uint64_t kStepW = Config::kWeightKMajor ? kStepA : ((Mma::kK * 128) >> 4);
  // Offset of the slab's columns inside a W stage, in elements (the same for both layouts: kWgCols
  // rows, or kWgCols / 64 chunks, of kBlockK elements each).
  const int w_offset_elems = slab.col * Config::kBlockK;
  const uint64_t desc_a = ptx::smem_desc_k_major_sw128(smem.a[stage] + slab.row * Config::kBlockK);
  const uint64_t desc_w = Config::kWeightKMajor
                              ? ptx::smem_desc_k_major_sw128(smem.w[stage] + w_offset_elems)
                              : ptx::smem_desc_mn_major_sw128(smem.w[stage] + w_offset_elems, Config::kWChunkBytes);
#pragma unroll
  for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < Config::kBlockK / Mma::kK; ++kk) {
    Mma::mma(desc_a + kk * kStepA, desc_w + kk * kStepW, acc, accumulate || kk > 0);
  }
  cute::warpgroup_commit_batch();
}

// Accumulates one step's slab over its num_k_blocks K blocks. `ring` carries the position across
// steps. After each K block the epilogue may add inputs of its own (Epilogue::after_k_block).
template <class Config, class Epilogue>
__device__ __forceinline__ void consume_tile(int num_k_blocks, StorageOf<Config>& smem, Slab<Config> slab,
                                             float (&acc)[Config::kAccPerThread], StageCursor& ring,
                                             Epilogue& epilogue) {
  int prev_stage = -1;
  for (int kb = 0; kb < num_k_blocks; ++kb) {
    const int stage = ring.stage;
    ptx::mbarrier_wait(&smem.ring.full[stage], ring.phase);
    issue_k_block<Config>(smem, stage, slab, acc, kb > 0);
    // Keep one batch in flight; the one before it is done, so its stage goes back to the producer.
    cute::warpgroup_wait<1>();
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
    if (prev_stage >= 0) release_stage<Config>(smem, prev_stage);
    prev_stage = stage;
    ring.advance<Config>();
    epilogue.template after_k_block<Config>(kb, acc, smem);
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
  if (prev_stage >= 0) release_stage<Config>(smem, prev_stage);
}

// Blockwise: adds a K block's sums times their scales into `acc`, the first kFirstGroups 8-column
// groups of the accumulator layout (element i's is i / 4) by `first`'s scales, the others by
// `second`'s; each a pair for the thread's two rows (element i's row is 8 * ((i / 2) % 2) past its
// first, scale_slab).
template <int kFirstGroups, int kAcc>
__device__ __forceinline__ void add_block_scaled(float (&acc)[kAcc], const float (&sum)[kAcc], const float (&first)[2],
                                                 const float (&second)[2]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = fmaf(sum[i], (i / 4 < kFirstGroups ? first : second)[(i / 2) % 2], acc[i]);
}

// The same, promoted (Config::kPromoted): the tensor cores' E4M3 sums keep fewer bits than FP32, so
// each K block (128 of K) sums into a set of its own, added into `acc` in FP32 once it is done (its
// stage is then released at once). While a block's WGMMAs run, the consumer waits for the next
// block's stage and loads its scales: between two blocks' WGMMAs lies only the addition. Two sets
// taken in turn, one block in flight while the other is added, and the two consumers issuing their
// blocks in turn, measured no faster (docs/EXPERIMENTS.md).
// Blockwise (Config::kBlockScaled), a block's sums are multiplied by its scales as they are added:
// A's of the thread's two rows (the slab's rows are A's from `a_row` on) times W's of the slab's
// columns (from `col` on: one block of W's scales, or, 192 wide, the one its first columns are in and
// the next), each the product of the two in FP32. A block's scales are loaded once its stage is full
// (an op whose A arrives from peers has its scales landed then).
template <class Config, class Schedule, class Epilogue>
__device__ __forceinline__ void consume_tile_promoted(const MainloopParams<Schedule>& p, const KSlice& k_slice,
                                                      int a_row, int col, StorageOf<Config>& smem, Slab<Config> slab,
                                                      float (&acc)[Config::kAccPerThread], StageCursor& ring,
                                                      Epilogue& epilogue) {
  float block_sum[Config::kAccPerThread];
  const int row = a_row + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;  // and row + 8
  decltype(epilogue.a_block_scales(p, row)) a_scales[2] = {};
  if constexpr (Config::kBlockScaled) {
#pragma unroll
    for (int h = 0; h < 2; ++h) a_scales[h] = epilogue.a_block_scales(p, row + 8 * h);
  }
  // A slab 192 wide starts 0 or 64 columns into a block of W's scales; a next block past the last
  // column is never stored and reads the first's.
  const int w_block = col / int(kScaleBlock);
  const float* w_first = p.w_scale + w_block * p.k_scale_blocks;
  const float* w_second = (w_block + 1) * int(kScaleBlock) < p.scale_cols ? w_first + p.k_scale_blocks : w_first;
  // K block kb's scales: of the thread's rows (a), of the slab's blocks (w).
  struct BlockScales {
    float a[2];
    float w[2];
  };
  auto load_scales = [&](int kb) {
    BlockScales s = {};
    if constexpr (Config::kBlockScaled) {
      const int k_block = k_slice.k_block_begin + kb;
      s.w[0] = __ldg(w_first + k_block);
      s.w[1] = Config::kWgCols > int(kScaleBlock) ? __ldg(w_second + k_block) : s.w[0];
#pragma unroll
      for (int h = 0; h < 2; ++h) s.a[h] = epilogue.a_block_scale(p, a_scales[h], k_block);
    }
    return s;
  };
  // From +0: a tile whose blocks all have zero scales gives +0, as the exact sum has it; and every
  // block is added alike (no select at the first one).
#pragma unroll
  for (int i = 0; i < Config::kAccPerThread; ++i) acc[i] = 0.0f;
  ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
  BlockScales next = load_scales(0);
  for (int kb = 0; kb < k_slice.num_k_blocks; ++kb) {
    const int stage = ring.stage;
    issue_k_block<Config>(smem, stage, slab, block_sum, false);
    const BlockScales scales = next;
    ring.advance<Config>();
    if (kb + 1 < k_slice.num_k_blocks) {
      ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
      next = load_scales(kb + 1);
    }
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(block_sum[i]);
    release_stage<Config>(smem, stage);
    if constexpr (Config::kBlockScaled) {
      const float first[2] = {scales.a[0] * scales.w[0], scales.a[1] * scales.w[0]};
      if constexpr (Config::kWgCols == int(kScaleBlock)) {
        add_block_scaled<Config::kAccPerThread / 4>(acc, block_sum, first, first);
      } else {
        const float second[2] = {scales.a[0] * scales.w[1], scales.a[1] * scales.w[1]};
        if (col % int(kScaleBlock) == 0) {
          add_block_scaled<int(kScaleBlock) / 8>(acc, block_sum, first, second);
        } else {
          add_block_scaled<int(kScaleBlock) / 16>(acc, block_sum, first, second);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < Config::kAccPerThread; ++i) acc[i] += block_sum[i];
    }
    epilogue.template after_k_block<Config>(kb, acc, smem);
  }
}

// Brings a slab's scales into L1 while its K loop runs, so that scale_slab's loads after it hit there:
// the lines of the slab's 64 rows of A's and kWgCols columns of W's, a thread of the warpgroup each.
// A's scales of rows that arrive from peers are not prefetched: their lines may not have landed yet.
template <class Config, bool kPrefetchA, class Schedule>
__device__ __forceinline__ void prefetch_scales(const MainloopParams<Schedule>& p, int a_row, int col) {
  constexpr int kPerLine = 128 / sizeof(float);
  constexpr int kALines = kPrefetchA ? Config::kWgRows / kPerLine : 0, kWLines = Config::kWgCols / kPerLine;
  static_assert(kALines + kWLines <= 128, "a line a thread");
  const int t = threadIdx.x % 128;
  if (t < kALines) {
    const int row = a_row + t * kPerLine;
    if (row < p.scale_rows) ptx::prefetch_l1(p.a_scale + row * p.a_scale_step);
  } else if (t < kALines + kWLines) {
    const int c = col + (t - kALines) * kPerLine;
    if (c < p.scale_cols) ptx::prefetch_l1(p.w_scale + c * p.w_scale_step);
  }
}

// Multiplies this thread's accumulators of a slab by their scales (E4M3 inputs: A's rows' from the
// epilogue's a_scale, W's columns' from MainloopParams), in FP32: the slab's rows are A's from `a_row`
// on, its columns the output's from `col` on. The accumulator layout is the WGMMA's
// (gemm/slab_store.cuh): element 4b + 2h + e is row 16 * warp + lane / 4 + 8h, column
// 8b + 2 * (lane % 4) + e.
template <class Config, class Schedule, class Epilogue>
__device__ __forceinline__ void scale_slab(const MainloopParams<Schedule>& p, const Epilogue& epilogue, int a_row,
                                           int col, float (&acc)[Config::kAccPerThread]) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  float row_scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) row_scale[h] = epilogue.a_scale(p, a_row + 16 * warp + lane / 4 + 8 * h);
  const int lane_col = col + 2 * (lane % 4);
#pragma unroll
  for (int b = 0; b < Config::kAccPerThread / 4; ++b) {
    const int c = lane_col + 8 * b;  // even, and n a multiple of 8: c + 1 < n where c < n
    if (c < p.scale_cols) {
      const float col_scale[2] = {__ldg(p.w_scale + c * p.w_scale_step), __ldg(p.w_scale + (c + 1) * p.w_scale_step)};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) acc[4 * b + 2 * h + e] *= row_scale[h] * col_scale[e];
      }
    }
  }
}

// The persistent body shared by every kernel: CTA `cta` of `num_ctas` walks its steps of the
// schedule, one per wave. The epilogue is an object per consumer warpgroup:
//   Epilogue(params, consumer, smem);
//   begin_tile<Config>(tile, k_slice) before each step's K stages (k_slice: which of the tile's K
//             blocks they are), and after_k_block<Config>(kb, acc, smem) after each of them (both
//             may do nothing);
//   end_tile<Config>(tile, slab, acc, smem, ring) after each tile's K stages: its extra stages, if
//             any, and the store of the slab, in the order the epilogue needs;
//   finish() at the end;
// and, on the producer thread, Epilogue::a_load<Config>(params, mainloop, tile) before each tile's K
// stages (where its A rows come from: ALoad; a layered 4D map with Epilogue::kLayeredA), and
// Epilogue::produce_extra_stages<Config>(params, tile, k_slice, smem, ring, extra_phase) after them (both
// sides must agree on the number of extra stages; extra_phase is the epilogue's to keep across tiles).
// More threads of the producer warpgroup may help the epilogue (their Role):
//   with Epilogue::kHasSender, the sender runs Epilogue::send<Config>(params, schedule, smem, cta,
//   num_ctas): it takes every consumer's staged slab of every step, so that the consumers go back
//   to multiplying while the slab goes out;
//   with Epilogue::kHasWatcher, the watcher runs Epilogue::watch<Config>(params, schedule, smem, cta,
//   num_ctas): it waits for the inputs of the tiles with extra stages ahead of the producer;
//   with Epilogue::kHasCopier, the copier runs Epilogue::copy<Config>(params, smem, cta, num_ctas):
//   data the op moves by bulk copies while the tiles multiply.
// Epilogue::init<Config>(smem) initializes the op's barriers (the producer, before the CTA's barrier).
// Every thread of the CTA returns from here (none exits early), so callers may synchronize after it.
template <class Config, class Epilogue, class Schedule>
__device__ __forceinline__ void run_persistent(const MainloopParams<Schedule>& mainloop,
                                               const typename Epilogue::Params& epilogue_params,
                                               StorageOf<Config>& smem, int cta, int num_ctas) {
  const int warpgroup = warpgroup_of(threadIdx.x);
  if (threadIdx.x == kRoleThread<Role::kProducer>) {
    ptx::prefetch_tensor_map(&mainloop.a);
    ptx::prefetch_tensor_map(&mainloop.a_last);
    ptx::prefetch_tensor_map(&mainloop.w);
    for (int s = 0; s < Config::kStages; ++s) {
      ptx::mbarrier_init(&smem.ring.full[s], 1);
      ptx::mbarrier_init(&smem.ring.empty[s], Config::kConsumers);
    }
    Epilogue::template init<Config>(smem);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == kProducerWarpgroup) {
    ptx::setmaxnreg_dec<Config::kProducerRegs>();
    if (threadIdx.x == kRoleThread<Role::kProducer>) {
      produce<Config, Epilogue>(mainloop, epilogue_params, smem, cta, num_ctas);
    }
    if constexpr (Epilogue::kHasSender) {
      if (threadIdx.x == kRoleThread<Role::kSender>) {
        Epilogue::template send<Config>(epilogue_params, mainloop.schedule, smem, cta, num_ctas);
      }
    }
    if constexpr (Epilogue::kHasWatcher) {
      if (threadIdx.x == kRoleThread<Role::kWatcher>) {
        Epilogue::template watch<Config>(epilogue_params, mainloop.schedule, smem, cta, num_ctas);
      }
    }
    if constexpr (Epilogue::kHasCopier) {
      if (threadIdx.x == kRoleThread<Role::kCopier>) {
        Epilogue::template copy<Config>(epilogue_params, smem, cta, num_ctas);
      }
    }
  } else {
    ptx::setmaxnreg_inc<Config::kConsumerRegs>();
    const int consumer = warpgroup - 1;  // Role::kConsumer
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer);
    Epilogue epilogue(epilogue_params, consumer, smem);
    float acc[Config::kAccPerThread];
    StageCursor ring;
    const int num_tiles = mainloop.schedule.num_tiles();
    const int num_k_blocks = mainloop.num_k_blocks;  // a register: the loop's asm clobbers memory
    for (CtaSteps steps(cta, num_ctas); steps.step() < num_tiles; steps.next()) {
      // The ring is at the step's first K stage, which carries the step's tile.
      ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
      const Tile tile = smem.ring.stage_tile[ring.stage];
      // Every thread of the warpgroup has read the tile before its first thread may release the
      // stage (and the producer write the note of a later step there).
      consumer_sync(consumer);
      const KSlice k_slice = k_slice_of(mainloop.schedule, steps.step(), num_k_blocks);
      epilogue.template begin_tile<Config>(tile, k_slice);
      // E4M3: this rank's product is scaled before the epilogue adds anything to it (the bias, peers'
      // partials); the slab's rows of A are where the producer loads them from.
      int a_row = 0;
      if constexpr (Config::kScaled) {
        if constexpr (Epilogue::kAFromPeers) {
          a_row = epilogue.scale_row(tile);
        } else {
          a_row = Epilogue::template a_load<Config>(epilogue_params, mainloop, tile).row;
        }
        // (Blockwise scales are loaded as each K block starts instead: consume_tile_promoted.)
        if constexpr (!Config::kBlockScaled) {
          prefetch_scales<Config, !Epilogue::kAFromPeers>(mainloop, a_row + slab.row, tile.col_begin + slab.col);
        }
      }
      if constexpr (Config::kPromoted) {
        consume_tile_promoted<Config>(mainloop, k_slice, a_row + slab.row, tile.col_begin + slab.col, smem, slab, acc,
                                      ring, epilogue);
      } else {
        consume_tile<Config>(k_slice.num_k_blocks, smem, slab, acc, ring, epilogue);
      }
      if constexpr (Config::kScaled && !Config::kBlockScaled) {
        scale_slab<Config>(mainloop, epilogue, a_row + slab.row, tile.col_begin + slab.col, acc);
      }
      epilogue.template end_tile<Config>(tile, slab, acc, smem, ring);
    }
    epilogue.finish();
  }
}

}  // namespace tpfuse::kernels
