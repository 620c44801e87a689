// The per-rank tile schedule: which output tile a rank computes at each step, and who owns it.
//
// Pure C++ that the kernels also compile (TPFUSE_HOST_DEVICE), so the order tested on the CPU is the
// order the GPU runs.
//
// The partial product C_r (m x n) is cut into P row segments, one per owner rank; segment d holds the
// rows [d*m/P, (d+1)*m/P) that rank d keeps after the reduce-scatter. A tile never crosses a segment:
// the last row tile of a segment is clipped to it. Every segment has the same T tiles, numbered in
// the raster order below.
//
// Rank r walks its tiles in rounds. Round j holds tile j of every other owner, rotated so that rank
// r starts with r+1 (offset 0) and ends with r-1 (offset P-2), then its own tile j - L (offset P-1),
// where L = own_lag rounds; the own tiles that no round holds come last:
//
//   P = 4, rank 1, T = 4, L = 2 (owner:tile)
//   round 0: 2:0 3:0 0:0   round 1: 2:1 3:1 0:1   round 2: 2:2 3:2 0:2 1:0   round 3: 2:3 3:3 0:3 1:1
//   tail:    1:2 1:3
//
// At every step the ranks send to P distinct owners (a permutation: the same offset on every rank),
// so every link is busy, and every owner receives from all its peers all the time. A rank's own tile
// j needs the peers' partials of it, computed in their round j; it comes L rounds later: at least
// L * (P-1) + 1 steps later inside the rounds, at least max(L, 1) steps in the tail. With
// L = ceil(CTAs / P) the peers have had about a wave to push it. The own tiles, each longer than a
// peer's tile by its reduction, are then spread over the whole call instead of filling its last 1/P
// (docs/PERFORMANCE.md measures both). With L >= T every own tile comes last, the default.
//
// Inside a segment, tiles go in groups of `group_rows` row tiles, column-major inside a group, so
// the CTAs working at the same time share A rows and W columns in L2:
//
//   group_rows = 2, segment of 4 x 3 tiles:     0  2  4
//                                               1  3  5
//                                               6  8 10
//                                               7  9 11
#pragma once

#if defined(__CUDACC__)
#define TPFUSE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TPFUSE_HOST_DEVICE inline
#endif

namespace tpfuse {

// One output tile of a rank's partial product: rows [row_begin, row_end) of C (row_end is clipped
// to the owner's segment), columns [col_begin, col_end) (clipped to n). segment_row is row_begin
// counted from the start of the owner's segment: where the tile lands in the owner's M/P x n rows.
struct Tile {
  int owner_rank;
  int row_begin;
  int row_end;
  int segment_row;
  int col_begin;
  int col_end;
};

// The step that CTA `cta` of a persistent grid of `num_ctas` takes in wave `wave` (waves 0, 1, ...
// while the step is a tile): wave k holds steps k * num_ctas .. (k+1) * num_ctas - 1, and CTA b
// takes the one at place (b + k * cta_group) % num_ctas. Moving on by a place each wave, every CTA
// takes every place in turn. A CTA that kept its place (steps b, b + num_ctas, ...) would repeat
// the same offsets of the rounds: with 132 CTAs and P = 2 or 4 the same CTAs would take every own
// tile, and at P = 8 a quarter of the CTAs would take one every other step. CTAs in groups of
// `cta_group` (a cluster; num_ctas a multiple of it) move on by a group, keeping adjacent steps.
TPFUSE_HOST_DEVICE int persistent_step(int cta, int num_ctas, int wave, int cta_group) {
  return wave * num_ctas + (cta + wave * cta_group) % num_ctas;
}

struct TileSchedule {
  int world_size = 1;
  int rank = 0;
  int m = 0;
  int n = 0;
  int block_m = 128;
  int block_n = 256;
  int group_rows = 8;
  int own_lag = 1 << 30;  // rounds between a peer tile and the own tile of the same rows (see above); >= 0

  TPFUSE_HOST_DEVICE int rows_per_rank() const { return m / world_size; }
  TPFUSE_HOST_DEVICE int row_tiles_per_segment() const { return (rows_per_rank() + block_m - 1) / block_m; }
  TPFUSE_HOST_DEVICE int col_tiles() const { return (n + block_n - 1) / block_n; }
  TPFUSE_HOST_DEVICE int tiles_per_segment() const { return row_tiles_per_segment() * col_tiles(); }
  TPFUSE_HOST_DEVICE int num_tiles() const { return world_size * tiles_per_segment(); }

  // The rank that owns the rows at `offset` of a round: r+1, ..., r+P-1, then r itself (offset P-1).
  TPFUSE_HOST_DEVICE int owner_at_offset(int offset) const { return (rank + 1 + offset) % world_size; }

  // The owner offset of `step` and its tile's index inside the owner's segment.
  TPFUSE_HOST_DEVICE void locate(int step, int* offset, int* index) const {
    const int own = world_size - 1;
    if (own == 0) {
      *offset = 0;
      *index = step;
      return;
    }
    const int per_segment = tiles_per_segment();
    const int lag = max_int(0, min_int(own_lag, per_segment));
    const int first_own_step = lag * own;  // rounds 0 .. lag-1 hold P-1 tiles each, later rounds P
    const int tail = first_own_step + (per_segment - lag) * world_size;
    if (step < first_own_step) {
      *offset = step % own;
      *index = step / own;
    } else if (step < tail) {
      const int k = step - first_own_step;
      *offset = k % world_size;
      *index = *offset == own ? k / world_size : lag + k / world_size;
    } else {
      *offset = own;
      *index = per_segment - lag + (step - tail);
    }
  }

  // The tile this rank computes at `step`, 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    int offset = 0, t = 0;
    locate(step, &offset, &t);
    const int owner = owner_at_offset(offset);

    const int num_row_tiles = row_tiles_per_segment();
    const int num_cols = col_tiles();
    const int group = t / (group_rows * num_cols);
    const int first_row_tile = group * group_rows;
    const int rows_in_group = min_int(group_rows, num_row_tiles - first_row_tile);
    const int t_in_group = t - group * group_rows * num_cols;
    const int row_tile = first_row_tile + t_in_group % rows_in_group;
    const int col_tile = t_in_group / rows_in_group;

    const int segment_begin = owner * rows_per_rank();
    const int segment_end = segment_begin + rows_per_rank();
    Tile tile;
    tile.owner_rank = owner;
    tile.segment_row = row_tile * block_m;
    tile.row_begin = segment_begin + tile.segment_row;
    tile.row_end = min_int(tile.row_begin + block_m, segment_end);
    tile.col_begin = col_tile * block_n;
    tile.col_end = min_int(tile.col_begin + block_n, n);
    return tile;
  }

 private:
  TPFUSE_HOST_DEVICE static int min_int(int a, int b) { return a < b ? a : b; }
  TPFUSE_HOST_DEVICE static int max_int(int a, int b) { return a > b ? a : b; }
};

}  // namespace tpfuse
