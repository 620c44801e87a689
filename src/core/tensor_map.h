// TMA tensor maps for row-major matrices, encoded through the driver entry point (so the
// library does not link libcuda and loads on machines without a GPU driver).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// A rows x cols row-major matrix of `dtype` elements (row pitch `pitch_elems`), read or written in
// boxes of box_rows x box_cols with 128-byte swizzle (box_cols elements must be 128 bytes). The
// inputs' maps take the problem's dtype; outputs (and the reduce-scatter's partials) kOutputDType.
Status make_tensor_map(DType dtype, const void* base, int64_t rows, int64_t cols, int64_t pitch_elems, int box_rows,
                       int box_cols, CUtensorMap* map);

// Layers of dense rows x cols matrices: for each of `parities` halves (`parity_stride_elems` apart),
// `layers` matrices one after another (a receive buffer's sources, a gathered buffer's blocks). A 4D
// map (x = column, y = row, z = layer, w = parity) with boxes of box_rows x box_cols x 1 x 1: a box
// is clipped at its layer's last row, not continued into the next layer.
Status make_layered_tensor_map(DType dtype, const void* base, int64_t layers, int64_t rows, int64_t cols,
                               int64_t parities, int64_t parity_stride_elems, int box_rows, int box_cols,
                               CUtensorMap* map);

}  // namespace tpfuse
