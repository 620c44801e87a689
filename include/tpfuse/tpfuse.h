// tpfuse: fused GEMM + reduce-scatter for tensor-parallel row-parallel linear layers.
//
// Every call returns a Status; the library never exits or aborts. All device work is asynchronous
// on the caller's stream(s). gemm.h alone needs no NCCL headers.
#pragma once

#include "tpfuse/gemm.h"
#include "tpfuse/reduce_scatter.h"
