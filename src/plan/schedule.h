// The per-rank tile schedule: which output tile a rank computes at each step, and who owns it.
//
// Pure C++ that the kernels also compile (TPFUSE_HOST_DEVICE), so the order tested on the CPU is the
// order the GPU runs.
//
// The partial product C_r (m x n) is cut into P row segments, one per owner rank; segment d holds the
// rows [d*m/P, (d+1)*m/P) that rank d keeps after the reduce-scatter. A tile never crosses a segment:
// the last row tile of a segment is clipped to it. Rank r walks the segments rotated so that it
// first computes the rows of rank r+1, then r+2, ..., and its own rows last (see the window below):
//
//   step (segment order)    0      1      2     ...   P-1
//   rank 0 computes rows of 1      2      3     ...   0      <- own rows last: reduce, no send
//   rank 1 computes rows of 2      3      4     ...   1
//   ...
//   rank r computes rows of (r + 1 + s) mod P at segment-step s
//
// At every step the ranks send to P distinct owners (a permutation), so every link is busy. A rank's
// own tiles need the peers' partials of the same rows, the last of which (from rank r+1) are computed
// in the peers' last foreign segment. So the own tiles do not all wait for the very end: they are
// interleaved into the window of the last foreign segment (F) behind a lead of L = own_lag tiles,
//
//   window of the last two segments:   F0 .. F(L-1)  O0 F(L)  O1 F(L+1)  ...  O(T-L-1) F(T-1)  O(T-L) .. O(T-1)
//
// so own tile j comes at least min(L, T) steps after every peer computed it (2L - 1 steps for j >= L;
// T = tiles per segment), and the owner's reads of its P-1 partials spread over two segments instead
// of one. With L >= T the own tiles simply come last.
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

struct TileSchedule {
  int world_size = 1;
  int rank = 0;
  int m = 0;
  int n = 0;
  int block_m = 128;
  int block_n = 256;
  int group_rows = 8;
  int own_lag = 1 << 30;  // lead of the last foreign segment over the own tiles (see above); >= 1

  TPFUSE_HOST_DEVICE int rows_per_rank() const { return m / world_size; }
  TPFUSE_HOST_DEVICE int row_tiles_per_segment() const { return (rows_per_rank() + block_m - 1) / block_m; }
  TPFUSE_HOST_DEVICE int col_tiles() const { return (n + block_n - 1) / block_n; }
  TPFUSE_HOST_DEVICE int tiles_per_segment() const { return row_tiles_per_segment() * col_tiles(); }
  TPFUSE_HOST_DEVICE int num_tiles() const { return world_size * tiles_per_segment(); }

  // The rank that owns the rows this rank computes at segment-step s.
  TPFUSE_HOST_DEVICE int owner_at_segment_step(int s) const { return (rank + 1 + s) % world_size; }

  // The segment-step of `step` (its tile's owner is owner_at_segment_step of it), and the tile's
  // index inside that segment.
  TPFUSE_HOST_DEVICE void locate(int step, int* segment_step, int* index) const {
    const int per_segment = tiles_per_segment();
    const int window = (world_size - 2) * per_segment;  // start of the last two segments' window
    if (world_size < 2 || step < window) {
      *segment_step = step / per_segment;
      *index = step % per_segment;
      return;
    }
    const int own = world_size - 1;
    const int lead = max_int(1, min_int(own_lag, per_segment));
    const int i = step - window;
    const int alternating = 2 * (per_segment - lead);
    if (i < lead) {
      *segment_step = own - 1;
      *index = i;
    } else if (i < lead + alternating) {
      const int k = i - lead;
      *segment_step = k % 2 == 0 ? own : own - 1;
      *index = k % 2 == 0 ? k / 2 : lead + k / 2;
    } else {
      *segment_step = own;
      *index = per_segment - lead + (i - lead - alternating);
    }
  }

  // The tile this rank computes at `step`, 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    int segment_step = 0, t = 0;
    locate(step, &segment_step, &t);
    const int owner = owner_at_segment_step(segment_step);

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
