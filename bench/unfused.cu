#include "unfused.h"

#include <cmath>

#include "baselines.h"
#include "modes.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW, kPartial };

// The reference reduce-scatter: out_refs[d] (m/G x n, on GPU d) = the sum over ranks r = 0..G-1, in
// that order and in FP32, of rows [d*m/G, (d+1)*m/G) of partial_refs[r] (m x n, on GPU r),
// G = gpus.size(). Waits for all GPUs.
void reference_reduce_scatter(GpuSet& gpus, const std::vector<const float*>& partial_refs,
                              const std::vector<float*>& out_refs, int64_t m, int64_t n) {
  const int num_ranks = gpus.size();
  const size_t rows = size_t(m / num_ranks);
  const size_t count = rows * size_t(n);
  gpus.synchronize();  // the partial references are complete
  std::vector<DeviceBuffer> staging;
  for (int d = 0; d < num_ranks; ++d) {
    Gpu& owner = gpus[d];
    staging.emplace_back(owner.device, count * sizeof(float));
    TESTING_CHECK(cudaSetDevice(owner.device));
    TESTING_CHECK(cudaMemsetAsync(out_refs[d], 0, count * sizeof(float), owner.stream));
    for (int r = 0; r < num_ranks; ++r) {
      TESTING_CHECK(cudaMemcpyPeerAsync(staging[d].get(), owner.device, partial_refs[r] + d * count, gpus[r].device,
                                        count * sizeof(float), owner.stream));
      add_f32_to_ref(out_refs[d], staging[d].as<float>(), count, owner.stream);
    }
  }
  gpus.synchronize();
}

}  // namespace

RankCounts rank_counts(const Problem& problem, int num_gpus, bool with_comm) {
  RankCounts counts;
  counts.a = size_t(problem.m) * size_t(problem.k_per_rank);
  counts.w = size_t(problem.k_per_rank) * size_t(problem.n);
  counts.partial = size_t(problem.m) * size_t(problem.n);
  counts.out = with_comm ? counts.partial / size_t(num_gpus) : 0;
  return counts;
}

UnfusedBuffers make_unfused_buffers(GpuSet& gpus, const RankCounts& counts, int num_sets, uint64_t run_seed,
                                    size_t shape_index) {
  UnfusedBuffers buffers;
  buffers.counts = counts;
  buffers.num_sets = num_sets;
  buffers.ranks.resize(gpus.size());
  for (int g = 0; g < gpus.size(); ++g) {
    RankBuffers& rank = buffers.ranks[g];
    rank.a = random_bf16_sets(gpus[g], counts.a, num_sets, tensor_seed(run_seed, shape_index, g, 0, kA));
    rank.w = random_bf16_sets(gpus[g], counts.w, num_sets, tensor_seed(run_seed, shape_index, g, 0, kW));
    rank.partial =
        random_bf16_sets(gpus[g], counts.partial, num_sets, tensor_seed(run_seed, shape_index, g, 0, kPartial));
    if (buffers.with_comm()) rank.out = poisoned_bf16_sets(gpus[g], counts.out, num_sets);
  }
  return buffers;
}

size_t symmetric_bytes_per_set(const RankCounts& counts) { return (counts.partial + counts.out) * sizeof(bf16); }

SymmetricBuffers::SymmetricBuffers(GpuSet& gpus, const UnfusedBuffers& ring)
    : gpus_(gpus), counts_(ring.counts), num_sets_(ring.num_sets), memory_(gpus.size()), windows_(gpus.size()) {
  const size_t bytes = symmetric_bytes_per_set(counts_) * size_t(num_sets_);
  const auto refused = [&](const char* call, ncclResult_t result) {
    reason_ = std::string(call) + ": " + ncclGetErrorString(result) + " (" + ncclGetLastError(nullptr) + ")";
  };
  for (int g = 0; g < gpus.size() && available(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    if (const ncclResult_t r = ncclMemAlloc(&memory_[g], bytes); r != ncclSuccess) refused("ncclMemAlloc", r);
  }
  if (!available()) return;
  // Registration is collective: one thread registers every GPU's window in a group.
  TESTING_CHECK(ncclGroupStart());
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    if (const ncclResult_t r = ncclCommWindowRegister(gpus[g].comm, memory_[g], bytes, &windows_[g],
                                                      NCCL_WIN_COLL_SYMMETRIC);
        r != ncclSuccess) {
      refused("ncclCommWindowRegister", r);
    }
  }
  if (const ncclResult_t r = ncclGroupEnd(); r != ncclSuccess && available()) refused("ncclCommWindowRegister", r);
  if (!available()) return;
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    for (int set = 0; set < num_sets_; ++set) {
      TESTING_CHECK(cudaMemcpyAsync(partial(g, set), ring.ranks[g].partial[set].get(), counts_.partial * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, gpus[g].stream));
      poison_bf16(static_cast<bf16*>(out(g, set)), counts_.out, gpus[g].stream);
    }
  }
}

// Errors are ignored here: a destructor cannot report them.
SymmetricBuffers::~SymmetricBuffers() {
  for (int g = 0; g < gpus_.size(); ++g) {
    cudaSetDevice(gpus_[g].device);
    cudaStreamSynchronize(gpus_[g].stream);
  }
  ncclGroupStart();
  for (int g = 0; g < gpus_.size(); ++g) {
    if (windows_[g] != nullptr) ncclCommWindowDeregister(gpus_[g].comm, windows_[g]);
  }
  ncclGroupEnd();
  for (int g = 0; g < gpus_.size(); ++g) {
    cudaSetDevice(gpus_[g].device);
    if (memory_[g] != nullptr) ncclMemFree(memory_[g]);
  }
}

// Each set's partial, then its output.
void* SymmetricBuffers::partial(int gpu, int set) const {
  return static_cast<bf16*>(memory_[gpu]) + size_t(set) * (counts_.partial + counts_.out);
}

void* SymmetricBuffers::out(int gpu, int set) const { return static_cast<bf16*>(partial(gpu, set)) + counts_.partial; }

void gemm_all(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, int set, const SymmetricBuffers* symmetric) {
  for (int g = 0; g < gpus.size(); ++g) {
    const RankBuffers& rank = buffers.ranks[g];
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    void* partial = symmetric != nullptr ? symmetric->partial(g, set) : rank.partial[set].get();
    cublas_gemm(gpus[g].cublas, problem, rank.a[set].get(), rank.w[set].get(), partial);
  }
}

void reduce_scatter_all(GpuSet& gpus, UnfusedBuffers& buffers, int set, const SymmetricBuffers* symmetric) {
  TESTING_CHECK(ncclGroupStart());
  for (int g = 0; g < gpus.size(); ++g) {
    const void* partial = symmetric != nullptr ? symmetric->partial(g, set) : buffers.ranks[g].partial[set].get();
    void* out = symmetric != nullptr ? symmetric->out(g, set) : buffers.ranks[g].out[set].get();
    nccl_reduce_scatter(gpus[g].comm, partial, out, buffers.counts.partial, gpus.size(), gpus[g].stream);
  }
  TESTING_CHECK(ncclGroupEnd());
}

UnfusedTimes time_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const TimingOptions& timing,
                          const SymmetricBuffers* symmetric) {
  const int num_sets = buffers.num_sets;
  UnfusedTimes times;
  const LoopTiming gemm = time_loop(gpus, timing, {[&](int i) { gemm_all(gpus, buffers, problem, rotation_set(i, num_sets)); }});
  times.gemm = gemm.launches[0].median_ms;
  times.gemm_host_us = gemm.launches[0].host_us;
  times.gemm_sensors = gemm.sensors;
  if (!buffers.with_comm()) return times;
  const auto time_comm = [&](const SymmetricBuffers* path) {
    return time_median_ms(gpus, timing, [&](int i) { reduce_scatter_all(gpus, buffers, rotation_set(i, num_sets), path); });
  };
  times.comm_ring = times.comm = time_comm(nullptr);
  if (symmetric != nullptr && symmetric->available()) {
    times.comm_sym = time_comm(symmetric);
    times.seq_symmetric = times.comm_sym < times.comm_ring;
    if (times.seq_symmetric) times.comm = times.comm_sym;
  }
  const SymmetricBuffers* faster = times.seq_symmetric ? symmetric : nullptr;
  times.seq = time_median_ms(gpus, timing, [&](int i) {
    gemm_all(gpus, buffers, problem, rotation_set(i, num_sets), faster);
    reduce_scatter_all(gpus, buffers, rotation_set(i, num_sets), faster);
  });
  return times;
}

References make_references(GpuSet& gpus, const UnfusedBuffers& buffers, const Problem& problem) {
  const int num_gpus = gpus.size();
  const RankCounts& counts = buffers.counts;
  References refs;
  for (int g = 0; g < num_gpus; ++g) {
    refs.partials.emplace_back(gpus[g].device, counts.partial * sizeof(float));
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    reference_gemm(problem, buffers.ranks[g].a[0].as<bf16>(), buffers.ranks[g].w[0].as<bf16>(),
                   refs.partials[g].as<float>(), gpus[g].stream);
  }
  if (!buffers.with_comm()) return refs;

  std::vector<const float*> partial_ptrs;
  std::vector<float*> out_ptrs;
  for (int g = 0; g < num_gpus; ++g) {
    refs.outs.emplace_back(gpus[g].device, counts.out * sizeof(float));
    partial_ptrs.push_back(refs.partials[g].as<float>());
    out_ptrs.push_back(refs.outs[g].as<float>());
  }
  reference_reduce_scatter(gpus, partial_ptrs, out_ptrs, problem.m, problem.n);
  return refs;
}

ErrorSums measure_outputs(GpuSet& gpus, const std::vector<const bf16*>& outs, const References& refs,
                          size_t out_count) {
  ErrorSums sums;
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    sums.merge(measure_error(outs[g], refs.outs[g].as<float>(), out_count, gpus[g].stream));
  }
  return sums;
}

UnfusedErrors check_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const References& refs) {
  const RankCounts& counts = buffers.counts;
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    poison_bf16(buffers.ranks[g].partial[0].as<bf16>(), counts.partial, gpus[g].stream);
    if (buffers.with_comm()) poison_bf16(buffers.ranks[g].out[0].as<bf16>(), counts.out, gpus[g].stream);
  }
  gemm_all(gpus, buffers, problem, 0);
  if (buffers.with_comm()) reduce_scatter_all(gpus, buffers, 0);

  UnfusedErrors errors;
  std::vector<const bf16*> outs;
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    errors.gemm.merge(measure_error(buffers.ranks[g].partial[0].as<bf16>(), refs.partials[g].as<float>(),
                                    counts.partial, gpus[g].stream));
    if (buffers.with_comm()) outs.push_back(buffers.ranks[g].out[0].as<bf16>());
  }
  if (buffers.with_comm()) errors.reduce_scatter = measure_outputs(gpus, outs, refs, counts.out);
  return errors;
}

std::vector<Column> comm_columns() {
  return {
      {"t_comm_ring_ms", "T_ring(ms)", 10, Format::kFixed, 4},
      {"t_comm_sym_ms", "T_sym(ms)", 10, Format::kFixed, 4},
      {"t_comm_ms", "T_comm(ms)", 10, Format::kFixed, 4},
      {"t_seq_ms", "T_seq(ms)", 10, Format::kFixed, 4},
      {"seq_path", "seq", 4, Format::kText},
  };
}

void set_comm_times(Row& row, const UnfusedTimes& times) {
  row["t_comm_ring_ms"] = times.comm_ring;
  if (!std::isnan(times.comm_sym)) row["t_comm_sym_ms"] = times.comm_sym;
  row["t_comm_ms"] = times.comm;
  row["t_seq_ms"] = times.seq;
  row["seq_path"] = std::string(times.seq_symmetric ? "sym" : "ring");
}

std::string comm_note(bool check) {
  return "T_ring: ncclReduceScatter on cudaMalloc'd buffers; T_sym: on buffers in NCCL symmetric windows "
         "(ncclMemAlloc, ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC: NCCL's symmetric kernels); T_comm = "
         "the faster, in E and E_hideable; T_seq: GEMM then reduce-scatter on the faster path (seq)" +
         std::string(check ? "; sym/ring: the symmetric output against the ring's" : "");
}

void add_symmetric_error_columns(std::vector<Column>& columns) {
  add_error_columns(columns, "rs_sym", "sym");
  add_error_columns(columns, "sym_vs_ring", "sym/ring");
}

uint64_t check_symmetric_into(Row& row, GpuSet& gpus, UnfusedBuffers& buffers, const SymmetricBuffers& symmetric,
                              const References& refs) {
  if (!symmetric.available()) {
    row["note"] = "no symmetric window: " + symmetric.reason();
    return 0;
  }
  const SymmetricErrors errors = check_symmetric(gpus, buffers, symmetric, refs);
  set_errors(row, "rs_sym", errors.reduce_scatter.stats());
  set_errors(row, "sym_vs_ring", errors.against_ring.stats());
  return errors.reduce_scatter.num_nonfinite;
}

SymmetricErrors check_symmetric(GpuSet& gpus, UnfusedBuffers& buffers, const SymmetricBuffers& symmetric,
                                const References& refs) {
  const RankCounts& counts = buffers.counts;
  std::vector<DeviceBuffer> ring_outs;  // the ring path's output of set 0, as FP32
  for (int g = 0; g < gpus.size(); ++g) {
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    TESTING_CHECK(cudaMemcpyAsync(symmetric.partial(g, 0), buffers.ranks[g].partial[0].get(),
                                  counts.partial * sizeof(bf16), cudaMemcpyDeviceToDevice, gpus[g].stream));
    poison_bf16(static_cast<bf16*>(symmetric.out(g, 0)), counts.out, gpus[g].stream);
    ring_outs.emplace_back(gpus[g].device, counts.out * sizeof(float));
    TESTING_CHECK(cudaMemsetAsync(ring_outs[g].get(), 0, counts.out * sizeof(float), gpus[g].stream));
    add_bf16_to_ref(ring_outs[g].as<float>(), buffers.ranks[g].out[0].as<bf16>(), counts.out, gpus[g].stream);
  }
  reduce_scatter_all(gpus, buffers, 0, &symmetric);

  SymmetricErrors errors;
  std::vector<const bf16*> outs;
  for (int g = 0; g < gpus.size(); ++g) {
    outs.push_back(static_cast<const bf16*>(symmetric.out(g, 0)));
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    errors.against_ring.merge(measure_error(outs[g], ring_outs[g].as<float>(), counts.out, gpus[g].stream));
  }
  errors.reduce_scatter = measure_outputs(gpus, outs, refs, counts.out);
  return errors;
}

}  // namespace tpfuse::bench
