// One process per GPU, as PyTorch and Megatron run: P ranks are forked processes, each with its own
// NCCL communicator on its own GPU, wrapped by communicator_create. Every rank checks its rows:
// exact mode bit for bit, random mode within 1.1x of the real unfused path (cuBLAS, then
// ncclReduceScatter) over the whole output, and back-to-back calls with random M.
//
// P = every visible GPU (at most 8); with fewer than 2 it skips (exit 77). TPFUSE_TEST_RANKS=N runs
// N ranks instead (N = 1 exercises the harness on one GPU). The parent bounds the whole run.
#include <cublas_v2.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_testing.cuh"
#include "tpfuse/tpfuse.h"

namespace tpfuse::testing {
namespace {

constexpr int kTimeoutSeconds = 180;

struct Rank {
  int rank = 0;
  int world_size = 1;
  ncclComm_t nccl = nullptr;
  Communicator* comm = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int failures = 0;

  void fail(const std::string& what) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what.c_str());
    ++failures;
  }
  bool ok(const Status& s, const char* what) {
    if (!s.ok()) fail(std::string(what) + ": " + s.to_string());
    return s.ok();
  }
};

// Rank q's inputs, the same in every process: seeded by (seed, q).
void fill_inputs(const Problem& p, int q, bool exact, uint64_t seed, __nv_bfloat16* a, __nv_bfloat16* w) {
  (exact ? fill_small_ints : fill_random)(a, size_t(p.m) * p.k_per_rank, seed * 1000 + 2 * q);
  (exact ? fill_small_ints : fill_random)(w, size_t(p.k_per_rank) * p.n, seed * 1000 + 2 * q + 1);
}

// This rank's rows of sum_q A_q @ W_q in FP32, every partial recomputed here from its seed.
std::vector<float> reference_rows(const Rank& r, const Problem& p, bool exact, uint64_t seed) {
  DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n);
  DeviceArray<float> partial(size_t(p.m) * p.n);
  const size_t rows = size_t(p.rows_per_rank()) * p.n;
  std::vector<float> sum(rows, 0.0f);
  for (int q = 0; q < r.world_size; ++q) {
    fill_inputs(p, q, exact, seed, a.ptr, w.ptr);
    reference_gemm(p, a.ptr, w.ptr, partial.ptr);
    const std::vector<float> host = partial.to_host();
    for (size_t i = 0; i < rows; ++i) sum[i] += host[size_t(r.rank) * rows + i];
  }
  return sum;
}

// docs/SPEC.md's measures over the whole output: this rank's error sums merged with every other rank's.
ErrorStats whole_output(Rank& r, const std::vector<__nv_bfloat16>& out, const std::vector<float>& ref) {
  const ErrorSums mine = error_sums(out, ref);
  double stats[4] = {mine.max_abs_diff, mine.max_abs_ref, mine.sum_sq_diff, mine.sum_sq_ref};
  double nonfinite = double(mine.num_nonfinite);
  DeviceArray<double> maxes(2), sums(3);
  cudaMemcpy(maxes.ptr, stats, 2 * sizeof(double), cudaMemcpyHostToDevice);
  cudaMemcpy(sums.ptr, stats + 2, 2 * sizeof(double), cudaMemcpyHostToDevice);
  cudaMemcpy(sums.ptr + 2, &nonfinite, sizeof(double), cudaMemcpyHostToDevice);
  ncclAllReduce(maxes.ptr, maxes.ptr, 2, ncclDouble, ncclMax, r.nccl, r.stream);
  ncclAllReduce(sums.ptr, sums.ptr, 3, ncclDouble, ncclSum, r.nccl, r.stream);
  cudaStreamSynchronize(r.stream);
  cudaMemcpy(stats, maxes.ptr, 2 * sizeof(double), cudaMemcpyDeviceToHost);
  cudaMemcpy(stats + 2, sums.ptr, 2 * sizeof(double), cudaMemcpyDeviceToHost);
  cudaMemcpy(&nonfinite, sums.ptr + 2, sizeof(double), cudaMemcpyDeviceToHost);
  ErrorSums all;
  all.max_abs_diff = stats[0];
  all.max_abs_ref = stats[1];
  all.sum_sq_diff = stats[2];
  all.sum_sq_ref = stats[3];
  all.num_nonfinite = uint64_t(nonfinite);
  return all.stats();
}

void check_exact(Rank& r) {
  const Problem p{int64_t(r.world_size) * 200, 776, 256 / r.world_size, r.world_size};
  DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n),
      out(size_t(p.rows_per_rank()) * p.n);
  fill_inputs(p, r.rank, true, 1, a.ptr, w.ptr);
  poison(out.ptr, out.count);
  if (!r.ok(gemm_reduce_scatter(r.comm, p, a.ptr, w.ptr, nullptr, out.ptr, r.stream), "exact call")) return;
  cudaStreamSynchronize(r.stream);
  if (!r.ok(communicator_status(r.comm), "exact call status")) return;
  const int64_t bad = first_mismatch(out.to_host(), reference_rows(r, p, true, 1));
  if (bad >= 0) r.fail("exact mode: first mismatch at " + element_at(bad, p.n));
}

void check_random(Rank& r) {
  const Problem p{int64_t(r.world_size) * 256, 2048, 512, r.world_size};
  DeviceArray<__nv_bfloat16> a(size_t(p.m) * p.k_per_rank), w(size_t(p.k_per_rank) * p.n),
      out(size_t(p.rows_per_rank()) * p.n), partial(size_t(p.m) * p.n), unfused(size_t(p.rows_per_rank()) * p.n);
  fill_inputs(p, r.rank, false, 2, a.ptr, w.ptr);
  poison(out.ptr, out.count);
  if (!r.ok(gemm_reduce_scatter(r.comm, p, a.ptr, w.ptr, nullptr, out.ptr, r.stream), "random call")) return;
  // The unfused path on the same inputs: cuBLAS (row-major C = A W^T for an N x K weight), then NCCL.
  const float alpha = 1, beta = 0;
  cublasSetStream(r.cublas, r.stream);
  cublasGemmEx(r.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(p.n), int(p.m), int(p.k_per_rank), &alpha, w.ptr, CUDA_R_16BF,
               int(p.k_per_rank), a.ptr, CUDA_R_16BF, int(p.k_per_rank), &beta, partial.ptr, CUDA_R_16BF, int(p.n),
               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ncclReduceScatter(partial.ptr, unfused.ptr, unfused.count, ncclBfloat16, ncclSum, r.nccl, r.stream);
  cudaStreamSynchronize(r.stream);
  if (!r.ok(communicator_status(r.comm), "random call status")) return;
  const std::vector<float> ref = reference_rows(r, p, false, 2);
  const ErrorStats fused = whole_output(r, out.to_host(), ref);
  const ErrorStats base = whole_output(r, unfused.to_host(), ref);
  if (!within_tolerance(fused, base)) {
    r.fail("random mode: fused errors " + std::to_string(fused.max_rel) + " / " + std::to_string(fused.norm_rel) +
           " exceed 1.1x the unfused " + std::to_string(base.max_rel) + " / " + std::to_string(base.norm_rel));
  }
  if (r.rank == 0) {
    std::printf("random mode: fused max_rel %.3e norm_rel %.3e; unfused (cuBLAS + ncclReduceScatter) %.3e %.3e\n",
                fused.max_rel, fused.norm_rel, base.max_rel, base.norm_rel);
  }
}

// Back-to-back calls with the same random M on every rank (same seed), no host sync; the last checked.
void check_back_to_back(Rank& r) {
  const int p = r.world_size;
  const Problem max_problem{int64_t(p) * 256, 1024, 256 / p, p};
  DeviceArray<__nv_bfloat16> a(size_t(max_problem.m) * max_problem.k_per_rank),
      w(size_t(max_problem.k_per_rank) * max_problem.n), out(size_t(max_problem.rows_per_rank()) * max_problem.n);
  std::mt19937 rng(7);
  Problem last = max_problem;
  for (int call = 0; call < 200; ++call) {
    last = Problem{int64_t(p) * int64_t(1 + rng() % 256), max_problem.n, max_problem.k_per_rank, p};
    if (call == 0) fill_inputs(max_problem, r.rank, true, 3, a.ptr, w.ptr);
    if (!r.ok(gemm_reduce_scatter(r.comm, last, a.ptr, w.ptr, nullptr, out.ptr, r.stream), "back-to-back call")) return;
  }
  cudaStreamSynchronize(r.stream);
  if (!r.ok(communicator_status(r.comm), "back-to-back status")) return;
  // The inputs of the last call are the first rows of the max-size ones.
  std::vector<__nv_bfloat16> got = out.to_host();
  got.resize(size_t(last.rows_per_rank()) * last.n);
  DeviceArray<__nv_bfloat16> a_q(a.count), w_q(w.count);
  DeviceArray<float> partial(size_t(last.m) * last.n);
  std::vector<float> ref(got.size(), 0.0f);
  for (int q = 0; q < p; ++q) {
    fill_inputs(max_problem, q, true, 3, a_q.ptr, w_q.ptr);
    reference_gemm(last, a_q.ptr, w_q.ptr, partial.ptr);
    const std::vector<float> host = partial.to_host();
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += host[size_t(r.rank) * ref.size() + i];
  }
  const int64_t bad = first_mismatch(got, ref);
  if (bad >= 0) r.fail("back-to-back: last call (m = " + std::to_string(last.m) + ") first mismatch at row " +
                       std::to_string(bad / last.n) + ", column " + std::to_string(bad % last.n));
}

int run_rank(int rank, int world_size, int id_fd) {
  Rank r;
  r.rank = rank;
  r.world_size = world_size;
  ncclUniqueId id;
  if (read(id_fd, &id, sizeof(id)) != ssize_t(sizeof(id))) return 2;
  cudaSetDevice(rank);
  if (ncclCommInitRank(&r.nccl, world_size, id, rank) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: ncclCommInitRank failed\n", rank);
    return 1;
  }
  cudaStreamCreate(&r.stream);
  cublasCreate(&r.cublas);
  CommunicatorOptions options;
  options.max_m = int64_t(world_size) * 256;
  options.max_n = 2048;
  options.peer_timeout_s = 20;
  if (r.ok(communicator_create(r.nccl, options, &r.comm), "communicator_create")) {
    check_exact(r);
    check_random(r);
    check_back_to_back(r);
    r.ok(communicator_destroy(r.comm), "communicator_destroy");
  }
  cublasDestroy(r.cublas);
  ncclCommDestroy(r.nccl);
  std::printf("rank %d of %d: %s\n", rank, world_size, r.failures == 0 ? "passed" : "FAILED");
  return r.failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tpfuse::testing

int main() {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);  // NVLink multicast stays off
  // The parent touches no CUDA (children inherit nothing of it): the GPU count comes from a child.
  int count_pipe[2];
  if (pipe(count_pipe) != 0) return 1;
  if (fork() == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (write(count_pipe[1], &count, sizeof(count)) != ssize_t(sizeof(count))) _exit(1);
    _exit(0);
  }
  int count = 0;
  if (read(count_pipe[0], &count, sizeof(count)) != ssize_t(sizeof(count))) count = 0;
  wait(nullptr);
  const char* forced = std::getenv("TPFUSE_TEST_RANKS");
  const int world_size = forced != nullptr ? std::atoi(forced) : std::min(count, tpfuse::kMaxWorldSize);
  if (world_size < 1 || world_size > count || (forced == nullptr && world_size < 2)) {
    std::printf("SKIPPED: one process per GPU needs 2 or more GPUs (%d visible; TPFUSE_TEST_RANKS=N runs N ranks)\n",
                count);
    return 77;
  }

  // Rank 0 makes the NCCL id and hands it to every rank through its own pipe.
  std::vector<int> id_read(world_size), id_write(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    id_read[rank] = fds[0];
    id_write[rank] = fds[1];
  }
  std::vector<pid_t> children;
  for (int rank = 0; rank < world_size; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (rank == 0) {
        ncclUniqueId id;
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(1);
        for (int q = 0; q < world_size; ++q) {
          if (write(id_write[q], &id, sizeof(id)) != ssize_t(sizeof(id))) _exit(1);
        }
      }
      const int rc = tpfuse::testing::run_rank(rank, world_size, id_read[rank]);
      std::fflush(nullptr);  // _exit does not flush stdio
      _exit(rc);
    }
    children.push_back(pid);
  }

  // Every rank must finish within the bound; one that does not fails the test (no hang).
  int failed = 0;
  const int timeout_s = tpfuse::testing::kTimeoutSeconds;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  size_t done = 0;
  std::vector<bool> finished(children.size(), false);
  while (done < children.size()) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (finished[i]) continue;
      int status = 0;
      if (waitpid(children[i], &status, WNOHANG) == children[i]) {
        finished[i] = true;
        ++done;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("FAILED: ranks still running after %d s; killing them\n", timeout_s);
      for (size_t i = 0; i < children.size(); ++i) {
        if (!finished[i]) kill(children[i], SIGKILL);
      }
      return 1;
    }
    usleep(10000);
  }
  std::printf("%d of %d ranks passed\n", world_size - failed, world_size);
  return failed == 0 ? 0 : 1;
}
