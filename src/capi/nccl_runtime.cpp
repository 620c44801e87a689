// NCCL's host API (nccl_host/nccl.h) for builds with TPFUSE_NCCL_DEVICE_API=OFF: each function forwards
// to the libnccl.so.2 the process already runs, resolved once by tpfuse_nccl_open (or, at the first
// call, the libnccl.so.2 already loaded). The definitions are local to libtpfuse.so (its version
// script exports tpfuse_* only), so they never interpose on the real library's.
#include "capi/nccl_runtime.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace tpfuse {
namespace {

struct Functions {
  ncclResult_t (*get_version)(int*);
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_count)(const ncclComm_t, int*);
  ncclResult_t (*comm_cu_device)(const ncclComm_t, int*);
  ncclResult_t (*comm_user_rank)(const ncclComm_t, int*);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  const char* (*get_error_string)(ncclResult_t);
  const char* (*get_last_error)(ncclComm_t);
};

std::mutex open_mutex;
Functions functions{};
const Functions* opened = nullptr;  // set once, under open_mutex; never reset

template <class F>
bool resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  return *out != nullptr;
}

Status open_locked(const char* path) {
  if (opened != nullptr) return Status::Ok();
  // Without a path: only a libnccl.so.2 the process has already loaded (RTLD_NOLOAD), never another.
  void* handle = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL)
                                 : dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Status::Unsupported(path != nullptr
                                   ? std::string("cannot load NCCL from ") + path + ": " + (why ? why : "")
                                   : std::string("no libnccl.so.2 is loaded in this process (import torch, whose "
                                                 "NCCL tpfuse uses, or pass its path to tpfuse_nccl_open)"));
  }
  Functions f{};
  std::string missing;
  resolve(handle, "ncclGetVersion", &f.get_version, &missing);
  resolve(handle, "ncclGetUniqueId", &f.get_unique_id, &missing);
  resolve(handle, "ncclCommInitRank", &f.comm_init_rank, &missing);
  resolve(handle, "ncclCommDestroy", &f.comm_destroy, &missing);
  resolve(handle, "ncclCommCount", &f.comm_count, &missing);
  resolve(handle, "ncclCommCuDevice", &f.comm_cu_device, &missing);
  resolve(handle, "ncclCommUserRank", &f.comm_user_rank, &missing);
  resolve(handle, "ncclAllGather", &f.all_gather, &missing);
  resolve(handle, "ncclGetErrorString", &f.get_error_string, &missing);
  resolve(handle, "ncclGetLastError", &f.get_last_error, &missing);
  const std::string where = path != nullptr ? path : "libnccl.so.2";
  const std::string floor = std::to_string(TPFUSE_NCCL_MIN_VERSION_CODE / 10000) + "." +
                            std::to_string(TPFUSE_NCCL_MIN_VERSION_CODE % 10000 / 100);
  if (!missing.empty()) {
    dlclose(handle);
    return Status::Unsupported(where + " lacks " + missing + ": tpfuse needs NCCL " + floor + " or later");
  }
  int version = 0;
  if (f.get_version(&version) != ncclSuccess || version < TPFUSE_NCCL_MIN_VERSION_CODE) {
    dlclose(handle);
    return Status::Unsupported(where + " is NCCL " + std::to_string(version) + ": tpfuse needs NCCL " + floor +
                               " or later (upgrade torch, or its nvidia-nccl package)");
  }
  functions = f;
  opened = &functions;  // the handle stays open for the process's life
  return Status::Ok();
}

const Functions* table() {
  std::lock_guard<std::mutex> lock(open_mutex);
  if (opened == nullptr) open_locked(nullptr);
  return opened;
}

}  // namespace

Status nccl_open(const char* path) {
  std::lock_guard<std::mutex> lock(open_mutex);
  return open_locked(path);
}

}  // namespace tpfuse

using tpfuse::table;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  const auto* f = table();
  return f ? f->get_version(version) : ncclInvalidUsage;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  const auto* f = table();
  return f ? f->get_unique_id(unique_id) : ncclInvalidUsage;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  const auto* f = table();
  return f ? f->comm_init_rank(comm, nranks, comm_id, rank) : ncclInvalidUsage;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const auto* f = table();
  return f ? f->comm_destroy(comm) : ncclInvalidUsage;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  const auto* f = table();
  return f ? f->comm_count(comm, count) : ncclInvalidUsage;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  const auto* f = table();
  return f ? f->comm_cu_device(comm, device) : ncclInvalidUsage;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  const auto* f = table();
  return f ? f->comm_user_rank(comm, rank) : ncclInvalidUsage;
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  const auto* f = table();
  return f ? f->all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream) : ncclInvalidUsage;
}
const char* ncclGetErrorString(ncclResult_t result) {
  const auto* f = table();
  return f ? f->get_error_string(result) : "NCCL is not loaded in this process";
}
const char* ncclGetLastError(ncclComm_t comm) {
  const auto* f = table();
  return f ? f->get_last_error(comm) : "";
}

}  // extern "C"
