// The fused ops' test fixture: P ranks of one local communicator in this process, rank r on
// devices[r] (by default all on device 0: ranks emulated on one GPU, all their CTAs resident in one
// cooperative launch), each with its BF16 operands and outputs. An op's fixture adds its arrays
// (ranks_arrays) and its call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "gpu_testing.cuh"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {

// The communicator's capacity for exactly one op's problem.
inline CommunicatorOptions capacity_for(const Problem& p) {
  CommunicatorOptions options;
  options.max_m = p.m;
  options.max_n = p.n;
  return options;
}
inline CommunicatorOptions capacity_for(const AllGatherProblem& p) {
  CommunicatorOptions options;
  options.max_m = p.m;
  options.max_n = p.n_per_rank;
  options.max_k = p.k;
  return options;
}

template <class OpProblem>
struct LocalRanks {
  using Array = DeviceArray<__nv_bfloat16>;
  using RankArrays = std::vector<std::unique_ptr<Array>>;  // one array per rank, on its device

  OpProblem problem;
  std::vector<int> devices;
  Communicator* comm = nullptr;
  std::vector<cudaStream_t> streams;

  LocalRanks(const OpProblem& p, double timeout_s, std::vector<int> rank_devices)
      : problem(p), devices(rank_devices.empty() ? std::vector<int>(p.world_size, 0) : rank_devices) {
    CommunicatorOptions options = capacity_for(p);
    options.peer_timeout_s = timeout_s;
    const Status s = communicator_create_local(devices.data(), p.world_size, options, &comm);
    EXPECT_TRUE(s.ok()) << s.to_string();
    streams.assign(p.world_size, nullptr);
  }
  ~LocalRanks() {
    if (comm != nullptr) communicator_destroy(comm);
  }
  LocalRanks(const LocalRanks&) = delete;
  LocalRanks& operator=(const LocalRanks&) = delete;

  // Calls fn(r) for every rank with its device current; device 0 is current after.
  template <class Fn>
  void on_each_rank(Fn&& fn) {
    for (int r = 0; r < problem.world_size; ++r) {
      cudaSetDevice(devices[r]);
      fn(r);
    }
    cudaSetDevice(0);
  }

  // An array of `count` elements for every rank.
  RankArrays ranks_arrays(size_t count) {
    RankArrays arrays;
    on_each_rank([&](int) { arrays.emplace_back(new Array(count)); });
    return arrays;
  }

  // Waits for every rank's device: the first error.
  cudaError_t synchronize() {
    cudaError_t first = cudaSuccess;
    on_each_rank([&](int) {
      const cudaError_t err = cudaDeviceSynchronize();
      if (first == cudaSuccess) first = err;
    });
    return first;
  }
};

// The device pointers of ranks [0, count) of `arrays`.
template <class Pointer, class RankArrays>
std::vector<Pointer> pointers(const RankArrays& arrays, int count) {
  std::vector<Pointer> result;
  for (int r = 0; r < count; ++r) result.push_back(arrays[r]->ptr);
  return result;
}

}  // namespace tpfuse::testing
