// The fused ops' test fixture: P ranks of one local communicator in this process, rank r on
// devices[r] (by default all on device 0: ranks emulated on one GPU, all their CTAs resident in one
// cooperative launch), each with its BF16 operands and outputs. An op's fixture adds its arrays
// (ranks_arrays) and its call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
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

// Local ranks 0 .. count-1: a call's ranks (emulated where they share a device,
// testing/emulated_ranks.h), all of them or the first ones only (the others never run: a missing peer).
inline std::vector<int> first_ranks(int count) {
  std::vector<int> ranks(count);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// The device pointers of ranks [0, count) of `arrays`.
template <class Pointer, class RankArrays>
std::vector<Pointer> pointers(const RankArrays& arrays, int count) {
  std::vector<Pointer> result;
  for (int r = 0; r < count; ++r) result.push_back(arrays[r]->ptr);
  return result;
}

// Ranks 0 and 1 of `ranks`, both on device 0: the library's call of them (`library_call`) returns
// kUnsupported, naming them and the testing library, which alone emulates ranks that share a
// device, as the fixture's run does.
template <class Ranks, class LibraryCall>
void expect_only_testing_emulates(Ranks& ranks, LibraryCall&& library_call) {
  ASSERT_NE(ranks.comm, nullptr);
  ranks.fill(/*exact=*/true, 1);
  const Status s = library_call();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("ranks 0 and 1 share device 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("testing library"), std::string::npos) << s.message();
  const Status emulated = ranks.run(ranks.problem);
  EXPECT_TRUE(emulated.ok()) << emulated.to_string();
  ASSERT_CUDA(ranks.synchronize());
}

}  // namespace tpfuse::testing
