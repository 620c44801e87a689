#include "local_comm.h"

#include "testing/cuda_errors.h"

namespace tpfuse::bench {

LocalCommunicator::~LocalCommunicator() {
  if (comm_ != nullptr) communicator_destroy(comm_);
}

void LocalCommunicator::create(const std::vector<int>& devices, const Problem& problem) {
  CommunicatorOptions options;
  options.max_m = problem.m;
  options.max_n = problem.n;
  testing::check_op(communicator_create_local(devices.data(), int(devices.size()), options, &comm_));
}

void LocalCommunicator::create(const std::vector<int>& devices, const AllGatherProblem& problem) {
  CommunicatorOptions options;
  options.max_m = problem.m;
  options.max_n = problem.n_per_rank;
  options.max_k = problem.k;
  testing::check_op(communicator_create_local(devices.data(), int(devices.size()), options, &comm_));
}

void LocalCommunicator::check_status() const { testing::check_op(communicator_status(comm_)); }

void LocalCommunicator::destroy() {
  Communicator* comm = comm_;
  comm_ = nullptr;
  testing::check_op(communicator_destroy(comm));
}

}  // namespace tpfuse::bench
