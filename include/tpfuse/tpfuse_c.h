/* tpfuse's C ABI, for bindings (the Python package loads it with ctypes): plain integers, pointers,
 * and CUDA streams and NCCL communicators as void*. No C++ types cross it, so one build of the
 * library serves every Python and PyTorch version.
 *
 * Every function returns a status code (TPFUSE_OK or one of the errors below, the values of
 * tpfuse::StatusCode). After a failed call, tpfuse_last_error() returns its message; it is per thread,
 * and each call of this API replaces it (an empty string after a call that succeeded). */
#ifndef TPFUSE_TPFUSE_C_H_
#define TPFUSE_TPFUSE_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever a function of this header changes its arguments or meaning. */
#define TPFUSE_C_API_VERSION 7

enum {
  TPFUSE_OK = 0,
  TPFUSE_INVALID_ARGUMENT = 1, /* a shape, pointer, rank or option the caller got wrong */
  TPFUSE_UNSUPPORTED = 2,      /* valid, but not supported on this device or build */
  TPFUSE_CUDA_ERROR = 3,       /* a CUDA runtime/driver call failed */
  TPFUSE_NCCL_ERROR = 4,       /* an NCCL call failed */
  TPFUSE_PEER_TIMEOUT = 5,     /* a peer never arrived: a bounded cross-GPU wait expired */
  TPFUSE_INTERNAL = 6,         /* a bug in tpfuse */
};

/* How the weight's K-slice is stored (tpfuse::WeightLayout). */
enum {
  TPFUSE_WEIGHT_KXN = 0, /* K/P x N, row-major */
  TPFUSE_WEIGHT_NXK = 1, /* N x K/P, row-major: nn.Linear's weight */
};

/* The element type of the GEMM's inputs (tpfuse::DType): a and w, the all-gather's x (and so its
 * gathered_x). Outputs (out, c, y) and the bias are BF16 whatever it is. */
enum {
  TPFUSE_DTYPE_BF16 = 0,
  TPFUSE_DTYPE_E4M3 = 1, /* FP8 (e4m3), K-major weight (TPFUSE_WEIGHT_NXK) only, with scales */
};

/* How inputs of TPFUSE_DTYPE_E4M3 are scaled (tpfuse::Scaling): each rank's product a @ w is
 * multiplied in FP32 by a_scale * w_scale before anything else is done with it (the bias, the
 * rounding to BF16, the reduction over ranks). a_scale and w_scale are FP32 device pointers. BF16
 * inputs take TPFUSE_SCALING_NONE and null scales. */
enum {
  TPFUSE_SCALING_NONE = 0,
  TPFUSE_SCALING_TENSORWISE = 1, /* one value each */
  TPFUSE_SCALING_ROWWISE = 2,    /* a_scale: one per row of a (m; the all-gather's x: m/P), w_scale: one per
                                    output column (n; the all-gather's n_per_rank) */
  TPFUSE_SCALING_BLOCKWISE = 3,  /* a_scale: m x k_per_rank/128, one per row and 128 of K (the all-gather's
                                    x: m/P x k/128); w_scale: ceil(n/128) x k_per_rank/128, one per 128 x 128
                                    block of w; both row-major. Promoted accumulation, k_per_rank a multiple
                                    of 128 */
};

/* How FP8 products are accumulated (tpfuse::Accumulation); BF16 inputs ignore it. */
enum {
  TPFUSE_ACCUMULATION_PROMOTED = 0, /* the tensor cores' partial sums added into FP32 every 128 K */
  TPFUSE_ACCUMULATION_FAST = 1,     /* the tensor cores' own accumulation (torch's use_fast_accum) */
};

/* sizeof(ncclUniqueId). */
#define TPFUSE_NCCL_UNIQUE_ID_BYTES 128

typedef struct tpfuse_communicator tpfuse_communicator;

/* TPFUSE_C_API_VERSION of the library that is loaded. */
int tpfuse_c_api_version(void);

/* The message of this thread's last call of this API ("" if it succeeded). Valid until the next call. */
const char* tpfuse_last_error(void);

/* ---- NCCL, as the library links it ----------------------------------------------------------------- */

/* Which libnccl.so.2 the library calls. A build with TPFUSE_NCCL_DEVICE_API=OFF (the Python package)
 * links no NCCL: it resolves NCCL's host functions once, from `path` (dlopen; a library already loaded
 * is reused), or with a null path from the libnccl.so.2 already loaded in the process, at this call
 * or at the first NCCL call. TPFUSE_UNSUPPORTED if that NCCL lacks a function or is too old. A build
 * with the device API links NCCL: this does nothing. */
int tpfuse_nccl_open(const char* path);

/* The NCCL the process runs (ncclGetVersion, e.g. 22809 for 2.28.9) and the version this build needs:
 * with NCCL's device API compiled into the kernels (exact = 1), that of its headers exactly; with the
 * host API only (exact = 0), that version or later. */
int tpfuse_nccl_versions(int* runtime_version, int* required_version, int* exact);

/* ncclGetUniqueId into `id` (TPFUSE_NCCL_UNIQUE_ID_BYTES bytes). */
int tpfuse_nccl_get_unique_id(void* id);

/* ncclCommInitRank on `device` (made current): a communicator of `world_size` ranks, this one `rank`.
 * Collective over the ranks that share `id`. */
int tpfuse_nccl_comm_init_rank(void** nccl_comm, int world_size, const void* id, int rank, int device);

/* ncclCommDestroy. */
int tpfuse_nccl_comm_destroy(void* nccl_comm);

/* ---- The communicator and the fused ops (tpfuse.h) ------------------------------------------------- */

/* tpfuse::communicator_create over the caller's NCCL communicator (which must outlive it), with
 * workspace for reduce-scatter calls up to max_m x max_n and, where max_k > 0, all-gather calls up
 * to max_m x max_k (0: none); peer_timeout_s 0 is the library's default. Collective. */
int tpfuse_communicator_create(void* nccl_comm, int64_t max_m, int64_t max_n, int64_t max_k, double peer_timeout_s,
                               tpfuse_communicator** comm);

/* tpfuse::communicator_destroy: waits for the device, then frees. Collective (NCCL window
 * deregistration). */
int tpfuse_communicator_destroy(tpfuse_communicator* comm);

/* tpfuse::communicator_status: TPFUSE_PEER_TIMEOUT if a synchronized call waited in vain for a peer. */
int tpfuse_communicator_status(const tpfuse_communicator* comm);

/* The bytes of this process's workspace allocation (receive buffers, flags, counters) on its GPU. */
int tpfuse_communicator_workspace_bytes(const tpfuse_communicator* comm, int64_t* bytes);

/* tpfuse::gemm_reduce_scatter on `stream` (a cudaStream_t): out (m/world_size x n, BF16) = this rank's
 * rows of sum over ranks of a (m x k_per_rank) @ w (weight_layout), both of `dtype` (TPFUSE_DTYPE_*),
 * + bias. batch >= 1: the m rows are `batch` sequences of s = m/batch rows, and this rank (d) keeps
 * rows [d*s/P, (d+1)*s/P) of each, sequence after sequence (a reduce-scatter along dimension 1 of
 * [batch, s, n]; 1: rows [d*m/P, (d+1)*m/P)); with batch > 1 and P > 1, s/P must be a multiple of 64
 * (TPFUSE_UNSUPPORTED otherwise). bias: null, or n BF16 entries added in FP32 before the one rounding.
 * FP8 inputs: `scaling` and `accumulation` above. Device pointers, 16-byte aligned (scales 4-byte);
 * world_size is the communicator's size. */
int tpfuse_gemm_reduce_scatter(tpfuse_communicator* comm, int64_t m, int64_t n, int64_t k_per_rank, int world_size,
                               int weight_layout, int dtype, int scaling, int accumulation, int64_t batch,
                               const void* a, const void* w, const float* a_scale, const float* w_scale,
                               const void* bias, void* out, void* stream);

/* tpfuse::gemm on `stream`: c (m x n, BF16) = a (m x k) @ w (weight_layout: k x n or n x k), both of
 * `dtype` (TPFUSE_DTYPE_*) scaled as `scaling` says, the per-rank GEMM alone. Device pointers, 16-byte
 * aligned. */
int tpfuse_gemm(int64_t m, int64_t n, int64_t k, int weight_layout, int dtype, int scaling, int accumulation,
                const void* a, const void* w, const float* a_scale, const float* w_scale, void* c, void* stream);

/* tpfuse::all_gather_gemm on `stream`: y (m x n_per_rank, BF16) = the rows of every rank's x
 * (m/world_size x k) gathered in rank order, @ w (weight_layout: k x n_per_rank or n_per_rank x k),
 * both of `dtype` (TPFUSE_DTYPE_*), + bias. batch >= 1: x holds this rank's shard of each of `batch`
 * sequences (s/P rows each, s = m/batch), and y's rows are in sequence order: y row i*s + r*s/P + j
 * comes from rank r's x row i*s/P + j (an all-gather along dimension 1); the same limits as the
 * reduce-scatter's.
 * bias: null, or n_per_rank BF16 entries added in FP32 before the one rounding. gathered_x, if not
 * null, receives the gathered X (m x k, in y's row order). Device pointers, 16-byte aligned; the
 * communicator needs max_k >= k. FP8 inputs take the reduce-scatter's scale arguments; rowwise, x_scale
 * is this rank's m/P rows' (gathered with them), tensorwise this rank's one scale serves every gathered
 * row. */
int tpfuse_all_gather_gemm(tpfuse_communicator* comm, int64_t m, int64_t n_per_rank, int64_t k, int world_size,
                           int weight_layout, int dtype, int scaling, int accumulation, int64_t batch, const void* x,
                           const void* w, const float* x_scale, const float* w_scale, const void* bias, void* y,
                           void* gathered_x, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TPFUSE_TPFUSE_C_H_ */
