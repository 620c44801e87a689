// From a chosen config to a running kernel: the dispatch over the compiled variants (gemm/variants.h:
// every entry is instantiated for both weight layouts), the mainloop's tensor maps, and the launch.
// Shared by the plain GEMM and the fused ops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/tensor_map.h"
#include "gemm/config.h"
#include "gemm/mainloop.cuh"
#include "gemm/variants.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// Calls fn(MainloopConfig<...>{}) with the compiled variant `variant` in the weight's layout, the
// op's shared memory part being OpSync, which says which variants the op takes (OpSync::takes).
template <class OpSync, int I = 0, class Fn>
Status with_variant(int variant, WeightLayout layout, Fn&& fn) {
  if constexpr (I == kNumGemmVariants) {
    return Status::Internal("no compiled kernel variant " + std::to_string(variant));
  } else {
    if (variant != I) return with_variant<OpSync, I + 1>(variant, layout, fn);
    constexpr GemmVariant v = kGemmVariants[I];
    if constexpr (!OpSync::takes(v)) {
      return Status::Internal("kernel variant " + std::to_string(variant) + " is not compiled for this op");
    } else {
      if (layout == WeightLayout::kNxK) {
        return fn(kernels::MainloopConfig<v.block_m, v.block_n, v.stages, true, v.staged_chunks, v.consumers, v.dtype,
                                          v.promoted, v.block_scaled, OpSync>{});
      }
      // An MN-major (K x N) weight is BF16's only: FP8 WGMMA reads K-major operands (validate()).
      if constexpr (v.dtype != DType::kBF16) {
        return Status::Internal("kernel variant " + std::to_string(variant) + " takes an N x K weight only");
      } else {
        return fn(kernels::MainloopConfig<v.block_m, v.block_n, v.stages, false, v.staged_chunks, v.consumers,
                                          v.dtype, v.promoted, v.block_scaled, OpSync>{});
      }
    }
  }
}

// The dynamic shared memory a kernel of `Config` takes (the slack aligns the base to 1024 bytes);
// checked against what the config planned, which came from the same storage (gemm/shared_storage.h).
template <class Config>
Status kernel_smem_bytes(const GemmConfig& config, size_t* smem) {
  *smem = sizeof(typename Config::Storage) + 1024;
  if (*smem != config.smem_bytes) {
    return Status::Internal("kernel needs " + std::to_string(*smem) + " bytes of shared memory, the config planned " +
                            std::to_string(config.smem_bytes));
  }
  return Status::Ok();
}

// Launches `grid` CTAs of a kernel of `Config` (cooperatively if asked: all CTAs resident at once).
template <class Config, class Kernel, class Params>
Status launch_persistent(Kernel kernel, const Params& params, int grid, size_t smem, bool cooperative,
                         cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(Config::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  cfg.attrs = &attribute;
  cfg.numAttrs = cooperative ? 1 : 0;
  TPFUSE_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, params));
  return Status::Ok();
}

// The largest persistent grid of `kernel` that is resident at once, at most `wanted` CTAs.
template <class Config, class Kernel>
Status resident_grid(Kernel kernel, size_t smem, int wanted, int* grid) {
  TPFUSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int per_sm = 0, device = 0, sms = 0;
  TPFUSE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Config::kThreads, smem));
  TPFUSE_CUDA_TRY(cudaGetDevice(&device));
  TPFUSE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  *grid = std::min(wanted, per_sm * sms);
  if (*grid <= 0) return Status::Unsupported("no CTA of this kernel fits on the device");
  return Status::Ok();
}

// The mainloop's operands: A (m x k) and W in its layout, of the problem's dtype (the variant's). The
// tiles of the last row tile's rows (from the last multiple of kBlockM below m on) load only the rows
// left before m (rounded up to 8, whole rows of the swizzle) through a map of their own: filling the
// rest with zeros slowed the loads (docs/EXPERIMENTS.md). The rest of the stage keeps stale data,
// whose products land in rows past m, which no epilogue stores or pushes. (A tile starting there
// holds no rows past the box: it starts at or after that multiple.)
//
// E4M3 inputs come with their scales (problem.scaling): one value each (tensorwise), one per row
// of A and per output column (rowwise), or per row of A and 128 of K and per 128 x 128 block of W
// (blockwise); 4-byte aligned FP32 device pointers.
template <class Config, class Schedule>
Status make_mainloop_params(const Problem& problem, const void* a, const void* w, const InputScales& scales,
                            const Schedule& schedule, kernels::MainloopParams<Schedule>* p) {
  if (problem.dtype != Config::kDType) {
    return Status::Internal(std::string("a problem of ") + to_string(problem.dtype) + " inputs on a variant of " +
                            to_string(Config::kDType));
  }
  if constexpr (Config::kScaled) {
    for (const auto& [scale, name] : {std::pair{scales.a, "a_scale"}, std::pair{scales.w, "w_scale"}}) {
      if (scale == nullptr) {
        return Status::InvalidArgument(std::string(name) + " must not be null: " + to_string(problem.dtype) +
                                       " inputs are scaled");
      }
      if (reinterpret_cast<std::uintptr_t>(scale) % alignof(float) != 0) {
        return Status::InvalidArgument(std::string(name) + " is not 4-byte aligned");
      }
    }
    if ((problem.scaling == Scaling::kBlockwise) != Config::kBlockScaled) {
      return Status::Internal(std::string("a problem of ") + to_string(problem.scaling) + " scales on a variant " +
                              (Config::kBlockScaled ? "of" : "not of") + " blockwise ones");
    }
    const int step = problem.scaling == Scaling::kRowwise ? 1 : 0;
    p->a_scale = scales.a;
    p->w_scale = scales.w;
    p->a_scale_step = step;
    p->w_scale_step = step;
    p->scale_rows = int(problem.m);
    p->scale_cols = int(problem.n);
    p->k_scale_blocks = Config::kBlockScaled ? int(problem.k_per_rank / kScaleBlock) : 0;
  } else if (scales.a != nullptr || scales.w != nullptr) {
    return Status::InvalidArgument("scales are for E4M3 inputs: BF16 ones take none");
  }
  const int64_t m = problem.m, n = problem.n, k = problem.k_per_rank;
  TPFUSE_RETURN_IF_ERROR(make_tensor_map(problem.dtype, a, m, k, k, Config::kBlockM, Config::kBlockK, &p->a));
  const int64_t last_row = (m - 1) / Config::kBlockM * Config::kBlockM;
  const int last_rows = int((m - last_row + 7) / 8 * 8);
  TPFUSE_RETURN_IF_ERROR(make_tensor_map(problem.dtype, a, m, k, k, last_rows, Config::kBlockK, &p->a_last));
  p->a_last_row = int(last_row);
  p->a_last_bytes = last_rows * kStageRowBytes;
  // W is loaded in pieces (see MainloopConfig): K-major, half the tile's rows; MN-major, 64 columns.
  if (Config::kWeightKMajor) {
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map(problem.dtype, w, n, k, k, Config::kWPieceBoxRows, Config::kWPieceBoxCols, &p->w));
  } else {
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map(problem.dtype, w, k, n, n, Config::kWPieceBoxRows, Config::kWPieceBoxCols, &p->w));
  }
  p->schedule = schedule;
  p->num_k_blocks = int((k + Config::kBlockK - 1) / Config::kBlockK);
  return Status::Ok();
}

}  // namespace tpfuse
