/* The part of NCCL's host API that tpfuse calls, declared for builds with TPFUSE_NCCL_DEVICE_API=OFF
 * (the Python package). These declarations are NCCL's stable C ABI (types and signatures unchanged
 * since NCCL 2.13); src/capi/nccl_runtime.cpp defines each function by forwarding to the libnccl.so.2
 * the process already runs (PyTorch's), found at run time. So such a build needs no NCCL headers or
 * library, and runs with any NCCL from TPFUSE_NCCL_MIN_VERSION_CODE on. */
#ifndef TPFUSE_NCCL_HOST_NCCL_H_
#define TPFUSE_NCCL_HOST_NCCL_H_

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclGetLastError, the newest function below, came with NCCL 2.13. */
#define TPFUSE_NCCL_MIN_VERSION_CODE 21300

typedef struct ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* Only the byte type is used (handles are exchanged as bytes). */
typedef enum { ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1 } ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* TPFUSE_NCCL_HOST_NCCL_H_ */
