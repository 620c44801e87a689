// The unfused path (a cuBLAS GEMM per GPU, then the NCCL reduce-scatter) on every GPU of a set, as
// the modes that time or check it share it: the per-GPU buffers rotated over input sets, the calls,
// their times, the FP32 references and the errors against them. GPU g runs rank g; with G GPUs the
// reduce-scatter gives GPU g rows [g*m/G, (g+1)*m/G) of the sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "testing/gpu_check.h"
#include "testing/device_buffer.h"
#include "gpus.h"
#include "timing.h"
#include "tpfuse/problem.h"

namespace tpfuse::bench {

// Element counts of one GPU's tensors.
struct RankCounts {
  size_t a = 0;        // m x k_per_rank
  size_t w = 0;        // k_per_rank x n or n x k_per_rank
  size_t partial = 0;  // m x n
  size_t out = 0;      // m/G x n; 0 without a reduce-scatter

  size_t bf16_bytes() const { return (a + w + partial + out) * sizeof(bf16); }
};

// With a reduce-scatter over `num_gpus` GPUs when `with_comm` (m must then be divisible by it).
RankCounts rank_counts(const Problem& problem, int num_gpus, bool with_comm);

// One GPU's buffers, one of each per input set.
struct RankBuffers {
  std::vector<DeviceBuffer> a;
  std::vector<DeviceBuffer> w;
  std::vector<DeviceBuffer> partial;  // the GEMM's output, the reduce-scatter's input
  std::vector<DeviceBuffer> out;      // the reduce-scatter's output (empty without it)
};

struct UnfusedBuffers {
  RankCounts counts;
  int num_sets = 1;
  std::vector<RankBuffers> ranks;  // one per GPU of the set

  bool with_comm() const { return counts.out > 0; }
};

// Random A, W and partials (the reduce-scatter alone then adds real numbers, not left-over memory)
// and poisoned outputs, seeded per GPU, input set and shape.
UnfusedBuffers make_unfused_buffers(GpuSet& gpus, const RankCounts& counts, int num_sets, uint64_t run_seed,
                                    size_t shape_index);

// Queue one input set's GEMMs, or its reduce-scatter, on every GPU.
void gemm_all(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, int set);
void reduce_scatter_all(GpuSet& gpus, UnfusedBuffers& buffers, int set);

// Medians in ms, slowest GPU, and the GEMMs' host time and sensors (see LoopTiming); T_comm and
// T_seq stay NaN without a reduce-scatter.
struct UnfusedTimes {
  double gemm = 0;
  double gemm_host_us = 0;   // queuing every GPU's GEMM
  LoopSensors gemm_sensors;  // during the GEMMs' loop
  double comm = std::numeric_limits<double>::quiet_NaN();
  double seq = std::numeric_limits<double>::quiet_NaN();
};

// T_gemm (the GEMMs alone), T_comm (the reduce-scatter alone), T_seq (both on one stream).
UnfusedTimes time_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const TimingOptions& timing);

// FP32 references of input set 0, on each GPU: its partial (m x n) and, with a reduce-scatter, the
// sum of every GPU's partial over the rows it owns (m/G x n).
struct References {
  std::vector<DeviceBuffer> partials;
  std::vector<DeviceBuffer> outs;  // empty without a reduce-scatter
};

References make_references(GpuSet& gpus, const UnfusedBuffers& buffers, const Problem& problem);

// outs[g] (BF16, on GPU g, out_count elements each) against refs.outs[g], merged over the GPUs.
ErrorSums measure_outputs(GpuSet& gpus, const std::vector<const bf16*>& outs, const References& refs,
                          size_t out_count);

struct UnfusedErrors {
  ErrorSums gemm;            // every GPU's partial against its reference
  ErrorSums reduce_scatter;  // every GPU's rows of the sum: the unfused path's error, end to end
};

// Runs the unfused path once on input set 0 into poisoned outputs and measures it against `refs`.
UnfusedErrors check_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const References& refs);

}  // namespace tpfuse::bench
