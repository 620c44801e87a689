// The per-rank GEMM: one rank's partial product with the mainloop the fused ops are built on.
// Needs only the CUDA runtime's header.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// c = a @ w: BF16 inputs, FP32 accumulation, BF16 output (m x n, row-major). `a` is m x k_per_rank
// row-major; `w` is laid out as problem.weight_layout says. Device pointers, 16-byte aligned.
// problem.world_size is ignored. Asynchronous on `stream`. Where the output has few tiles (small m),
// each tile's K loop is split over several CTAs, which use a workspace of the library's: one per
// device and stream (FP32 partials for a step per SM, about 17 MB on 132 SMs), allocated on the
// first such call on that stream (also while it is being captured into a CUDA graph) and kept until
// the process exits. Calls on different streams may overlap; a captured graph uses the workspace of
// the stream it was captured from, so its replays must not overlap each other or calls on that stream.
// At m <= 64 over wide outputs a kernel of its own (overrides.swap_ab) may run instead, without the
// workspace.
Status gemm(const Problem& problem, const void* a, const void* w, void* c, cudaStream_t stream,
            const ConfigOverrides& overrides = {});

// The same with inputs of any dtype: E4M3 ones (problem.dtype) are scaled by `scales` as
// problem.scaling says (tpfuse/problem.h) and accumulated as problem.accumulation says.
Status gemm(const Problem& problem, const void* a, const void* w, const InputScales& scales, void* c,
            cudaStream_t stream, const ConfigOverrides& overrides = {});

}  // namespace tpfuse
