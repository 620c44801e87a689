// Status: what every tpfuse call returns. The library never exits; it reports.
#pragma once

#include <string>
#include <utility>

namespace tpfuse {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a shape, pointer, rank or option the caller got wrong
  kUnsupported,      // valid, but not supported on this device or build
  kCudaError,        // a CUDA runtime/driver call failed
  kNcclError,        // an NCCL call failed
  kPeerTimeout,      // a peer never arrived: a bounded cross-GPU wait expired
  kInternal,         // a bug in tpfuse
};

const char* to_string(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>", for logs.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Propagates a non-ok Status to the caller.
#define TPFUSE_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::tpfuse::Status _tpfuse_status = (expr); \
    if (!_tpfuse_status.ok()) return _tpfuse_status; \
  } while (0)

}  // namespace tpfuse
