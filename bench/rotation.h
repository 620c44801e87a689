// The timed loops' input sets: how many, and which one a call takes. Pure C++ (the CPU tests link it).
#pragma once

#include <cstddef>

namespace tpfuse::bench {

// The most input sets a loop rotates through.
inline constexpr int kMaxRotationSets = 16;

// How many input sets to rotate through: enough that one rotation touches about 4x the L2 cache
// (so no iteration finds its operands cached), at most kMaxRotationSets, and within `budget_bytes`;
// at least 1.
int rotation_sets(size_t bytes_per_set, size_t l2_bytes, size_t budget_bytes);

// The input set of call `call` (numbered across a loop's launches, as time_loop numbers them):
// consecutive calls take different sets (from 3 sets on), and every launch takes every set in turn.
// (call % num_sets would give each of two interleaved launches every other set only, and where a
// set lies in memory moves a short call's time by up to a microsecond, always on the same launch.)
int rotation_set(int call, int num_sets);

}  // namespace tpfuse::bench
