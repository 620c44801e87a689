// What a result was measured on and with: date, host, GPUs (and GPU 0's max SM clock and power
// limit, from NVML), driver and library versions, the commit, and the options. For the JSON's
// "meta" and the table's opening lines.
#pragma once

#include "cli.h"
#include "report.h"

namespace tpfuse::bench {

// Needs a working CUDA runtime; `num_gpus` is the number the run uses.
Fields collect_meta(int num_gpus);
Fields options_fields(const Options& options);

}  // namespace tpfuse::bench
