// A tile schedule to test, shared by the CPU tests of the schedule and of the fused op's wait order.
#pragma once

#include <sstream>
#include <string>

#include "ops/gemm_rs/schedule.h"

namespace tpfuse {

struct Case {
  int m, n, world_size, block_m, block_n, group_rows;
  int own_lag = kOwnTilesLast;
  int segments_per_tile = 1;
  std::string name() const {
    std::ostringstream os;
    os << "m=" << m << " n=" << n << " P=" << world_size << " tile=" << block_m << "x" << block_n
       << " group_rows=" << group_rows << " own_lag=" << own_lag << " segments/tile=" << segments_per_tile;
    return os.str();
  }
};

inline TileSchedule schedule_of(const Case& c, int rank) {
  ScheduleShape s;
  s.world_size = c.world_size;
  s.rank = rank;
  s.m = c.m;
  s.n = c.n;
  s.block_m = c.block_m;
  s.block_n = c.block_n;
  s.group_rows = c.group_rows;
  s.own_lag = c.own_lag;
  s.segments_per_tile = c.segments_per_tile;
  return TileSchedule(s);
}

}  // namespace tpfuse
