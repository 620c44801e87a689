// The reduce-scatter's epilogue for tiles of several owners' rows (one band of all segments:
// decode-sized M, ops/gemm_rs/schedule.h) where that band is one slab of rows, M <= 64 (the
// config's register_epilogue). Such tiles are few and all of them finish in the call's one wave, so
// what a slab waits for after its K loop is latency, not bandwidth: the consumer warpgroup moves it
// itself, from its registers, without staging it in shared memory and without the sender, the
// watcher or extra stages of the ring (ops/gemm_rs/epilogue.cuh); so it also runs on the tiles of
// one consumer. On taller bands the staged epilogue's partials, streamed through the ring by the
// producer, measured faster: here a thread loads its own rows' partials itself, and only the warps
// holding them do (docs/EXPERIMENTS.md). The protocol is the staged epilogue's
// (ops/gemm_rs/protocol.cuh: the parameters, the receive buffers and flags, the slabs' owners).
//
//   split K   the split that counts in last holds the sum of the tile's S partials, added in split
//             order (gemm/split_k_epilogue.cuh); the others are done
//   poll      lane 0 of each warp holding this rank's rows loads the slab's flag from every peer
//             once, so that the loads are in flight during the push (looked at after it)
//   push      each thread stores its rows of other owners as BF16 straight into each owner's
//             receive slot, recv[parity][this rank][row][col] (ops/gemm_rs/protocol.cuh's layout;
//             where, looked up before the K loop), 16 bytes a lane; the warpgroup's barrier; then
//             one warp that holds none of this rank's rows fences (release, system scope) and
//             raises the slab's flag at each of those owners, a lane an owner
//   reduce    in each warp holding this rank's rows, while that release runs: its lane 0 waits
//             (bounded, polling again) until it has seen the slab's flag from every peer and
//             fences (acquire, system scope); the warp's barrier; each thread adds its own rows'
//             partials, loaded from this rank's receive slots, to its FP32 accumulators in rank
//             order, rounds once and stores the rows into the output (16 bytes a lane, as the push)
//
// Every rank pushes before it waits (its first poll only looks): the ranks compute every tile at
// the same step, so each waits for the others' pushes of the same tile. The partials and the order
// of the additions are those of the staged epilogue, so a call is bit-reproducible and equal to
// tiles of one owner's rows with the same split of K.
#pragma once

#include "comm/device.cuh"
#include "gemm/slab_store.cuh"
#include "gemm/split_k_epilogue.cuh"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/push_timeline.h"

namespace tpfuse::kernels {

// kRecordsPushes: the testing library's instantiation, which records its pushes in the params'
// timeline (push_timeline.h); the library's records none.
template <bool kRecordsPushes>
class SharedTileEpilogue : public EpilogueBase {
 public:
  using Params = PushReduceParams;
  static constexpr bool kRecordsTimeline = kRecordsPushes;

  template <class Storage>
  __device__ SharedTileEpilogue(const Params& params, int consumer, Storage& smem)
      : p_(params),
        consumer_(consumer),
        slabs_(consumer, smem.chunks[consumer]),
        // The chunk buffers are free in this epilogue: each warp's rows to spread take a part.
        spread_(reinterpret_cast<float*>(smem.chunks[consumer][0]) + kSpreadFloats * (threadIdx.x % 128 / 32)),
        epoch_(comm::call_epoch(params.calls)) {}

  template <class Config>
  __device__ void begin_tile(const Tile& tile, const KSlice& k_slice) {
    k_slice_ = k_slice;
    // Where this thread's pushed rows and this lane's flag go, looked up before the K loop: each
    // lane indexes the owners' pointers among the parameters by its own owner (constant-bank loads
    // that diverge within the warp), which on the epilogue's path cost a round trip.
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer_);
    const size_t parity = epoch_ & 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tile_row = slab.row + thread_row(h);
      const int owner = tile.owner_of_row(tile_row);
      push_rows_[h] = nullptr;
      if (tile.row_begin + tile_row < tile.row_end && owner != p_.rank) {
        const int row = tile.segment_row_for(tile_row, owner);
        push_rows_[h] = p_.recv[owner] + parity * p_.recv_parity_elems + (size_t(p_.rank) * p_.rows_per_rank + row) * p_.n;
      }
    }
    // The slab's flags in this rank's array (source 0's; the others a stride on): their index
    // chains constant-bank loads, which on the poll's path took a round trip per peer.
    own_flag_ = int(parity * p_.flags_parity_words) + flag_index<Config>(p_, 0, tile, consumer_);
    // Only the releasing warp's lanes get a flag (a lane an owner of the slab's rows but this rank).
    const int last_row = tile.row_end - tile.row_begin - 1;
    flag_slot_ = nullptr;
    if (slab.row > last_row) return;
    const SlabOwners owners = PushReduceLayout<Config, true>::slab_owners(tile, slab.row);
    const bool holds_own_rows = owners.first <= p_.rank && p_.rank <= owners.last;
    const int releaser = holds_own_rows ? releasing_warp(tile, slab) : 0;
    const int owner = owners.first + int(threadIdx.x % 32);
    if (int(threadIdx.x % 128) / 32 == releaser && owner <= owners.last && owner != p_.rank) {
      flag_slot_ = flag_at(p_, owner, flag_index<Config>(p_, p_.rank, tile, consumer_), parity);
    }
  }

  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>&, StageCursor&) {
    const int col = tile.col_begin + slab.col;
    // A slab past the tile's rows or its last column holds nothing: neither pushed nor awaited, in
    // any split (its counter stays 0).
    if (tile.row_begin + slab.row >= tile.row_end || col >= tile.col_end) return;
    if (k_slice_.num_splits > 1) {
      const SplitPartials split(p_.split_partials, p_.splits_done, consumer_, k_slice_);
      if (!split.sum_if_last<Config>(acc, tile.row_end - tile.row_begin - slab.row, slabs_)) return;
    }
    // The slab holds rows of the tile: its owners without slab_owners()' clamp to them.
    const int last_row = tile.row_end - tile.row_begin - 1;
    const int first_owner = tile.owner_of_row(slab.row);
    const int last_owner = tile.owner_of_row(min(slab.row + kSlabRows - 1, last_row));
    const bool holds_own_rows = first_owner <= p_.rank && p_.rank <= last_owner;
    bool own[2] = {false, false};
    if (holds_own_rows) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int tile_row = slab.row + thread_row(h);
        own[h] = tile.row_begin + tile_row < tile.row_end && tile.owner_of_row(tile_row) == p_.rank;
      }
    }
    // Lane 0 of each warp holding own rows polls the peers' flags once before the push, so that
    // the loads are in flight while it pushes (their values are looked at after it).
    const bool waits = __any_sync(0xffffffffu, own[0] || own[1]);
    uint32_t seen[kMaxWorldSize];
    if (waits && threadIdx.x % 32 == 0) load_flags(peers(), seen);
    push<Config>(tile, slab, acc);
    if (waits) reduce<Config>(tile, slab, acc, own, seen);
  }

  __device__ void finish() {}

 private:
  // This thread's accumulator rows in the slab (gemm/slab_store.cuh): half h holds row
  // 16 * warp + lane / 4 + 8 h, columns 8 j + 2 (lane % 4) (+1) of each 8-column block j.
  __device__ static int thread_row(int h) {
    const int t = threadIdx.x % 128;
    return kWarpRows * (t / 32) + (t % 32) / 4 + 8 * h;
  }
  static constexpr int kWarpRows = 16;  // a warp's rows of the slab

  // The first warp whose rows of the slab (those within the tile) include none of this rank's, so
  // that its release fence does not hold up the reduction (this rank's rows, at most 32 of a
  // slab's 64, leave two warps free); warp 0 where every warp holds some.
  template <class Config>
  __device__ int releasing_warp(const Tile& tile, Slab<Config> slab) const {
    const int last_row = tile.row_end - tile.row_begin - 1;
    for (int w = 0; w < kSlabRows / kWarpRows; ++w) {
      const int first = slab.row + kWarpRows * w;
      const int last = min(first + kWarpRows - 1, last_row);
      if (first > last || p_.rank < tile.owner_of_row(first) || tile.owner_of_row(last) < p_.rank) return w;
    }
    return 0;
  }

  // Ranks whose pieces of a row (every chunk of the slab) a thread loads at once: 64 registers' worth
  // (32 where the slab's 256 columns of accumulators take 128).
  template <class Config>
  static constexpr int kSourcesInFlight =
      Config::kAccPerThread >= 128 ? 1 : kMaxWorldSize / Config::kChunksPerSlab;

  // The accumulator index of pair (block j of chunk c, half h): its two columns are i and i + 1.
  __device__ static constexpr int pair_index(int c, int j, int h) { return 32 * c + 4 * j + 2 * h; }

  // Within each quad of lanes (one row, four pairs of each 8-column block): lane q holds pair q of
  // blocks 0..3 in v[0..3]; afterwards it holds pairs 0..3 of block q, i.e. 8 adjacent columns.
  // Two exchanges: the off-diagonal pairs of each 2 x 2 block of the quad's 4 x 4, then the
  // off-diagonal 2 x 2 blocks.
  __device__ static void quad_transpose(uint32_t (&v)[4]) {
    const int q = threadIdx.x % 4;
#pragma unroll
    for (int bit = 0; bit < 2; ++bit) {
      const bool upper = (q >> bit) & 1;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int lo = bit == 0 ? 2 * s : s;  // the two indices that differ in `bit`
        const int hi = lo + (1 << bit);
        const uint32_t sent = upper ? v[lo] : v[hi];
        const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, 1 << bit);
        if (upper) {
          v[lo] = got;
        } else {
          v[hi] = got;
        }
      }
    }
  }

  // Rounds row half h of this thread's accumulators to BF16 and, where `store`, stores them into
  // `row` (a row of n columns: the slab's from `col`, those before col_end), 16 bytes a lane. Every
  // lane of the warp takes part: the quads exchange pieces.
  template <class Config>
  __device__ static void store_row_half(const float (&acc)[Config::kAccPerThread], int h, uint16_t* row, int col,
                                        int col_end, bool store) {
    const int q = threadIdx.x % 4;
#pragma unroll
    for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Blocks 4 half .. 4 half + 3 of the chunk, after the exchange lane q's 8 columns of block
        // 4 half + q.
        uint32_t v[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int i = pair_index(c, 4 * half + m, h);
          v[m] = pack_bf16x2(acc[i], acc[i + 1]);
        }
        quad_transpose(v);
        const int block_col = col + kChunkCols * c + 8 * (4 * half + q);
        if (store && block_col < col_end) *reinterpret_cast<uint4*>(row + block_col) = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
  }

  // Stores this thread's rows of other owners into their receive slots; once every thread's
  // stores are ordered before them, the releasing warp (the one whose lanes hold flags, chosen in
  // begin_tile) raises the slab's flag at each of those owners.
  template <class Config>
  __device__ void push(const Tile& tile, Slab<Config> slab, const float (&acc)[Config::kAccPerThread]) {
    const int col = tile.col_begin + slab.col;
    if constexpr (kRecordsPushes) {
      if (threadIdx.x % 128 == 0) record<Config>(tile, slab);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // A row half that no lane of the warp pushes (past the tile's rows, or this rank's) is left.
      const bool pushes = push_rows_[h] != nullptr;
      if (__any_sync(0xffffffffu, pushes)) store_row_half<Config>(acc, h, push_rows_[h], col, tile.col_end, pushes);
    }
    // NOTE: every thread's stores, ordered by the barrier before each releasing lane's fence, then
    // that lane's flag (a peer that sees one acquires the whole slab's rows of it). The warp's lanes
    // fence in one instruction.
    slabs_.sync();
    if (!__any_sync(0xffffffffu, flag_slot_ != nullptr)) return;
    ptx::fence_release_sys();
    if (flag_slot_ != nullptr) raise_flag(flag_slot_, epoch_);
  }

  // The slab's push in the push timeline: its rows of other owners (the first of them named), its
  // columns within the tile.
  template <class Config>
  __device__ void record(const Tile& tile, Slab<Config> slab) const {
    const int rows = min(kSlabRows, tile.row_end - tile.row_begin - slab.row);
    // This rank's rows of the tile: [own_first, own_first + rows_per_owner) in tile rows.
    const int own_first = (p_.rank - tile.owner_rank) * tile.rows_per_owner - tile.segment_row;
    const int own_rows = max(0, min(slab.row + rows, own_first + tile.rows_per_owner) - max(slab.row, own_first));
    const int cols = min(Config::kChunksPerSlab * kChunkCols, tile.col_end - tile.col_begin - slab.col);
    const uint32_t bytes = uint32_t(rows - own_rows) * uint32_t(cols) * sizeof(uint16_t);
    const int first = tile.owner_of_row(slab.row);
    if (bytes > 0) record_push(p_.timeline, ptx::globaltimer_ns(), bytes, first + (first == p_.rank));
  }

  // In a warp holding some of this rank's rows of the slab (own[h]: this thread's half h is one):
  // adds the peers' partials of those rows, in rank order, and stores them. `seen`: its lane 0's
  // first poll of the flags. Where those rows are few (at most kMaxSpreadRows, on slabs of one
  // chunk: 64 columns), their accumulators are spread over the warp's 32 lanes first: else the
  // few lanes holding them would load, add and store alone, one long chain of the warp's
  // instructions (wider slabs have more accumulators to keep and spill).
  template <class Config>
  __device__ void reduce(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread], const bool (&own)[2],
                         uint32_t (&seen)[kMaxWorldSize]) {
    // Its lane 0's acquire, passed on to the warp (with the spread accumulators). After a failed
    // call the sums are wrong and the call reports the timeout.
    const auto acquire = [&] {
      if (threadIdx.x % 32 == 0) wait_for_peers<Config>(tile, slab, seen);
      __syncwarp();
    };
    if constexpr (Config::kChunksPerSlab == 1) {
      const WarpRows rows = own_rows(own);
      if (rows.count <= kMaxSpreadRows) {
        spread<Config>(acc, own, rows);
        acquire();
        if (rows.count == 1) {
          reduce_spread<Config, 1>(tile, slab, rows);
        } else if (rows.count == 2) {
          reduce_spread<Config, 2>(tile, slab, rows);
        } else {
          reduce_spread<Config, kMaxSpreadRows>(tile, slab, rows);
        }
        return;
      }
    }
    acquire();
    reduce_held<Config>(tile, slab, acc, own);
  }

  // A warp's rows of this rank's in the slab (contiguous: one owner's), as rows of the warp's 16.
  struct WarpRows {
    int first;
    int count;
  };
  __device__ static WarpRows own_rows(const bool (&own)[2]) {
    // A row's four lanes agree: lane 4 i + q holds warp rows i and 8 + i.
    const uint32_t upper = __ballot_sync(0xffffffffu, own[0]);
    const uint32_t lower = __ballot_sync(0xffffffffu, own[1]);
    const int first = upper != 0 ? (__ffs(upper) - 1) / 4 : 8 + (__ffs(lower) - 1) / 4;
    return {first, (__popc(upper) + __popc(lower)) / 4};
  }

  // The spread rows: own row first + i's 64 columns (32 pairs) as FP32 at [64 i], in the warp's
  // part of the chunk buffers.
  static constexpr int kMaxSpreadRows = 4;
  static constexpr int kSpreadFloats = kMaxSpreadRows * kChunkCols;
  static_assert(kSlabRows / kWarpRows * kSpreadFloats * sizeof(float) <= kChunkElems * sizeof(uint16_t),
                "every warp's spread rows fit in its consumer's first chunk buffer");

  // The lanes holding own rows write their accumulators of them into the warp's spread rows.
  template <class Config>
  __device__ void spread(const float (&acc)[Config::kAccPerThread], const bool (&own)[2], WarpRows rows) const {
    const int q = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!own[h]) continue;
      float* row = spread_ + ((threadIdx.x % 32) / 4 + 8 * h - rows.first) * kChunkCols;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int a = pair_index(0, j, h);
        *reinterpret_cast<float2*>(row + 8 * j + 2 * q) = make_float2(acc[a], acc[a + 1]);
      }
    }
  }

  // The spread rows' sums, kPairs pairs of columns a lane: lane l takes spread row l / (32 / kPairs)
  // (if there is one), pairs kPairs * (l % (32 / kPairs)) on; it loads them from each rank's slot at
  // once (4 kPairs bytes each, a row's 128 bytes a warp), adds them in rank order and stores them.
  template <class Config, int kPairs>
  __device__ void reduce_spread(const Tile& tile, Slab<Config> slab, WarpRows rows) const {
    constexpr int kLanesPerRow = 32 / kPairs;
    const int lane = threadIdx.x % 32;
    const int i = lane / kLanesPerRow;
    const int pair = kPairs * (lane % kLanesPerRow);
    const int col = tile.col_begin + slab.col + 2 * pair;
    // A vector lies wholly before col_end or past it (n and the slab's columns are multiples of 8).
    if (i >= rows.count || col >= tile.col_end) return;
    float sum[2 * kPairs];
#pragma unroll
    for (int e = 0; e < 2 * kPairs; ++e) sum[e] = spread_[i * kChunkCols + 2 * pair + e];
    const int tile_row = slab.row + kWarpRows * (int(threadIdx.x % 128) / 32) + rows.first + i;
    const size_t row_offset = size_t(tile.segment_row_for(tile_row, p_.rank)) * p_.n + col;
    const size_t source_elems = size_t(p_.rows_per_rank) * p_.n;
    const uint16_t* slots = p_.recv[p_.rank] + (epoch_ & 1) * p_.recv_parity_elems + row_offset;
    uint32_t part[kMaxWorldSize][kPairs];
#pragma unroll
    for (int s = 0; s < kMaxWorldSize; ++s) {
      if (s < p_.world_size && s != p_.rank) load_pairs<kPairs>(slots + s * source_elems, part[s]);
    }
#pragma unroll
    for (int s = 0; s < kMaxWorldSize; ++s) {
      if (s >= p_.world_size || s == p_.rank) continue;
#pragma unroll
      for (int m = 0; m < kPairs; ++m) {
        // A BF16 is the top half of the FP32 of the same value.
        sum[2 * m] += __uint_as_float(part[s][m] << 16);
        sum[2 * m + 1] += __uint_as_float(part[s][m] & 0xffff0000u);
      }
    }
    if (p_.bias != nullptr) {
#pragma unroll
      for (int m = 0; m < kPairs; ++m) {
        const uint32_t pair = __ldg(reinterpret_cast<const unsigned int*>(p_.bias + col + 2 * m));
        sum[2 * m] += __uint_as_float(pair << 16);
        sum[2 * m + 1] += __uint_as_float(pair & 0xffff0000u);
      }
    }
    uint32_t out[kPairs];
#pragma unroll
    for (int m = 0; m < kPairs; ++m) out[m] = pack_bf16x2(sum[2 * m], sum[2 * m + 1]);
    store_pairs<kPairs>(p_.out_rows + row_offset, out);
  }

  template <int kPairs>
  __device__ static void load_pairs(const uint16_t* from, uint32_t (&v)[kPairs]) {
    if constexpr (kPairs == 1) {
      v[0] = __ldcg(reinterpret_cast<const unsigned int*>(from));
    } else if constexpr (kPairs == 2) {
      const uint2 w = __ldcg(reinterpret_cast<const uint2*>(from));
      v[0] = w.x, v[1] = w.y;
    } else {
      static_assert(kPairs == 4, "1, 2 or 4 pairs a lane");
      const uint4 w = __ldcg(reinterpret_cast<const uint4*>(from));
      v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    }
  }

  template <int kPairs>
  __device__ static void store_pairs(uint16_t* to, const uint32_t (&v)[kPairs]) {
    if constexpr (kPairs == 1) {
      *reinterpret_cast<uint32_t*>(to) = v[0];
    } else if constexpr (kPairs == 2) {
      *reinterpret_cast<uint2*>(to) = make_uint2(v[0], v[1]);
    } else {
      *reinterpret_cast<uint4*>(to) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }

  // The held rows' sums, where they are many: each thread adds the peers' partials of its own rows
  // to its accumulators. The warp takes part as a whole (the quads exchange pieces): its other
  // lanes load a valid row of this rank's and store nothing.
  template <class Config>
  __device__ void reduce_held(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread], const bool (&own)[2]) {
    const int q = threadIdx.x % 4;
    const int col = tile.col_begin + slab.col;
    const size_t source_elems = size_t(p_.rows_per_rank) * p_.n;
    const uint16_t* own_slots = p_.recv[p_.rank] + (epoch_ & 1) * p_.recv_parity_elems;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tile_row = slab.row + thread_row(h);
      if (!__any_sync(0xffffffffu, own[h])) continue;
      const int row = own[h] ? tile.segment_row_for(tile_row, p_.rank) : 0;
      const uint16_t* slots = own_slots + size_t(row) * p_.n;
      // Lane q's 8 columns of blocks q and 4 + q of each chunk (a block past the tile's columns
      // reads the slab's first instead, and is never stored).
      int block_cols[Config::kChunksPerSlab][2];
#pragma unroll
      for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int block_col = col + kChunkCols * c + 8 * (4 * half + q);
          block_cols[c][half] = block_col < tile.col_end ? block_col : col;
        }
      }
      // The ranks' pieces of the row, kSourcesInFlight ranks' at once (this rank's own slot is read
      // and left out of the sum), added in rank order.
#pragma unroll 1
      for (int first = 0; first < p_.world_size; first += kSourcesInFlight<Config>) {
        uint4 part[kSourcesInFlight<Config>][Config::kChunksPerSlab][2];
#pragma unroll
        for (int g = 0; g < kSourcesInFlight<Config>; ++g) {
          if (first + g >= p_.world_size) continue;
          const uint16_t* source_slots = slots + (first + g) * source_elems;
#pragma unroll
          for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              part[g][c][half] = __ldcg(reinterpret_cast<const uint4*>(source_slots + block_cols[c][half]));
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kSourcesInFlight<Config>; ++g) {
          if (first + g >= p_.world_size || first + g == p_.rank) continue;
#pragma unroll
          for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              uint32_t v[4] = {part[g][c][half].x, part[g][c][half].y, part[g][c][half].z, part[g][c][half].w};
              quad_transpose(v);  // now pair q of blocks 4 half .. 4 half + 3, as the accumulators
#pragma unroll
              for (int m = 0; m < 4; ++m) {
                const int i = pair_index(c, 4 * half + m, h);
                // A BF16 is the top half of the FP32 of the same value.
                acc[i] += __uint_as_float(v[m] << 16);
                acc[i + 1] += __uint_as_float(v[m] & 0xffff0000u);
              }
            }
          }
        }
      }
      if (p_.bias != nullptr) add_bias(acc, p_.bias, col, tile.col_end, h, h);
      store_row_half<Config>(acc, h, p_.out_rows + size_t(row) * p_.n, col, tile.col_end, own[h]);
    }
  }

  // A bit per peer of this rank.
  __device__ uint32_t peers() const { return ((1u << p_.world_size) - 1) & ~(1u << p_.rank); }

  // One thread: loads the slab's flag from each peer in `waiting` (relaxed, all in flight at once).
  __device__ void load_flags(uint32_t waiting, uint32_t (&seen)[kMaxWorldSize]) const {
    const uint32_t* flags = p_.flags_at[p_.rank] + own_flag_;
    const size_t stride = flag_source_stride(p_);
    comm::load_flags(waiting, 0, [&](int s) { return flags + s * stride; }, seen);
  }

  // One thread: waits, boundedly, for the slab's flag from every peer, from the first poll `seen`
  // on (polling again into it), then fences (acquire). A timeout is recorded in p.failed, which
  // ends every other wait of the call.
  template <class Config>
  __device__ void wait_for_peers(const Tile& tile, Slab<Config> slab, uint32_t (&seen)[kMaxWorldSize]) const {
    uint32_t waiting = peers();  // a bit per peer whose flag is not seen yet
    const bool arrived = comm::wait_bounded</*kEndsOnFailure=*/true, 64>(
        p_, comm::wait_deadline(p_.timeout_ns),
        [&] {
          waiting = comm::clear_reached(waiting, 0, seen, epoch_);
          return waiting == 0;
        },
        [&] { load_flags(waiting, seen); },
        [&] { return comm::Awaited{__ffs(waiting) - 1, tile.row_begin + slab.row, tile.col_begin + slab.col}; });
    if (arrived) ptx::fence_acquire_sys();  // flags seen -> partials
  }

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  float* spread_;     // this warp's spread rows (reduce)
  uint32_t epoch_;    // this call's (comm/epoch.h), read at the start
  KSlice k_slice_{};  // the current step's
  uint16_t* push_rows_[2];  // the current step's: where this thread's row halves are pushed (or null)
  uint32_t* flag_slot_;     // the current step's: the flag this lane raises (null outside the releasing warp)
  int own_flag_;             // the current step's: source 0's flag of the slab in this rank's array, with parity
};

}  // namespace tpfuse::kernels
