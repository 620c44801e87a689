// Where the rows of a rank's segment lie among the full rows, when those rows are `batch`
// sequences each split over the ranks (tpfuse/problem.h: sequence parallelism on dimension 1).
//
// A segment is what one rank holds of the split rows: the rows the reduce-scatter's owner keeps, or
// the block the all-gather gathers from one rank. With one sequence it is rows [d*m/P, (d+1)*m/P)
// of the full rows. With several it is rank d's shard of every sequence, one after the other:
//
//   P = 2, batch = 2, s = 256 rows a sequence (a shard: 128)
//                      full rows      owner 0's segment    owner 1's segment
//     sequence 0       0 .. 127       0 .. 127
//                    128 .. 255                            0 .. 127
//     sequence 1     256 .. 383     128 .. 255
//                    384 .. 511                          128 .. 255
//
// The ops' schedules cut tiles from segments whatever the batch, so their pushes, flags and
// receive slots are the same; only where a tile's rows are loaded from or stored to the full rows
// (the reduce-scatter's A, the all-gather's Y and gathered X) goes through this map. A shard is
// whole 64-row slabs (problem.cpp checks it), so no slab straddles two sequences.
//
// Pure C++ that the kernels compile too: the division is prepared on the host (fast_division.h).
#pragma once

#include <cstdint>

#include "core/fast_division.h"
#include "core/host_device.h"

namespace tpfuse {

class SequenceRows {
 public:
  SequenceRows() = default;

  // The segments of `world_size` ranks, `segment_rows` each, holding `batch` sequences' shards.
  SequenceRows(int64_t batch, int64_t segment_rows, int world_size)
      : batch_(int(batch)),
        shard_rows_(int(segment_rows / batch)),
        sequence_rows_(int(segment_rows / batch) * world_size),
        by_shard_(int(segment_rows / batch)) {}

  TPFUSE_HOST_DEVICE bool batched() const { return batch_ > 1; }
  TPFUSE_HOST_DEVICE int shard_rows() const { return shard_rows_; }

  // The sequence that holds row `segment_row` of a segment.
  TPFUSE_HOST_DEVICE int sequence_of(int segment_row) const { return by_shard_.div(segment_row); }

  // The full row that holds row `segment_row` of `owner`'s segment.
  TPFUSE_HOST_DEVICE int row_of(int owner, int segment_row) const {
    const int sequence = sequence_of(segment_row);
    return sequence * sequence_rows_ + owner * shard_rows_ + (segment_row - sequence * shard_rows_);
  }

 private:
  int batch_ = 1;
  int shard_rows_ = 0;
  int sequence_rows_ = 0;
  FastDivision by_shard_;
};

}  // namespace tpfuse
