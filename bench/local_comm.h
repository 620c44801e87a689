// A tpfuse local communicator (one process, rank r on devices[r]) for one shape of a sweep: sized
// for the problem, destroyed when it goes away. Every tpfuse Status it gets is checked: a bad one
// throws OpFailed, which the mode records for the shape.
#pragma once

#include <vector>

#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

class LocalCommunicator {
 public:
  LocalCommunicator() = default;
  // Destroys it if destroy() did not (a Status there cannot be reported).
  ~LocalCommunicator();
  LocalCommunicator(const LocalCommunicator&) = delete;
  LocalCommunicator& operator=(const LocalCommunicator&) = delete;

  // communicator_create_local with options.max_m = problem.m, options.max_n = problem.n and the
  // library's default peer timeout.
  void create(const std::vector<int>& devices, const Problem& problem);
  // The same for the all-gather + GEMM: max_n = problem.n_per_rank, max_k = problem.k.
  void create(const std::vector<int>& devices, const AllGatherProblem& problem);
  // Null until create() succeeds, and after destroy().
  Communicator* get() const { return comm_; }
  // communicator_status: throws if a call so far timed out waiting for a peer. Synchronize first.
  void check_status() const;
  // communicator_destroy (it waits for the devices).
  void destroy();

 private:
  Communicator* comm_ = nullptr;
};

}  // namespace tpfuse::bench
