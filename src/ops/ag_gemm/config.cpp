#include "ops/ag_gemm/config.h"

#include "gemm/shared_storage.h"
#include "ops/ag_gemm/shared_storage.h"

namespace tpfuse {

Status select_all_gather_config(const AllGatherProblem& problem, const DeviceInfo& device,
                                const ConfigOverrides& overrides, AllGatherConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  // The kernel's shared memory is the plain GEMM's and the copier's staging ring (its waits are on
  // flags in global memory).
  static constexpr SmemByVariant kSmem = smem_bytes_by_variant<CopyStages>();
  TileGrid grid;
  grid.bands = problem.world_size;
  grid.rows_per_band = problem.rows_per_rank();
  grid.n = problem.n_per_rank;
  // Where the tiles fill few SMs, their K loops may be split, as the plain GEMM's.
  const int64_t num_k_blocks = (problem.k + kBlockK - 1) / kBlockK;
  AllGatherConfig c;
  TPFUSE_RETURN_IF_ERROR(select_split_k_gemm_config(grid, int(num_k_blocks), device, overrides, kSmem, &c.gemm));
  // The CTAs at work at one time are in one band (or two), the bands one after another.
  c.gemm.group_rows = group_rows_for(1, overrides);
  *config = c;
  return Status::Ok();
}

}  // namespace tpfuse
