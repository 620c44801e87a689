// The C ABI (tpfuse_c.h): each function turns its plain arguments into the C++ API's, and its Status
// into a code plus this thread's last-error message. No C++ exception crosses the boundary.
#include "tpfuse/tpfuse_c.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <exception>
#include <string>

#include "capi/nccl_runtime.h"
#include "comm/communicator.h"
#include "tpfuse/tpfuse.h"

using tpfuse::Status;
using tpfuse::StatusCode;

static_assert(TPFUSE_OK == int(StatusCode::kOk) && TPFUSE_INVALID_ARGUMENT == int(StatusCode::kInvalidArgument) &&
                  TPFUSE_UNSUPPORTED == int(StatusCode::kUnsupported) &&
                  TPFUSE_CUDA_ERROR == int(StatusCode::kCudaError) &&
                  TPFUSE_NCCL_ERROR == int(StatusCode::kNcclError) &&
                  TPFUSE_PEER_TIMEOUT == int(StatusCode::kPeerTimeout) &&
                  TPFUSE_INTERNAL == int(StatusCode::kInternal),
              "the C status codes are tpfuse::StatusCode's values");
static_assert(sizeof(ncclUniqueId) == TPFUSE_NCCL_UNIQUE_ID_BYTES, "TPFUSE_NCCL_UNIQUE_ID_BYTES is sizeof(ncclUniqueId)");

namespace {

thread_local std::string last_error;

int report(const Status& status) {
  last_error = status.message();
  return int(status.code());
}

// Runs `body` (which returns a Status) and reports its outcome.
template <class Body>
int guarded(Body&& body) {
  try {
    return report(body());
  } catch (const std::exception& e) {
    return report(Status::Internal(std::string("C++ exception at the C boundary: ") + e.what()));
  } catch (...) {
    return report(Status::Internal("unknown C++ exception at the C boundary"));
  }
}

// NCCL's message for `result`, with its last error's detail where it has one.
Status nccl_status(ncclResult_t result, const char* call) {
  if (result == ncclSuccess) return Status::Ok();
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(result);
  if (const char* detail = ncclGetLastError(nullptr); detail != nullptr && detail[0] != '\0') {
    message += std::string(" (") + detail + ")";
  }
  return Status(StatusCode::kNcclError, message);
}

Status cuda_status(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string(call) + " failed: " + cudaGetErrorString(error));
}

// A tpfuse_communicator* is a tpfuse::Communicator* (the C type is never defined).
tpfuse::Communicator* from_handle(tpfuse_communicator* comm) { return reinterpret_cast<tpfuse::Communicator*>(comm); }
const tpfuse::Communicator* from_handle(const tpfuse_communicator* comm) {
  return reinterpret_cast<const tpfuse::Communicator*>(comm);
}

Status weight_layout_of(int code, tpfuse::WeightLayout* layout) {
  switch (code) {
    case TPFUSE_WEIGHT_KXN: *layout = tpfuse::WeightLayout::kKxN; return Status::Ok();
    case TPFUSE_WEIGHT_NXK: *layout = tpfuse::WeightLayout::kNxK; return Status::Ok();
    default:
      return Status::InvalidArgument("weight_layout = " + std::to_string(code) +
                                     " is neither TPFUSE_WEIGHT_KXN (0) nor TPFUSE_WEIGHT_NXK (1)");
  }
}

Status dtype_of(int code, tpfuse::DType* dtype) {
  switch (code) {
    case TPFUSE_DTYPE_BF16: *dtype = tpfuse::DType::kBF16; return Status::Ok();
    case TPFUSE_DTYPE_E4M3: *dtype = tpfuse::DType::kE4M3; return Status::Ok();
    default:
      return Status::InvalidArgument("dtype = " + std::to_string(code) +
                                     " is neither TPFUSE_DTYPE_BF16 (0) nor TPFUSE_DTYPE_E4M3 (1)");
  }
}

// The inputs' scaling and accumulation codes (tpfuse_c.h), into the problem's.
Status scaling_of(int scaling_code, int accumulation_code, tpfuse::Scaling* scaling,
                  tpfuse::Accumulation* accumulation) {
  switch (scaling_code) {
    case TPFUSE_SCALING_NONE: *scaling = tpfuse::Scaling::kNone; break;
    case TPFUSE_SCALING_TENSORWISE: *scaling = tpfuse::Scaling::kTensorwise; break;
    case TPFUSE_SCALING_ROWWISE: *scaling = tpfuse::Scaling::kRowwise; break;
    case TPFUSE_SCALING_BLOCKWISE: *scaling = tpfuse::Scaling::kBlockwise; break;
    default:
      return Status::InvalidArgument("scaling = " + std::to_string(scaling_code) +
                                     " is not TPFUSE_SCALING_NONE (0), _TENSORWISE (1), _ROWWISE (2) or _BLOCKWISE (3)");
  }
  switch (accumulation_code) {
    case TPFUSE_ACCUMULATION_PROMOTED: *accumulation = tpfuse::Accumulation::kPromoted; return Status::Ok();
    case TPFUSE_ACCUMULATION_FAST: *accumulation = tpfuse::Accumulation::kFast; return Status::Ok();
    default:
      return Status::InvalidArgument("accumulation = " + std::to_string(accumulation_code) +
                                     " is neither TPFUSE_ACCUMULATION_PROMOTED (0) nor TPFUSE_ACCUMULATION_FAST (1)");
  }
}

}  // namespace

extern "C" {

int tpfuse_c_api_version(void) { return TPFUSE_C_API_VERSION; }

const char* tpfuse_last_error(void) { return last_error.c_str(); }

int tpfuse_nccl_open(const char* path) {
  return guarded([&] {
#if TPFUSE_NCCL_DEVICE_API
    (void)path;  // NCCL is linked
    return Status::Ok();
#else
    return tpfuse::nccl_open(path);
#endif
  });
}

int tpfuse_nccl_versions(int* runtime_version, int* required_version, int* exact) {
  return guarded([&] {
    if (runtime_version == nullptr || required_version == nullptr || exact == nullptr) {
      return Status::InvalidArgument("runtime_version, required_version and exact must not be null");
    }
#if TPFUSE_NCCL_DEVICE_API
    *required_version = NCCL_VERSION_CODE;  // the device API is inlined: this version exactly
    *exact = 1;
#else
    *required_version = TPFUSE_NCCL_MIN_VERSION_CODE;  // the host API only: this version or later
    *exact = 0;
#endif
    return nccl_status(ncclGetVersion(runtime_version), "ncclGetVersion");
  });
}

int tpfuse_nccl_get_unique_id(void* id) {
  return guarded([&] {
    if (id == nullptr) return Status::InvalidArgument("id must not be null");
    ncclUniqueId unique_id{};
    TPFUSE_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&unique_id), "ncclGetUniqueId"));
    std::memcpy(id, &unique_id, sizeof(unique_id));
    return Status::Ok();
  });
}

int tpfuse_nccl_comm_init_rank(void** nccl_comm, int world_size, const void* id, int rank, int device) {
  return guarded([&] {
    if (nccl_comm == nullptr || id == nullptr) return Status::InvalidArgument("nccl_comm and id must not be null");
    *nccl_comm = nullptr;
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      return Status::InvalidArgument("rank " + std::to_string(rank) + " of world_size " + std::to_string(world_size) +
                                     " is out of range");
    }
    TPFUSE_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    ncclUniqueId unique_id{};
    std::memcpy(&unique_id, id, sizeof(unique_id));
    ncclComm_t comm = nullptr;
    TPFUSE_RETURN_IF_ERROR(
        nccl_status(ncclCommInitRank(&comm, world_size, unique_id, rank), "ncclCommInitRank"));
    *nccl_comm = comm;
    return Status::Ok();
  });
}

int tpfuse_nccl_comm_destroy(void* nccl_comm) {
  return guarded([&] {
    if (nccl_comm == nullptr) return Status::InvalidArgument("nccl_comm must not be null");
    return nccl_status(ncclCommDestroy(static_cast<ncclComm_t>(nccl_comm)), "ncclCommDestroy");
  });
}

int tpfuse_communicator_create(void* nccl_comm, int64_t max_m, int64_t max_n, int64_t max_k, double peer_timeout_s,
                               tpfuse_communicator** comm) {
  return guarded([&] {
    if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
    tpfuse::CommunicatorOptions options;
    options.max_m = max_m;
    options.max_n = max_n;
    options.max_k = max_k;
    options.peer_timeout_s = peer_timeout_s;
    tpfuse::Communicator* created = nullptr;
    const Status status = tpfuse::communicator_create(static_cast<ncclComm_t>(nccl_comm), options, &created);
    *comm = reinterpret_cast<tpfuse_communicator*>(created);
    return status;
  });
}

int tpfuse_communicator_destroy(tpfuse_communicator* comm) {
  return guarded([&] { return tpfuse::communicator_destroy(from_handle(comm)); });
}

int tpfuse_communicator_status(const tpfuse_communicator* comm) {
  return guarded([&] { return tpfuse::communicator_status(from_handle(comm)); });
}

int tpfuse_communicator_workspace_bytes(const tpfuse_communicator* comm, int64_t* bytes) {
  return guarded([&] {
    if (comm == nullptr || bytes == nullptr) return Status::InvalidArgument("comm and bytes must not be null");
    *bytes = int64_t(tpfuse::workspace_bytes(*from_handle(comm)));
    return Status::Ok();
  });
}

int tpfuse_gemm_reduce_scatter(tpfuse_communicator* comm, int64_t m, int64_t n, int64_t k_per_rank, int world_size,
                               int weight_layout, int dtype, int scaling, int accumulation, int64_t batch,
                               const void* a, const void* w, const float* a_scale, const float* w_scale,
                               const void* bias, void* out, void* stream) {
  return guarded([&] {
    tpfuse::Problem problem;
    problem.m = m;
    problem.n = n;
    problem.k_per_rank = k_per_rank;
    problem.world_size = world_size;
    problem.batch = batch;
    TPFUSE_RETURN_IF_ERROR(weight_layout_of(weight_layout, &problem.weight_layout));
    TPFUSE_RETURN_IF_ERROR(dtype_of(dtype, &problem.dtype));
    TPFUSE_RETURN_IF_ERROR(scaling_of(scaling, accumulation, &problem.scaling, &problem.accumulation));
    return tpfuse::gemm_reduce_scatter(from_handle(comm), problem, a, w, tpfuse::InputScales{a_scale, w_scale}, bias,
                                       out, static_cast<cudaStream_t>(stream));
  });
}

int tpfuse_gemm(int64_t m, int64_t n, int64_t k, int weight_layout, int dtype, int scaling, int accumulation,
                const void* a, const void* w, const float* a_scale, const float* w_scale, void* c, void* stream) {
  return guarded([&] {
    tpfuse::Problem problem;
    problem.m = m;
    problem.n = n;
    problem.k_per_rank = k;
    TPFUSE_RETURN_IF_ERROR(weight_layout_of(weight_layout, &problem.weight_layout));
    TPFUSE_RETURN_IF_ERROR(dtype_of(dtype, &problem.dtype));
    TPFUSE_RETURN_IF_ERROR(scaling_of(scaling, accumulation, &problem.scaling, &problem.accumulation));
    return tpfuse::gemm(problem, a, w, tpfuse::InputScales{a_scale, w_scale}, c, static_cast<cudaStream_t>(stream));
  });
}

int tpfuse_all_gather_gemm(tpfuse_communicator* comm, int64_t m, int64_t n_per_rank, int64_t k, int world_size,
                           int weight_layout, int dtype, int scaling, int accumulation, int64_t batch, const void* x,
                           const void* w, const float* x_scale, const float* w_scale, const void* bias, void* y,
                           void* gathered_x, void* stream) {
  return guarded([&] {
    tpfuse::AllGatherProblem problem;
    problem.m = m;
    problem.n_per_rank = n_per_rank;
    problem.k = k;
    problem.world_size = world_size;
    problem.batch = batch;
    TPFUSE_RETURN_IF_ERROR(weight_layout_of(weight_layout, &problem.weight_layout));
    TPFUSE_RETURN_IF_ERROR(dtype_of(dtype, &problem.dtype));
    TPFUSE_RETURN_IF_ERROR(scaling_of(scaling, accumulation, &problem.scaling, &problem.accumulation));
    return tpfuse::all_gather_gemm(from_handle(comm), problem, x, w, tpfuse::InputScales{x_scale, w_scale}, bias, y,
                                   gathered_x, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
