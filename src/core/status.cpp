#include "tpfuse/status.h"

namespace tpfuse {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kNcclError: return "NCCL error";
    case StatusCode::kPeerTimeout: return "peer timeout";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown status";
}

std::string Status::to_string() const {
  std::string s = tpfuse::to_string(code_);
  if (!message_.empty()) s += ": " + message_;
  return s;
}

}  // namespace tpfuse
