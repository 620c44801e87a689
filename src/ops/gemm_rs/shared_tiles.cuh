// The reduce-scatter's epilogue for tiles of several owners' rows (one band of all segments:
// decode-sized M, ops/gemm_rs/schedule.h) where that band is one slab of rows, M <= 64 (the
// config's register_epilogue). Such tiles are few and all of them finish in the call's one wave, so
// what a slab waits for after its K loop is latency, not bandwidth: the consumer warpgroup moves it
// itself, from its registers, without staging it in shared memory and without the sender, the
// watcher or extra stages of the ring (ops/gemm_rs/epilogue.cuh); so it also runs on the tiles of
// one consumer. On taller bands the staged epilogue's partials, streamed through the ring by the
// producer, measured faster: here a thread loads its own rows' partials itself, and only the warps
// holding them do (docs/EXPERIMENTS.md).
//
//   split K   the split that counts in last holds the sum of the tile's S partials, added in split
//             order (gemm/split_k_epilogue.cuh); the others are done
//   push      each thread stores its rows of other owners straight into each owner's receive
//             words, words[parity][this rank][row][column pair] (ops/gemm_rs/workspace.h): each
//             64-bit word a BF16 pair and this call's epoch, 16 bytes a lane
//   reduce    each warp holding this rank's rows loads its peers' words of those rows from this
//             rank's receive words until every one carries this call's epoch (bounded), adds the
//             partials to its FP32 accumulators in rank order, rounds once and stores the rows into
//             the output (16 bytes a lane)
//
// A word is stored and loaded as one single-copy-atomic access, so its epoch vouches for its pair:
// no flag, no fence and no barrier between a push and the owner's reads (the flags and fences of
// the staged epilogue each cost a round trip on a path that is all latency here), for twice the
// bytes of BF16 (small: one slab of rows a tile).
//
// Every rank pushes before it waits: the ranks compute every tile at the same step, so each waits
// for the others' pushes of the same tile. The partials and the order of the additions are those
// of the staged epilogue, so a call is bit-reproducible and equal to tiles of one owner's rows with
// the same split of K.
#pragma once

#include "gemm/split_k_epilogue.cuh"
#include "ops/gemm_rs/epilogue.cuh"

namespace tpfuse::kernels {

class SharedTileEpilogue : public EpilogueBase {
 public:
  using Params = PushReduceParams;

  template <class Storage>
  __device__ SharedTileEpilogue(const Params& params, int consumer, Storage& smem)
      : p_(params), consumer_(consumer), slabs_(consumer, smem.chunks[consumer]), epoch_(comm::call_epoch(params.calls)) {}

  template <class Config>
  __device__ void begin_tile(const Tile&, const KSlice& k_slice) {
    k_slice_ = k_slice;
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
    push<Config>(tile, slab, acc);
    reduce<Config>(tile, slab, acc);
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

  // Ranks whose words of a row (every chunk of the slab) a thread loads at once: 128 registers' worth
  // (64 where the slab's 256 columns of accumulators take 128).
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

  // Rounds row half h of this thread's accumulators to BF16 and hands each lane's 8 adjacent
  // columns of it to f(block_col, v): v holds them as four BF16 pairs, from the slab's column `col`
  // on, for the blocks before col_end. Every lane of the warp takes part (the quads exchange
  // pieces), whether it has anything to hand on or not.
  template <class Config, class F>
  __device__ static void for_each_row_piece(const float (&acc)[Config::kAccPerThread], int h, int col, int col_end,
                                            F&& f) {
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
        if (block_col < col_end) f(block_col, v);
      }
    }
  }

  // A BF16 pair and this call's epoch in one word: the epoch in the high half marks the pair as
  // this call's.
  __device__ uint64_t word_of(uint32_t pair) const { return uint64_t(epoch_) << 32 | pair; }

  // Stores this thread's rows of other owners into their receive words, each word valid on its own.
  template <class Config>
  __device__ void push(const Tile& tile, Slab<Config> slab, const float (&acc)[Config::kAccPerThread]) {
    const int col = tile.col_begin + slab.col;
    const size_t parity = epoch_ & 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tile_row = slab.row + thread_row(h);
      const int owner = tile.owner_of_row(tile_row);
      const bool pushed = tile.row_begin + tile_row < tile.row_end && owner != p_.rank;
      uint64_t* row_words = nullptr;
      if (pushed) {
        const int row = tile.segment_row_for(tile_row, owner);
        row_words = p_.words[owner] + parity * p_.words_parity + (size_t(p_.rank) * p_.rows_per_rank + row) * (p_.n / 2);
      }
      for_each_row_piece<Config>(acc, h, col, tile.col_end, [&](int block_col, const uint32_t(&v)[4]) {
        if (!pushed) return;
        uint64_t* dst = row_words + block_col / 2;
        ptx::store_words_relaxed_sys(dst, word_of(v[0]), word_of(v[1]));
        ptx::store_words_relaxed_sys(dst + 2, word_of(v[2]), word_of(v[3]));
      });
    }
  }

  // Adds the peers' partials of this rank's rows of the slab, in rank order, and stores those rows.
  // A warp with any of those rows takes part as a whole (the quads exchange pieces): its other lanes
  // load a valid row of this rank's and store nothing. A peer's words are polled until all of them
  // carry this call's epoch (bounded: a timeout is recorded in p.failed, which ends every other
  // wait of the call; the sums are then wrong and the call reports it).
  template <class Config>
  __device__ void reduce(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    bool own[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tile_row = slab.row + thread_row(h);
      own[h] = tile.row_begin + tile_row < tile.row_end && tile.owner_of_row(tile_row) == p_.rank;
    }
    if (!__any_sync(0xffffffffu, own[0] || own[1])) return;
    const int q = threadIdx.x % 4;
    const int col = tile.col_begin + slab.col;
    const size_t source_words = size_t(p_.rows_per_rank) * (p_.n / 2);
    const uint64_t* own_words = p_.words[p_.rank] + (epoch_ & 1) * p_.words_parity;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tile_row = slab.row + thread_row(h);
      if (!__any_sync(0xffffffffu, own[h])) continue;
      const int row = own[h] ? tile.segment_row_for(tile_row, p_.rank) : 0;
      const uint64_t* row_words = own_words + size_t(row) * (p_.n / 2);
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
      // The peers' pieces of the row, kSourcesInFlight ranks' at once (this rank's own slot is
      // skipped), added in rank order.
#pragma unroll 1
      for (int first = 0; first < p_.world_size; first += kSourcesInFlight<Config>) {
        uint64_t part[kSourcesInFlight<Config>][Config::kChunksPerSlab][2][4];
        load_sources<Config>(row_words, source_words, first, block_cols, part);
        await_sources<Config>(tile, slab, row_words, source_words, first, block_cols, part);
#pragma unroll
        for (int g = 0; g < kSourcesInFlight<Config>; ++g) {
          if (first + g >= p_.world_size || first + g == p_.rank) continue;
#pragma unroll
          for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              uint32_t v[4];
#pragma unroll
              for (int m = 0; m < 4; ++m) v[m] = uint32_t(part[g][c][half][m]);
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
      uint16_t* out_row = p_.out_rows + size_t(row) * p_.n;
      const bool store = own[h];
      for_each_row_piece<Config>(acc, h, col, tile.col_end, [&](int block_col, const uint32_t(&v)[4]) {
        if (store) *reinterpret_cast<uint4*>(out_row + block_col) = make_uint4(v[0], v[1], v[2], v[3]);
      });
    }
  }

  template <class Config>
  using SourceWords = uint64_t[kSourcesInFlight<Config>][Config::kChunksPerSlab][2][4];

  // Loads sources first .. first + kSourcesInFlight - 1 of this thread's words of a row (the peers'
  // only).
  template <class Config>
  __device__ void load_sources(const uint64_t* row_words, size_t source_words, int first,
                               const int (&block_cols)[Config::kChunksPerSlab][2], SourceWords<Config>& part) const {
#pragma unroll
    for (int g = 0; g < kSourcesInFlight<Config>; ++g) {
      if (first + g >= p_.world_size || first + g == p_.rank) continue;
      const uint64_t* source = row_words + (first + g) * source_words;
#pragma unroll
      for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint64_t* words = source + block_cols[c][half] / 2;
          ptx::load_words_relaxed_sys(words, part[g][c][half][0], part[g][c][half][1]);
          ptx::load_words_relaxed_sys(words + 2, part[g][c][half][2], part[g][c][half][3]);
        }
      }
    }
  }

  // Until every lane of the warp holds this call's words of those sources: loads them again, up to
  // the peer timeout. Returns at once in a call that has already failed.
  template <class Config>
  __device__ void await_sources(const Tile& tile, Slab<Config> slab, const uint64_t* row_words, size_t source_words,
                                int first, const int (&block_cols)[Config::kChunksPerSlab][2],
                                SourceWords<Config>& part) const {
    uint64_t deadline = 0;
    for (;;) {
      int missing = -1;  // the first source with a word of an earlier call
#pragma unroll
      for (int g = kSourcesInFlight<Config> - 1; g >= 0; --g) {
        if (first + g >= p_.world_size || first + g == p_.rank) continue;
        bool arrived = true;
#pragma unroll
        for (int c = 0; c < Config::kChunksPerSlab; ++c) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int m = 0; m < 4; ++m) arrived = arrived && comm::epoch_reached(uint32_t(part[g][c][half][m] >> 32), epoch_);
          }
        }
        if (!arrived) missing = first + g;
      }
      if (__all_sync(0xffffffffu, missing < 0)) return;
      // The warp leaves together (its lanes exchange pieces next); a lane still missing a word
      // reports it (the first report counts).
      if (__any_sync(0xffffffffu, comm::call_failed(p_.failed))) return;
      const uint64_t now = ptx::globaltimer_ns();
      if (deadline == 0) deadline = now + p_.timeout_ns;
      if (__any_sync(0xffffffffu, now > deadline)) {
        if (missing >= 0) {
          comm::report_timeout(p_.failed, p_.error, p_.rank, missing, tile.row_begin + slab.row, tile.col_begin + slab.col);
        }
        return;
      }
      __nanosleep(64);
      load_sources<Config>(row_words, source_words, first, block_cols, part);
    }
  }

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  uint32_t epoch_;    // this call's (comm/epoch.h), read at the start
  KSlice k_slice_{};  // the current step's
};

}  // namespace tpfuse::kernels
