// Mode p2p: what one GPU can write into another's memory, by the three means a fused kernel or a
// collective has: SM stores (every thread writes 16-byte vectors through the peer mapping), TMA
// stores (64 x 64 BF16 boxes from shared memory into a row-major matrix of 8192 columns, as the
// fused op pushes its tiles), and the copy engine (cudaMemcpyPeerAsync). GPU 0 -> 1 and 1 -> 0, a
// few sizes, one direction at a time; each time is the median of the timed iterations. The last
// element written by each kernel is checked on the host.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ptx.cuh"
#include "modes.h"
#include "core/tensor_map.h"

namespace tpfuse::bench {

namespace {

constexpr uint32_t kPattern = 0x3f803f80u;  // two BF16 1.0
constexpr int kMatrixCols = 8192;           // the sweep's widest N: rows of 16 KB
constexpr int kBoxElems = 64 * 64;
constexpr int kTmaBuffers = 4;              // shared-memory boxes a CTA stores from, round robin
constexpr int kTmaInFlight = 8;             // bulk groups a CTA keeps in flight

__global__ void sm_store_kernel(uint4* dst, size_t count) {
  const uint4 value = make_uint4(kPattern, kPattern, kPattern, kPattern);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

// Each CTA's first thread stores every gridDim.x-th box of the matrix from its shared buffers.
__global__ void tma_store_kernel(const __grid_constant__ CUtensorMap matrix, int box_rows_total, int box_cols_total) {
  __shared__ __align__(1024) uint32_t buffers[kTmaBuffers][kBoxElems / 2];
  for (int i = threadIdx.x; i < kTmaBuffers * kBoxElems / 2; i += blockDim.x) (&buffers[0][0])[i] = kPattern;
  ptx::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int num_boxes = box_rows_total * box_cols_total;
  int issued = 0;
  for (int box = blockIdx.x; box < num_boxes; box += gridDim.x, ++issued) {
    ptx::tma_store_2d(&matrix, buffers[issued % kTmaBuffers], (box % box_cols_total) * 64,
                               (box / box_cols_total) * 64);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<kTmaInFlight - 1>();
  }
  ptx::bulk_wait_group<0>();
}

std::vector<Column> p2p_columns() {
  return {
      {"method", "method", 12, Format::kText},
      {"src", "src", 4, Format::kInteger},
      {"dst", "dst", 4, Format::kInteger},
      {"mbytes", "MB", 6, Format::kInteger},
      {"t_ms", "time(ms)", 10, Format::kFixed, 4},
      {"gbps", "GB/s", 8, Format::kFixed, 1},
      {"status", "status", 0, Format::kText},
  };
}

void enable_peer_access(int device, int peer) {
  TESTING_CHECK(cudaSetDevice(device));
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
  } else {
    TESTING_CHECK(err);
  }
}

// The last 4 bytes of `buffer` on its device hold the pattern.
bool ends_with_pattern(const DeviceBuffer& buffer) {
  uint32_t last = 0;
  TESTING_CHECK(cudaMemcpy(&last, buffer.as<uint8_t>() + buffer.bytes() - 4, 4, cudaMemcpyDeviceToHost));
  return last == kPattern;
}

}  // namespace

void run_p2p(const Options& options, Report& report) {
  if (options.gpus < 2) {
    report.add_note("p2p mode needs 2 GPUs (" + std::to_string(options.gpus) + " in use)");
    return;
  }
  GpuSet gpus(2, /*with_nccl=*/false);
  enable_peer_access(gpus[0].device, gpus[1].device);
  enable_peer_access(gpus[1].device, gpus[0].device);
  report.set_columns(p2p_columns());
  report.add_note("bytes written by the source GPU into the destination's memory, one direction at a time; "
                  "time: median of " + std::to_string(options.iters) + " after " + std::to_string(options.warmup) +
                  " warm-up; GB/s = bytes / time");
  report.add_note("sm: 16-byte stores from 4 CTAs x 512 threads per SM; tma: 64 x 64 BF16 boxes from shared memory, "
                  "2 CTAs per SM, " + std::to_string(kTmaInFlight) + " bulk groups in flight each; ce: cudaMemcpyPeerAsync");
  report.print_header();

  int num_sms = 0;
  TESTING_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, gpus[0].device));
  const TimingOptions timing = timing_options(options);
  double best_tma_gbps = 0;
  for (int src = 0; src < 2; ++src) {
    const int dst = 1 - src;
    for (size_t mbytes : {16, 64, 256}) {
      const size_t bytes = mbytes << 20;
      const int rows = int(bytes / (kMatrixCols * 2));
      DeviceBuffer source(gpus[src].device, bytes);
      DeviceBuffer target(gpus[dst].device, bytes);
      TESTING_CHECK(cudaSetDevice(gpus[src].device));
      sm_store_kernel<<<num_sms, 512, 0, gpus[src].stream>>>(source.as<uint4>(), bytes / sizeof(uint4));
      TESTING_CHECK(cudaGetLastError());
      CUtensorMap matrix{};
      if (const Status s = make_tensor_map(DType::kBF16, target.get(), rows, kMatrixCols, kMatrixCols, 64, 64, &matrix); !s.ok()) {
        throw CallFailed("tensor map of the destination: " + s.to_string());
      }
      gpus.synchronize();

      const auto launch = [&](const char* method) {
        TESTING_CHECK(cudaSetDevice(gpus[src].device));
        const cudaStream_t stream = gpus[src].stream;
        const std::string name = method;
        if (name == "sm") {
          sm_store_kernel<<<num_sms * 4, 512, 0, stream>>>(target.as<uint4>(), bytes / sizeof(uint4));
        } else if (name == "tma") {
          tma_store_kernel<<<num_sms * 2, 128, 0, stream>>>(matrix, rows / 64, kMatrixCols / 64);
        } else {
          TESTING_CHECK(cudaMemcpyPeerAsync(target.get(), gpus[dst].device, source.get(), gpus[src].device, bytes, stream));
        }
        TESTING_CHECK(cudaGetLastError());
      };
      for (const char* method : {"sm", "tma", "ce"}) {
        TESTING_CHECK(cudaSetDevice(gpus[dst].device));
        TESTING_CHECK(cudaMemset(target.get(), 0, bytes));
        const double ms = time_median_ms(gpus, timing, [&](int) { launch(method); });
        const double gbps = double(bytes) / (ms * 1e-3) / 1e9;
        const bool ok = ends_with_pattern(target);
        if (!ok) report.count_failure();
        if (std::string(method) == "tma") best_tma_gbps = std::max(best_tma_gbps, gbps);
        report.add_row({{"method", std::string(method)}, {"src", double(src)}, {"dst", double(dst)},
                        {"mbytes", double(mbytes)}, {"t_ms", ms}, {"gbps", gbps},
                        {"status", std::string(ok ? "ok" : "WRONG: last element not written")}});
      }
    }
  }
  report.set_summary("p2p: best TMA-store bandwidth " + std::to_string(int(best_tma_gbps)) + " GB/s",
                     {{"best_tma_gbps", best_tma_gbps}});
}

}  // namespace tpfuse::bench
