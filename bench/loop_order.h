// The order of an interleaved loop's launches, and one launch's time from its calls. Pure C++ (the CPU
// tests link it).
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "rotation.h"

namespace tpfuse::bench {

// Two launches of a loop compared with each other (--compare), by their index in the loop.
using AlternatePair = std::pair<int, int>;

// How many iterations an alternating pair keeps its order: a pass through the input sets (at most
// kMaxRotationSets), so that each launch of the pair takes every input set (from 3 sets on) in each of
// the two places (trading places every iteration, the swap's parity and the rotation's would leave a
// launch half the sets in a place).
inline constexpr int kAlternationPass = kMaxRotationSets;

// The launches' order in iteration `iteration` of an interleaved loop: 0, 1, ..., num_launches - 1, except
// that in every other pass of kAlternationPass iterations the two launches of `alternate` trade places.
// Each of the two then runs right after the other as often as right before it: a call finds in L2 what
// the call before it read (the proxy's preset partials do not rotate), which favoured whichever of the
// two ran second.
std::vector<int> launch_order(int num_launches, int iteration, const std::optional<AlternatePair>& alternate);

// The median of `values` (the mean of the middle two of an even count); 0 for none.
double median(std::vector<double> values);

// A launch's time from its times in its own place and in its partner's place (an alternating pair): the
// geometric mean of the two places' medians, so that each place weighs the same however far apart their
// times lie (the median of the mixed times would fall in the gap between them); the one place's median
// where the launch ran in one place only.
double placed_median(const std::vector<double>& own_place, const std::vector<double>& other_place);

}  // namespace tpfuse::bench
