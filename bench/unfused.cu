#include "unfused.h"

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

void gemm_all(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, int set) {
  for (int g = 0; g < gpus.size(); ++g) {
    const RankBuffers& rank = buffers.ranks[g];
    TESTING_CHECK(cudaSetDevice(gpus[g].device));
    cublas_gemm(gpus[g].cublas, problem, rank.a[set].get(), rank.w[set].get(), rank.partial[set].get());
  }
}

void reduce_scatter_all(GpuSet& gpus, UnfusedBuffers& buffers, int set) {
  TESTING_CHECK(ncclGroupStart());
  for (int g = 0; g < gpus.size(); ++g) {
    nccl_reduce_scatter(gpus[g].comm, buffers.ranks[g].partial[set].get(), buffers.ranks[g].out[set].get(),
                        buffers.counts.partial, gpus.size(), gpus[g].stream);
  }
  TESTING_CHECK(ncclGroupEnd());
}

UnfusedTimes time_unfused(GpuSet& gpus, UnfusedBuffers& buffers, const Problem& problem, const TimingOptions& timing) {
  const int num_sets = buffers.num_sets;
  UnfusedTimes times;
  const LoopTiming gemm = time_loop(gpus, timing, {[&](int i) { gemm_all(gpus, buffers, problem, rotation_set(i, num_sets)); }});
  times.gemm = gemm.launches[0].median_ms;
  times.gemm_host_us = gemm.launches[0].host_us;
  times.gemm_sensors = gemm.sensors;
  if (!buffers.with_comm()) return times;
  times.comm = time_median_ms(gpus, timing, [&](int i) { reduce_scatter_all(gpus, buffers, rotation_set(i, num_sets)); });
  times.seq = time_median_ms(gpus, timing, [&](int i) {
    gemm_all(gpus, buffers, problem, rotation_set(i, num_sets));
    reduce_scatter_all(gpus, buffers, rotation_set(i, num_sets));
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

}  // namespace tpfuse::bench
