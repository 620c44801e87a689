// tpfuse: fused GEMM + reduce-scatter (row-parallel) and all-gather + GEMM (column-parallel) for the
// linear layers of tensor parallelism.
//
// Every call returns a Status; the library never exits or aborts. All device work is asynchronous
// on the caller's stream(s). gemm.h alone needs no NCCL headers.
#pragma once

#include "tpfuse/all_gather.h"
#include "tpfuse/gemm.h"
#include "tpfuse/reduce_scatter.h"
