// TileSchedule: every rank computes every tile of its partial exactly once, in rotated rounds, every
// owner gets each of its tiles from all P ranks (P-1 peers and itself), and a rank reduces an own
// tile only after every peer outside its band has computed it, by the lead the schedule promises
// (the partner in a band of two segments computes it at the same step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ops/gemm_rs/schedule.h"
#include "schedule_case.h"

namespace tpfuse {
namespace {

// Element-level coverage is affordable up to this many elements per case.
constexpr int64_t kMaxElementsForCoverage = int64_t(1) << 22;

// Checks one case; returns the number of failures (so the caller can stop after a few bad cases).
int check_case(const Case& c) {
  const int P = c.world_size;
  const int rows = c.m / P;
  const int spt = c.segments_per_tile;
  const int B = P / spt;
  int failures = 0;
  auto fail = [&](const std::string& what) {
    ADD_FAILURE() << c.name() << ": " << what;
    ++failures;
  };

  // (first owner, row_begin, col_begin) -> the ranks that computed that tile, and the tile's bounds.
  std::map<std::tuple<int, int, int>, std::pair<uint32_t, Tile>> received;

  for (int rank = 0; rank < P && failures < 5; ++rank) {
    const TileSchedule s = schedule_of(c, rank);
    const int per_band = s.tiles_per_band();
    if (s.num_bands() != B) fail("num_bands() != P / segments_per_tile");
    if (s.num_tiles() != B * per_band) fail("num_tiles() != bands * tiles_per_band()");
    if (per_band != ((spt * rows + c.block_m - 1) / c.block_m) * ((c.n + c.block_n - 1) / c.block_n)) {
      fail("tiles_per_band() is not ceil(band rows/block_m) * ceil(n/block_n)");
    }

    const bool per_element = int64_t(c.m) * c.n <= kMaxElementsForCoverage;
    std::vector<uint8_t> covered(per_element ? size_t(c.m) * size_t(c.n) : 0, 0);
    int64_t area = 0;

    std::vector<int> seen_in_band(size_t(B) * per_band, 0);
    for (int step = 0; step < s.num_tiles() && failures < 5; ++step) {
      const Tile t = s.tile(step);
      int offset = 0, index = 0;
      s.locate(step, &offset, &index);
      if (offset < 0 || offset >= B || index < 0 || index >= per_band) {
        fail("step " + std::to_string(step) + " located outside the bands");
        continue;
      }
      ++seen_in_band[size_t(offset) * per_band + index];
      std::ostringstream where;
      where << "rank " << rank << " step " << step << " (owner " << t.owner_rank << ", rows [" << t.row_begin << ", "
            << t.row_end << "), cols [" << t.col_begin << ", " << t.col_end << ")): ";

      // Rotated order: the band at offset o is the rank's band + 1 + o (mod B); its own band at
      // offset B-1, and last.
      const int band = t.owner_rank / spt, own_band = rank / spt;
      if (t.owner_rank % spt != 0) fail(where.str() + "the first owner is not the first rank of a band");
      if (band != (own_band + 1 + offset) % B) fail(where.str() + "band is not (rank's band + 1 + offset) mod B");
      if (band != s.band_at_offset(offset)) fail(where.str() + "band_at_offset disagrees");
      if (step == 0 && band != (own_band + 1) % B) fail(where.str() + "first band is not the next one's");
      if (step == s.num_tiles() - 1 && band != own_band) fail(where.str() + "last tile is not of the rank's band");

      // Inside the band, on the tile grid, clipped to the band and to n.
      const int band_begin = t.owner_rank * rows, band_end = band_begin + spt * rows;
      if (t.row_begin < band_begin || t.row_end > band_end || t.row_begin >= t.row_end) {
        fail(where.str() + "rows outside the band or empty");
        continue;
      }
      if (t.col_begin < 0 || t.col_end > c.n || t.col_begin >= t.col_end) {
        fail(where.str() + "columns outside [0, n) or empty");
        continue;
      }
      if (t.segment_row != t.row_begin - band_begin) fail(where.str() + "segment_row != row_begin - segment start");
      if (t.segment_row % c.block_m != 0) fail(where.str() + "row_begin is not on the tile grid of the band");
      if (t.col_begin % c.block_n != 0) fail(where.str() + "col_begin is not on the tile grid");
      if (t.row_end != std::min(t.row_begin + c.block_m, band_end)) fail(where.str() + "row_end clipped wrongly");
      if (t.col_end != std::min(t.col_begin + c.block_n, c.n)) fail(where.str() + "col_end clipped wrongly");
      // Each half of the tile (a consumer's slab) lands with the rank that owns its rows.
      for (int tile_row : {0, c.block_m / 2}) {
        const int row = t.row_begin + tile_row;
        if (row >= t.row_end) continue;
        // A band of all segments: owner_of_row; of one or two: owner_of (no division).
        const int owner = spt == P && P > 1 ? t.owner_of_row(tile_row) : t.owner_of(tile_row);
        const int segment_row = spt == P && P > 1 ? t.segment_row_for(tile_row, owner) : t.segment_row_of(tile_row);
        if (owner != row / rows || segment_row != row % rows) {
          fail(where.str() + "tile row " + std::to_string(tile_row) + " goes to owner " + std::to_string(owner) +
               " row " + std::to_string(segment_row));
        }
      }

      area += int64_t(t.row_end - t.row_begin) * (t.col_end - t.col_begin);
      if (per_element) {
        for (int i = t.row_begin; i < t.row_end; ++i)
          for (int j = t.col_begin; j < t.col_end; ++j) ++covered[size_t(i) * size_t(c.n) + size_t(j)];
      }

      auto& entry = received[std::make_tuple(t.owner_rank, t.row_begin, t.col_begin)];
      if (entry.first & (1u << rank)) fail(where.str() + "the owner receives this tile twice from this rank");
      if (entry.first != 0 && (entry.second.row_end != t.row_end || entry.second.col_end != t.col_end ||
                               entry.second.segment_row != t.segment_row)) {
        fail(where.str() + "ranks disagree on the bounds of the same tile");
      }
      entry.first |= 1u << rank;
      entry.second = t;
    }

    if (std::any_of(seen_in_band.begin(), seen_in_band.end(), [](int v) { return v != 1; })) {
      fail("rank " + std::to_string(rank) + ": an (offset, index) is located zero or several times");
    }
    // Tiles on the grid with distinct corners are disjoint, so their areas summing to m*n means the
    // partial is covered exactly once; the per-element count checks it directly where affordable.
    if (area != int64_t(c.m) * c.n) fail("rank " + std::to_string(rank) + ": tiles cover " + std::to_string(area) +
                                         " elements, not m*n");
    if (per_element) {
      const auto bad = std::find_if(covered.begin(), covered.end(), [](uint8_t v) { return v != 1; });
      if (bad != covered.end()) {
        const size_t e = size_t(bad - covered.begin());
        fail("rank " + std::to_string(rank) + ": element (" + std::to_string(e / size_t(c.n)) + ", " +
             std::to_string(e % size_t(c.n)) + ") is covered " + std::to_string(int(*bad)) + " times");
      }
    }
  }

  // Each owner reduces exactly P partials of each of its tiles: its own and one from each peer.
  const uint32_t all_ranks = (1u << P) - 1;  // P <= 8
  for (const auto& [key, entry] : received) {
    if (entry.first != all_ranks) {
      fail("owner " + std::to_string(std::get<0>(key)) + " tile at (" + std::to_string(std::get<1>(key)) + ", " +
           std::to_string(std::get<2>(key)) + ") does not get a partial from every rank");
      if (failures >= 5) break;
    }
  }
  return failures;
}

// At each step every band is sent to by the ranks of one band (one rank a band: a permutation):
// every link is used, none twice.
int check_permutation(const Case& c) {
  const int P = c.world_size;
  const int spt = c.segments_per_tile;
  const int num_tiles = schedule_of(c, 0).num_tiles();
  for (int step = 0; step < num_tiles; ++step) {
    std::vector<int> senders(size_t(P / spt), -1);  // band -> the band sending to it
    for (int rank = 0; rank < P; ++rank) {
      const int band = schedule_of(c, rank).tile(step).owner_rank / spt;
      if (band < 0 || band >= P / spt) {
        ADD_FAILURE() << c.name() << ": at step " << step << " rank " << rank << " sends to band " << band;
        return 1;
      }
      if (senders[size_t(band)] != -1 && senders[size_t(band)] != rank / spt) {
        ADD_FAILURE() << c.name() << ": at step " << step << " band " << band << " is sent to by bands "
                      << senders[size_t(band)] << " and " << rank / spt;
        return 1;
      }
      senders[size_t(band)] = rank / spt;
    }
  }
  return 0;
}

// Every own tile comes at least max(1, min(own_lag, tiles per band)) steps after every peer outside
// the band computed it (the peers then have had that long to push it); the partner in a band of two
// computes it at the same step.
int check_own_tiles_wait_for_peers(const Case& c) {
  const int P = c.world_size;
  const int spt = c.segments_per_tile;
  // (first owner, row_begin, col_begin) -> the step at which each rank computes it.
  std::map<std::tuple<int, int, int>, std::vector<int>> step_of;
  for (int rank = 0; rank < P; ++rank) {
    const TileSchedule s = schedule_of(c, rank);
    for (int step = 0; step < s.num_tiles(); ++step) {
      const Tile t = s.tile(step);
      auto& steps = step_of[std::make_tuple(t.owner_rank, t.row_begin, t.col_begin)];
      steps.resize(size_t(P), -1);
      steps[size_t(rank)] = step;
    }
  }
  const int lead = std::max(1, std::min(c.own_lag, schedule_of(c, 0).tiles_per_band()));
  for (const auto& [key, steps] : step_of) {
    const int first_owner = std::get<0>(key);
    for (int owner = first_owner; owner < first_owner + spt; ++owner) {
      for (int peer = 0; peer < P; ++peer) {
        if (peer == owner) continue;
        const bool partner = peer / spt == owner / spt;
        const int gap = steps[size_t(owner)] - steps[size_t(peer)];
        if (partner ? gap != 0 : gap < lead) {
          ADD_FAILURE() << c.name() << ": owner " << owner << " reduces its tile at (" << std::get<1>(key) << ", "
                        << std::get<2>(key) << ") at step " << steps[size_t(owner)] << ", rank " << peer
                        << " computes it at step " << steps[size_t(peer)]
                        << (partner ? ": the partner, not at the same step" : ": less than the lead ")
                        << (partner ? "" : std::to_string(lead));
          return 1;
        }
      }
    }
  }
  return 0;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int tiles[][2] = {{128, 256}, {64, 256}, {128, 128}, {64, 128}};
  for (int P : {1, 2, 4, 8}) {
    // Rows per rank: one row, a few, under a 64-row tile, exactly 64 / 128, odd, several tiles.
    for (int rows : {1, 3, 8, 64, 65, 128, 200, 384}) {
      for (int n : {8, 200, 256, 264, 520, 1000}) {
        for (const auto& tile : tiles) {
          for (int group_rows : {1, 2, 3, 8}) {
            for (int own_lag : {kOwnTilesLast, 0, 1, 5}) out.push_back({rows * P, n, P, tile[0], tile[1], group_rows, own_lag});
          }
        }
      }
    }
  }
  // Bands of two segments of half a tile each (even P).
  for (int P : {2, 4, 8}) {
    for (int block_m : {16, 64, 128}) {
      for (int n : {8, 264, 1000}) {
        for (int group_rows : {1, 3}) {
          for (int own_lag : {kOwnTilesLast, 0, 1, 5}) out.push_back({block_m / 2 * P, n, P, block_m, 128, group_rows, own_lag, 2});
        }
      }
    }
  }
  // One band of all segments, shorter than a slab: tiles of several owners' rows, segments that
  // span two slabs or two tiles (3, 24 rows), a tile past M (1 row).
  for (int P : {2, 4, 8}) {
    for (int rows : {1, 3, 8, 24, 63}) {
      for (const auto& tile : tiles) {
        for (int n : {8, 264, 1000}) {
          for (int group_rows : {1, 3}) out.push_back({rows * P, n, P, tile[0], tile[1], group_rows, kOwnTilesLast, P});
        }
      }
    }
  }
  // M = 512 at P = 8 (64 rows per rank) with the sweep's N, both tile heights, and bands of two.
  for (int n : {6144, 8192}) {
    for (int block_m : {64, 128}) out.push_back({512, n, 8, block_m, 256, 8, 17});
    out.push_back({512, n, 8, 128, 256, 8, 17, 2});
  }
  return out;
}

TEST(Schedule, EveryTileOnceToItsOwner) {
  int bad_cases = 0;
  for (const Case& c : cases()) {
    if (check_case(c) > 0 && ++bad_cases >= 3) break;
  }
}

TEST(Schedule, OwnersArePermutationAtEachStep) {
  int bad_cases = 0;
  for (const Case& c : cases()) {
    if (check_permutation(c) > 0 && ++bad_cases >= 3) break;
  }
}

TEST(Schedule, OwnTilesComeAfterThePeersByTheLead) {
  int bad_cases = 0;
  for (const Case& c : cases()) {
    if (check_own_tiles_wait_for_peers(c) > 0 && ++bad_cases >= 3) break;
  }
}

// The rounds picture in schedule.h: P = 4, rank 1, T = 4, L = 2.
TEST(Schedule, RoundsMatchTheDiagram) {
  ScheduleShape shape;
  shape.world_size = 4;
  shape.rank = 1;
  shape.m = 4 * 64 * shape.world_size;
  shape.n = 256;
  shape.block_m = 64;
  shape.block_n = 256;
  shape.own_lag = 2;
  const TileSchedule s(shape);
  ASSERT_EQ(s.tiles_per_band(), 4);
  const int expected[16][2] = {{2, 0}, {3, 0}, {0, 0},          {2, 1}, {3, 1}, {0, 1},
                               {2, 2}, {3, 2}, {0, 2}, {1, 0},  {2, 3}, {3, 3}, {0, 3}, {1, 1},
                               {1, 2}, {1, 3}};
  ASSERT_EQ(s.num_tiles(), 16);
  for (int step = 0; step < 16; ++step) {
    const Tile t = s.tile(step);
    EXPECT_EQ(t.owner_rank, expected[step][0]) << "step " << step;
    EXPECT_EQ(t.segment_row / 64, expected[step][1]) << "step " << step;
  }
}

// Between the first L rounds and the tail, every round of P steps holds exactly one own tile: the
// owner's reductions are spread evenly (llama o_proj M=8192 at P=8, L = ceil(132 / 8)).
TEST(Schedule, OwnTilesSpreadEvenlyBetweenLeadAndTail) {
  const Case c{8192, 8192, 8, 128, 256, 8, 17};
  for (int rank : {0, 5}) {
    const TileSchedule s = schedule_of(c, rank);
    const int first = c.own_lag * (c.world_size - 1);
    const int tail = s.num_tiles() - c.own_lag;
    ASSERT_EQ((tail - first) % c.world_size, 0);
    for (int round = first; round < tail; round += c.world_size) {
      int own = 0;
      for (int step = round; step < round + c.world_size; ++step) own += s.tile(step).owner_rank == rank;
      ASSERT_EQ(own, 1) << "rank " << rank << " round starting at step " << round;
    }
    for (int step = 0; step < first; ++step) ASSERT_NE(s.tile(step).owner_rank, rank) << "step " << step;
    for (int step = tail; step < s.num_tiles(); ++step) ASSERT_EQ(s.tile(step).owner_rank, rank) << "step " << step;
  }
}

// The steps of a persistent grid: CTA b's step in each wave until the steps run out.
std::vector<std::vector<int>> steps_of_ctas(int num_ctas, int num_tiles) {
  std::vector<std::vector<int>> steps(num_ctas);
  for (int cta = 0; cta < num_ctas; ++cta)
    for (CtaSteps walk(cta, num_ctas); walk.step() < num_tiles; walk.next()) steps[cta].push_back(walk.step());
  return steps;
}

// Every step is taken once, each CTA's steps grow (so the deadlock argument of the rounds holds),
// and its place in the wave moves on by one each wave.
TEST(PersistentSteps, EveryStepOnceInWaves) {
  for (int num_ctas : {132, 131, 16, 1})
    for (int num_tiles : {1, 7, 131, 132, 133, 264, 1000, 2048}) {
      SCOPED_TRACE(::testing::Message() << num_ctas << " CTAs, " << num_tiles << " tiles");
      const auto steps = steps_of_ctas(num_ctas, num_tiles);
      std::vector<int> taken(num_tiles, 0);
      for (int cta = 0; cta < num_ctas; ++cta) {
        for (size_t i = 0; i < steps[cta].size(); ++i) {
          ++taken[steps[cta][i]];
          EXPECT_EQ(steps[cta][i] / num_ctas, int(i)) << "CTA " << cta << " wave " << i;
          EXPECT_EQ(steps[cta][i] % num_ctas, (cta + int(i)) % num_ctas) << "CTA " << cta << " wave " << i;
        }
      }
      EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), num_tiles);
    }
}

// With own tiles interleaved (one per round of P steps), every CTA of the 132 takes its share of
// them, within two tiles: a CTA that kept its place would take all of them or none at P = 2 and 4.
TEST(PersistentSteps, OwnTilesShareOutOverTheCtas) {
  constexpr int kCtas = 132;
  for (int world_size : {2, 4, 8}) {
    const Case c{8192 * world_size / 8, 8192, world_size, 128, 256, 32 / world_size, 0};
    const TileSchedule s = schedule_of(c, 0);
    const int num_tiles = s.num_tiles();
    const auto steps = steps_of_ctas(kCtas, num_tiles);
    int fewest = num_tiles, most = 0;
    for (const auto& cta_steps : steps) {
      // Count only full waves, so that the last partial wave does not decide.
      int own = 0;
      for (int step : cta_steps)
        if (step < num_tiles / kCtas * kCtas) own += s.tile(step).owner_rank == 0;
      fewest = std::min(fewest, own);
      most = std::max(most, own);
    }
    const int waves = num_tiles / kCtas;
    SCOPED_TRACE(::testing::Message() << "P=" << world_size << ", " << waves << " full waves");
    EXPECT_LE(most - fewest, 2) << fewest << " to " << most;
    EXPECT_GE(fewest, waves / world_size - 1);
  }
}

// The 16 sweep shapes at P = 8 with the default tiles (grid-level checks: too big for per-element).
TEST(Schedule, SweepShapes) {
  for (int m : {512, 2048, 8192, 32768}) {
    for (int n : {6144, 8192}) {
      for (int block_m : {64, 128}) {
        for (int own_lag : {kOwnTilesLast, 0, 17}) {
          for (int segments_per_tile : {1, 2}) {
            if (segments_per_tile == 2 && (m != 512 || block_m != 128)) continue;  // 64 rows per rank only
            const Case c{m, n, 8, block_m, 256, 8, own_lag, segments_per_tile};
            EXPECT_EQ(check_case(c), 0);
            EXPECT_EQ(check_permutation(c), 0);
            EXPECT_EQ(check_own_tiles_wait_for_peers(c), 0);
          }
        }
      }
    }
  }
}

// M = 512 at P = 8 in bands of two segments: rank 3 (band 1, with rank 2) starts with band 2
// (ranks 4 and 5) and ends with its own band, each 128-row tile half its own rows, half rank 2's.
TEST(Schedule, BandsOfTwoSegments) {
  const Case c{512, 8192, 8, 128, 256, 4, kOwnTilesLast, 2};
  const TileSchedule s = schedule_of(c, 3);
  ASSERT_EQ(s.num_bands(), 4);
  ASSERT_EQ(s.tiles_per_band(), 32);
  const Tile first = s.tile(0);
  EXPECT_EQ(first.owner_rank, 4);
  EXPECT_EQ(first.row_begin, 256);
  EXPECT_EQ(first.row_end, 384);
  EXPECT_EQ(first.owner_of(0), 4);
  EXPECT_EQ(first.owner_of(64), 5);
  EXPECT_EQ(first.segment_row_of(64), 0);
  for (int step = s.num_tiles() - 32; step < s.num_tiles(); ++step) {
    const Tile own = s.tile(step);
    EXPECT_EQ(own.owner_rank, 2) << "step " << step;
    EXPECT_EQ(own.owner_of(64), 3) << "step " << step;
    EXPECT_EQ(own.row_begin, 128) << "step " << step;
  }
}

// Decode-sized M in one band (M = 64 at P = 8, 8 rows per rank): every rank computes every tile at
// the same step, and a 64-row tile holds all eight owners' rows, 8 each.
TEST(Schedule, OneBandOfAllSegments) {
  const Case c{64, 8192, 8, 64, 256, 8, kOwnTilesLast, 8};
  for (int rank : {0, 5}) {
    const TileSchedule s = schedule_of(c, rank);
    ASSERT_EQ(s.num_bands(), 1);
    ASSERT_EQ(s.num_tiles(), 32);
    for (int step = 0; step < s.num_tiles(); ++step) {
      const Tile t = s.tile(step);
      EXPECT_EQ(t.row_begin, 0);
      EXPECT_EQ(t.row_end, 64);
      EXPECT_EQ(t.col_begin, 256 * step);
      for (int owner = 0; owner < 8; ++owner) {
        EXPECT_EQ(t.owner_of_row(8 * owner + 7), owner);
        EXPECT_EQ(t.segment_row_for(8 * owner + 7, owner), 7);
        EXPECT_EQ(t.segment_row_for(0, owner), -8 * owner);
      }
    }
  }
}

// One band with K split in 3: each tile's splits are consecutive steps of the same tile, cover its
// K blocks once in order, and only the last is last_split().
TEST(Schedule, SplitsOfOneBand) {
  Case c{64, 1000, 8, 64, 256, 8, kOwnTilesLast, 8};
  ScheduleShape shape;
  const TileSchedule whole = schedule_of(c, 2);
  shape = whole.shape();
  shape.num_splits = 3;
  const TileSchedule s(shape);
  ASSERT_EQ(s.num_tiles(), 3 * whole.num_tiles());
  for (int t = 0; t < whole.num_tiles(); ++t) {
    int next_k_block = 0;
    for (int j = 0; j < 3; ++j) {
      const int step = 3 * t + j;
      const Tile a = s.tile(step), b = whole.tile(t);
      EXPECT_EQ(a.row_begin, b.row_begin);
      EXPECT_EQ(a.col_begin, b.col_begin);
      const KSlice k = s.k_slice(step, 10);
      EXPECT_EQ(k.tile_index, t);
      EXPECT_EQ(k.split, j);
      EXPECT_EQ(k.k_block_begin, next_k_block) << "step " << step;
      EXPECT_GE(k.num_k_blocks, 3);
      next_k_block += k.num_k_blocks;
      EXPECT_EQ(s.last_split(step), j == 2);
    }
    EXPECT_EQ(next_k_block, 10);
  }
  EXPECT_TRUE(whole.last_split(5));
  EXPECT_EQ(whole.k_slice(5, 10).num_k_blocks, 10);
}

// The raster picture in schedule.h: group_rows = 2, a band of 4 x 3 tiles.
TEST(Schedule, GroupRasterMatchesTheDiagram) {
  const int expected[4][3] = {{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}};
  for (int P : {1, 4}) {
    ScheduleShape shape;
    shape.world_size = P;
    shape.block_m = 16;
    shape.block_n = 32;
    shape.m = 4 * shape.block_m * P;
    shape.n = 3 * shape.block_n;
    shape.group_rows = 2;
    const TileSchedule s(shape);
    ASSERT_EQ(s.tiles_per_band(), 12);
    for (int step = 0; step < s.num_tiles(); ++step) {
      const Tile t = s.tile(step);
      int offset = 0, index = 0;
      s.locate(step, &offset, &index);
      const int row_tile = t.segment_row / shape.block_m, col_tile = t.col_begin / shape.block_n;
      EXPECT_EQ(expected[row_tile][col_tile], index) << "P=" << P << " step " << step << " tile (" << row_tile << ", "
                                                     << col_tile << ")";
    }
  }
}

// The last row tile of a segment is clipped to the segment, not to m: M=8*65 at P=8, 128-row tiles.
TEST(Schedule, ClipsAtTheSegmentNotAtM) {
  ScheduleShape shape;
  shape.world_size = 8;
  shape.rank = 3;
  shape.m = 8 * 65;
  shape.n = 264;
  shape.block_m = 128;
  shape.block_n = 256;
  shape.group_rows = 8;
  const TileSchedule s(shape);
  ASSERT_EQ(s.row_tiles_per_band(), 1);
  ASSERT_EQ(s.col_tiles(), 2);
  const Tile first = s.tile(0);
  EXPECT_EQ(first.owner_rank, 4);
  EXPECT_EQ(first.row_begin, 4 * 65);
  EXPECT_EQ(first.row_end, 5 * 65);
  EXPECT_EQ(first.segment_row, 0);
  EXPECT_EQ(first.col_begin, 0);
  EXPECT_EQ(first.col_end, 256);
  const Tile second = s.tile(7);  // round 1: tile 1 of the same owner, after round 0's 7 owners
  EXPECT_EQ(second.col_begin, 256);
  EXPECT_EQ(second.col_end, 264);
  const Tile last = s.tile(s.num_tiles() - 1);
  EXPECT_EQ(last.owner_rank, 3);
  EXPECT_EQ(last.row_begin, 3 * 65);
  EXPECT_EQ(last.row_end, 4 * 65);
}

}  // namespace
}  // namespace tpfuse
