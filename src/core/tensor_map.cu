#include "core/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tpfuse {
namespace {

Status encode_fn(PFN_cuTensorMapEncodeTiled_v12000* fn) {
  static PFN_cuTensorMapEncodeTiled_v12000 cached = nullptr;
  if (cached == nullptr) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || ptr == nullptr) {
      return Status(StatusCode::kCudaError, std::string("cuTensorMapEncodeTiled is not available from the driver: ") +
                                                cudaGetErrorString(err));
    }
    cached = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }
  *fn = cached;
  return Status::Ok();
}

// Encodes a tensor of `dtype` elements and `rank` dimensions (dims[0] innermost, contiguous),
// 128-byte swizzle.
Status encode(DType dtype, const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* byte_strides,
              const cuuint32_t* box, CUtensorMap* map) {
  // The map only moves bytes: E4M3 elements travel as bytes.
  CUtensorMapDataType data_type;
  switch (dtype) {
    case DType::kBF16: data_type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; break;
    case DType::kE4M3: data_type = CU_TENSOR_MAP_DATA_TYPE_UINT8; break;
    default: return Status::Unsupported(std::string("tensor maps of ") + to_string(dtype) + " elements");
  }
  PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;
  TPFUSE_RETURN_IF_ERROR(encode_fn(&encode_tiled));
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult res = encode_tiled(map, data_type, cuuint32_t(rank), const_cast<void*>(base),
                                    dims, byte_strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    std::string shape;
    for (int i = rank - 1; i >= 0; --i) shape += std::to_string(dims[i]) + (i > 0 ? " x " : "");
    return Status(StatusCode::kCudaError, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(res)) +
                                              ") for a " + shape + " " + to_string(dtype) + " tensor");
  }
  return Status::Ok();
}

}  // namespace

Status make_tensor_map(DType dtype, const void* base, int64_t rows, int64_t cols, int64_t pitch_elems, int box_rows,
                       int box_cols, CUtensorMap* map) {
  const cuuint64_t bytes = cuuint64_t(element_bytes(dtype));
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(pitch_elems) * bytes};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  return encode(dtype, base, 2, dims, strides, box, map);
}

Status make_layered_tensor_map(DType dtype, const void* base, int64_t layers, int64_t rows, int64_t cols,
                               int64_t parities, int64_t parity_stride_elems, int box_rows, int box_cols,
                               CUtensorMap* map) {
  const cuuint64_t bytes = cuuint64_t(element_bytes(dtype));
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(layers), cuuint64_t(parities)};
  const cuuint64_t strides[3] = {cuuint64_t(cols) * bytes, cuuint64_t(rows) * cuuint64_t(cols) * bytes,
                                 cuuint64_t(parity_stride_elems) * bytes};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  return encode(dtype, base, 4, dims, strides, box, map);
}

}  // namespace tpfuse
