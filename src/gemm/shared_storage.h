// A kernel's shared memory, composed from the parts that use it: the mainloop's ring of stages and
// its barriers, the epilogue's chunk buffers (every epilogue stages its slabs there), and an op's
// own barriers (none for the plain GEMM). Pure C++, so that the config choice and the CPU tests
// take the same sizeof the kernels use. The stages hold input elements of the variant's dtype as their
// raw bits (ElementBits), kStageRowBytes of each row whatever the dtype; the chunk buffers hold BF16
// outputs as theirs (uint16_t).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "gemm/tile.h"
#include "gemm/variants.h"

namespace tpfuse {

// Epilogue staging: a consumer stages its slab one 64 x 64 chunk per buffer.
constexpr int kChunkRows = 64;
constexpr int kChunkCols = 64;
constexpr int kChunkElems = kChunkRows * kChunkCols;

// The ring's barriers, and each stage's note of the tile its step computes (left by the producer
// with a step's first K stage: the consumers need not compute the schedule themselves).
template <int kStages>
struct RingSync {
  uint64_t full[kStages];   // TMA bytes of a stage have landed
  uint64_t empty[kStages];  // every consumer is done reading a stage
  Tile stage_tile[kStages];
};

// An op without barriers of its own: the plain GEMM, which takes every variant.
struct NoOpSync {
  static constexpr bool takes(const GemmVariant&) { return true; }
};

// NOTE: the arrays come first, each a multiple of 1024 bytes, so that every stage and chunk buffer
// stays 1024-byte aligned (128-byte-swizzled TMA boxes need it); the barriers follow.
template <int kBlockM, int kBlockN, int kStages, int kStagedChunks, int kNumConsumers, DType kDType, class OpSync>
struct alignas(1024) SharedStorage {
  using Element = ElementBits<kDType>;
  Element a[kStages][kBlockM * kStageRowBytes / sizeof(Element)];
  Element w[kStages][kBlockN * kStageRowBytes / sizeof(Element)];
  uint16_t chunks[kNumConsumers][kStagedChunks][kChunkElems];
  RingSync<kStages> ring;
  OpSync op;
};
static_assert(kStageRowBytes * 64 % 1024 == 0 && kChunkElems * 2 % 1024 == 0,
              "stages and chunk buffers are whole multiples of 1024 bytes");

// Chunk buffers of a variant: staged_chunks, or a whole slab (its 64-column chunks).
constexpr int staged_chunks_of(const GemmVariant& v) {
  return v.staged_chunks > 0 ? v.staged_chunks : slab_cols_of(v) / kChunkCols;
}

// Dynamic shared memory a launch of variant kVariants[I] with `OpSync` asks for: the storage and
// 1024 bytes of slack to align the dynamic shared memory base.
template <int I, class OpSync>
constexpr size_t launch_smem_bytes() {
  constexpr GemmVariant v = kGemmVariants[I];
  return sizeof(SharedStorage<v.block_m, v.block_n, v.stages, staged_chunks_of(v), v.consumers, v.dtype, OpSync>) +
         1024;
}

template <class OpSync, size_t... I>
constexpr std::array<size_t, kNumGemmVariants> smem_table(std::index_sequence<I...>) {
  return {launch_smem_bytes<int(I), OpSync>()...};
}

// The same for every variant, by its index in kGemmVariants.
template <class OpSync>
constexpr std::array<size_t, kNumGemmVariants> smem_bytes_by_variant() {
  return smem_table<OpSync>(std::make_index_sequence<kNumGemmVariants>{});
}

}  // namespace tpfuse
