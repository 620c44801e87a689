// The fused op's waits cannot form a cycle: a model of every rank's persistent CTAs taking their
// steps of the schedule in the kernel's order, where a pushed slab raises the flag of each of its
// other owners and a slab with the rank's own rows waits for the flags of its P-1 peers. Each CTA is strictly sequential, as in the kernel
// (the next tile's K stages follow the extra stages of the previous one through the shared ring;
// the sender stores one step after another). All CTAs are resident at once, so the model runs any
// CTA whose next action can run, until all are done or none can move.
//
// The kernel's order within a step: the pushes first, then the own rows (NOTE in
// ops/gemm_rs/schedule.h). The model checks that order over schedules with bands of two segments
// and of all segments, own-tile lags and grid sizes, and that the opposite order deadlocks the
// partners of a band, so that the model would notice.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ops/gemm_rs/schedule.h"
#include "schedule_case.h"

namespace tpfuse {
namespace {

// One owner's flag of a slab of a tile: (owner, first row of the slab in C, column).
using SlabKey = std::tuple<int, int, int>;

struct Action {
  bool push;  // true: raise the owner's flag of the slab; false: wait for the P-1 peers' flags
  SlabKey slab;
};

// A schedule, and the persistent CTAs each rank runs it on.
struct GridCase {
  Case schedule;
  int ctas_per_rank;
  std::string name() const { return schedule.name() + " CTAs=" + std::to_string(ctas_per_rank); }
};

// The actions of CTA `cta` of `rank`, step by step: a 128-row tile has two 64-row slabs stacked, a
// 64-row tile two side by side (the kernel's two consumers). A slab past the tile's rows is empty:
// neither pushed nor awaited.
std::vector<Action> actions_of(const GridCase& g, int rank, int cta, bool pushes_first) {
  const Case& c = g.schedule;
  const TileSchedule s = schedule_of(c, rank);
  const bool stacked = c.block_m == 128;
  std::vector<Action> actions;
  for (CtaSteps walk(cta, g.ctas_per_rank); walk.step() < s.num_tiles(); walk.next()) {
    const Tile t = s.tile(walk.step());
    std::vector<Action> pushes, reductions;
    for (int slab = 0; slab < 2; ++slab) {
      const int row = stacked ? slab * 64 : 0;
      const int col = stacked ? 0 : slab * (c.block_n / 2);
      if (t.row_begin + row >= t.row_end || t.col_begin + col >= t.col_end) continue;
      const int last_row = std::min(row + 64, t.row_end - t.row_begin) - 1;
      const bool shared = c.segments_per_tile == c.world_size && c.world_size > 1;
      const int first_owner = shared ? t.owner_of_row(row) : t.owner_of(row);
      const int last_owner = shared ? t.owner_of_row(last_row) : first_owner;
      for (int owner = first_owner; owner <= last_owner; ++owner) {
        const Action action{owner != rank, {owner, t.row_begin + row, t.col_begin + col}};
        (action.push ? pushes : reductions).push_back(action);
      }
    }
    const auto& first = pushes_first ? pushes : reductions;
    const auto& second = pushes_first ? reductions : pushes;
    actions.insert(actions.end(), first.begin(), first.end());
    actions.insert(actions.end(), second.begin(), second.end());
  }
  return actions;
}

// Runs the model; returns "" when every action ran, else where it got stuck.
std::string run_model(const GridCase& g, bool pushes_first) {
  const int P = g.schedule.world_size;
  std::vector<std::vector<Action>> ctas;  // rank-major
  for (int rank = 0; rank < P; ++rank)
    for (int cta = 0; cta < g.ctas_per_rank; ++cta) ctas.push_back(actions_of(g, rank, cta, pushes_first));
  std::vector<size_t> next(ctas.size(), 0);
  std::map<SlabKey, int> flags;  // slab -> peers that have pushed it
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t i = 0; i < ctas.size(); ++i) {
      while (next[i] < ctas[i].size()) {
        const Action& a = ctas[i][next[i]];
        if (a.push) {
          ++flags[a.slab];
        } else if (flags[a.slab] < P - 1) {
          break;
        }
        ++next[i];
        moved = true;
      }
    }
  }
  for (size_t i = 0; i < ctas.size(); ++i) {
    if (next[i] < ctas[i].size()) {
      const Action& a = ctas[i][next[i]];
      std::ostringstream os;
      os << "rank " << i / g.ctas_per_rank << " CTA " << i % g.ctas_per_rank << " waits at action " << next[i]
         << " for the slab at row " << std::get<1>(a.slab) << ", column " << std::get<2>(a.slab) << " ("
         << flags[a.slab] << " of " << P - 1 << " peers pushed)";
      return os.str();
    }
  }
  return "";
}

TEST(WaitOrder, PushesFirstNeverDeadlock) {
  std::vector<GridCase> cases;
  for (int P : {2, 4, 8}) {
    for (int ctas : {1, 3, 16}) {
      for (int own_lag : {kOwnTilesLast, 0, 1, 5}) {
        // Segments of 64 rows in bands of two; 64-row tiles; several 128-row tiles a segment.
        if (P >= 4) cases.push_back({{64 * P, 1000, P, 128, 256, 2, own_lag, 2}, ctas});
        cases.push_back({{64 * P, 520, P, 64, 256, 2, own_lag, 1}, ctas});
        cases.push_back({{P * 300, 600, P, 128, 256, 2, own_lag, 1}, ctas});
      }
      // One band of all segments: 8 rows per rank in 64-row tiles, 24 (across slabs) in 128-row ones.
      cases.push_back({{8 * P, 1000, P, 64, 256, 2, kOwnTilesLast, P}, ctas});
      cases.push_back({{24 * P, 1000, P, 128, 256, 2, kOwnTilesLast, P}, ctas});
    }
  }
  for (const GridCase& g : cases) EXPECT_EQ(run_model(g, /*pushes_first=*/true), "") << g.name();
}

// Own slabs before pushed ones: in a band of two the partners then each wait for the other's push
// of their shared last tile; the model must see that. Partial rounds (ops/gemm_rs/partial_rounds.h) would
// put an own slab's waits there, inside the tile's K loop, before the step's pushes: this is why
// the config gives bands none (Config.PartialRoundsFitTheKLoop), and why tiles of one owner may
// have them.
TEST(WaitOrder, OwnSlabsFirstDeadlockPartners) {
  for (int P : {4, 8}) {
    const GridCase bands{{64 * P, 512, P, 128, 256, 2, kOwnTilesLast, 2}, 4};
    EXPECT_NE(run_model(bands, /*pushes_first=*/false), "") << bands.name();
    const GridCase one_band{{8 * P, 512, P, 64, 256, 2, kOwnTilesLast, P}, 4};
    EXPECT_NE(run_model(one_band, /*pushes_first=*/false), "") << one_band.name();
    // Without bands no tile has both kinds of slab, and the order within a step does not matter.
    const GridCase plain{{128 * P, 512, P, 128, 256, 2, kOwnTilesLast, 1}, 4};
    EXPECT_EQ(run_model(plain, /*pushes_first=*/false), "") << plain.name();
  }
}

}  // namespace
}  // namespace tpfuse
