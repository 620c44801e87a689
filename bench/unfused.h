// The unfused path (a cuBLAS GEMM per GPU, then the NCCL reduce-scatter) on every GPU of a set, as
// the modes that time or check it share it: the per-GPU buffers rotated over input sets, the calls,
// their times, the FP32 references and the errors against them. GPU g runs rank g; with G GPUs the
// reduce-scatter gives GPU g rows [g*m/G, (g+1)*m/G) of the sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "testing/gpu_check.h"
#include "testing/device_buffer.h"
#include "gpus.h"
#include "report.h"
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

// The same partials and outputs in NCCL symmetric memory: per GPU one allocation (ncclMemAlloc)
// holding every input set's partial and output, registered as a window with NCCL_WIN_COLL_SYMMETRIC
// (NCCL 2.28), so that ncclReduceScatter on them takes NCCL's symmetric kernels. The partials are
// copied from the ring path's. Where NCCL refuses, it is not available and reason() says why.
class SymmetricBuffers {
 public:
  SymmetricBuffers(GpuSet& gpus, const UnfusedBuffers& ring);
  ~SymmetricBuffers();
  SymmetricBuffers(const SymmetricBuffers&) = delete;
  SymmetricBuffers& operator=(const SymmetricBuffers&) = delete;

  bool available() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }
  void* partial(int gpu, int set) const;
  void* out(int gpu, int set) const;

 private:
  GpuSet& gpus_;
  RankCounts counts_;
  int num_sets_ = 0;
  std::vector<void*> memory_;         // per GPU (null where not allocated)
  std::vector<ncclWindow_t> windows_;  // per GPU (null where not registered)
  std::string reason_;
};

// The bytes the symmetric path adds to an input set.
size_t symmetric_bytes_per_set(const RankCounts& counts);

// Queue one input set's GEMMs, or its reduce-scatter, on every GPU; with `symmetric`, the GEMMs
// write into its partials and the reduce-scatter runs on its buffers.
void gemm_all(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, int set,
              const SymmetricBuffers* symmetric = nullptr);
void reduce_scatter_all(GpuSet& gpus, UnfusedBuffers& buffers, int set, const SymmetricBuffers* symmetric = nullptr);

// Medians in ms, slowest GPU, and the GEMMs' host time and sensors (see LoopTiming); the
// reduce-scatter's stay NaN without one, the symmetric one's without symmetric buffers.
struct UnfusedTimes {
  double gemm = 0;
  double gemm_host_us = 0;   // queuing every GPU's GEMM
  LoopSensors gemm_sensors;  // during the GEMMs' loop
  double comm_ring = std::numeric_limits<double>::quiet_NaN();  // on cudaMalloc'd buffers
  double comm_sym = std::numeric_limits<double>::quiet_NaN();   // on the symmetric windows
  double comm = std::numeric_limits<double>::quiet_NaN();       // the faster of the two
  bool seq_symmetric = false;  // T_seq ran the symmetric path (the faster one)
  double seq = std::numeric_limits<double>::quiet_NaN();
};

// The reduce-scatter's columns of modes baseline and fused: T_ring, T_sym, T_comm, T_seq and its path;
// set_comm_times fills them.
std::vector<Column> comm_columns();
void set_comm_times(Row& row, const UnfusedTimes& times);

// T_gemm (the GEMMs alone), T_comm (the reduce-scatter alone: on the ring's buffers and, where given,
// on the symmetric ones; T_comm the faster), T_seq (both on one stream, on the faster path).
UnfusedTimes time_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const TimingOptions& timing,
                          const SymmetricBuffers* symmetric = nullptr);

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

struct SymmetricErrors {
  ErrorSums reduce_scatter;  // every GPU's rows of the sum against the FP32 reference
  ErrorSums against_ring;    // the same rows against the ring path's (BF16, as FP32)
};

// After check_unfused: the symmetric reduce-scatter of the same partials (input set 0) into poisoned
// outputs, measured against `refs` and against the ring path's output.
SymmetricErrors check_symmetric(GpuSet& gpus, UnfusedBuffers& buffers, const SymmetricBuffers& symmetric,
                                const References& refs);

// Their columns ("rs_sym_*", "sym_vs_ring_*"), and check_symmetric's numbers in them (where the
// windows are available; else the row's "note" says why); returns the outputs' non-finite count.
void add_symmetric_error_columns(std::vector<Column>& columns);
uint64_t check_symmetric_into(Row& row, GpuSet& gpus, UnfusedBuffers& buffers, const SymmetricBuffers& symmetric,
                              const References& refs);

// The note on the two reduce-scatters, for modes baseline and fused.
std::string comm_note(bool check);

}  // namespace tpfuse::bench
