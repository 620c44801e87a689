// The size of one parity half of a communicator's workspace, apart from the communicator itself so
// that the ops' pure C++ layouts (ops/*/workspace.h) need neither NCCL nor CUDA.
#pragma once

#include <cstddef>

namespace tpfuse {

// What the ops need of one parity half of a workspace: data bytes, 32-bit flag words (which every
// op may write: they hold epoch values) and 32-bit count words (which only their op writes: counters
// that are 0 at creation and after every call).
struct WorkspaceSize {
  size_t data_bytes = 0;
  size_t flag_words = 0;
  size_t count_words = 0;
};

}  // namespace tpfuse
