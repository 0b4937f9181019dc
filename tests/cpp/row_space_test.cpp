// RowSpace against hand-derived expectations and, in the randomized test, a
// simulated memory: every row holds a tag, the copies the space hands out are
// applied to it, and after every call each live unit's rows must still hold
// its owner's tag, while a bind must succeed exactly when the live rows fit.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "core/common/errors.h"
#include "core/row_space/row_space.h"

namespace ukv {
namespace {

constexpr UnitKind kEnv = UnitKind::Envelope;
constexpr UnitKind kSwa = UnitKind::Swa;

TEST(RowSpace, GeometryPutsEnvelopesAtTheBottomAndUnitsAtTheTop) {
  RowSpace s(100, 7, 20, 8);
  EXPECT_EQ(s.num_slots(kEnv), 14);
  EXPECT_EQ(s.num_slots(kSwa), 5);
  EXPECT_EQ(s.swa_base_row(), 0);
  EXPECT_EQ(s.first_row(kEnv, 3), 21);
  EXPECT_EQ(s.first_row(kSwa, 4), 80);
  RowSpace t(105, 7, 20, 8);
  EXPECT_EQ(t.swa_base_row(), 5);  // the SWA lattice ends at the last row
  EXPECT_EQ(t.first_row(kSwa, 4), 85);
  EXPECT_THROW(RowSpace(0, 1, 1, 0), InvalidArgument);
  EXPECT_THROW(RowSpace(10, 11, 1, 0), InvalidArgument);
  EXPECT_THROW(RowSpace(int64_t{1} << 31, 1, 1, 0), InvalidArgument);
}

TEST(RowSpace, KindsGrowTowardEachOtherAndHolesGoDeepestFirst) {
  RowSpace s(100, 10, 20, 8);
  for (int64_t o = 0; o < 3; ++o) s.bind(kEnv, o);
  s.bind(kSwa, 0);
  s.bind(kSwa, 1);
  EXPECT_EQ(s.slot_of(kEnv, 2), 2);
  EXPECT_EQ(s.slot_of(kSwa, 0), 4);  // the top unit first
  EXPECT_EQ(s.slot_of(kSwa, 1), 3);
  s.unbind(kEnv, 0);  // a hole at the bottom
  s.unbind(kSwa, 0);  // a hole at the top
  s.bind(kEnv, 5);
  s.bind(kSwa, 2);
  EXPECT_EQ(s.slot_of(kEnv, 5), 0);
  EXPECT_EQ(s.slot_of(kSwa, 2), 4);
  s.unbind(kEnv, 2);  // the boundary slot: the region shrinks
  s.bind(kSwa, 3);
  EXPECT_EQ(s.slot_of(kSwa, 3), 2);  // rows 40-59: the gap reached row 20
  s.check_invariants();
}

TEST(RowSpace, BindRefusesWhatDoesNotFitAndChangesNothing) {
  RowSpace s(100, 10, 20, 8);
  for (int64_t o = 0; o < 4; ++o) s.bind(kSwa, o);
  s.bind(kEnv, 0);
  s.bind(kEnv, 1);
  EXPECT_TRUE(s.fits(0, 0));
  EXPECT_FALSE(s.fits(1, 0));
  std::vector<int64_t> before;
  StateWriter w(before);
  s.write_state(w);
  EXPECT_THROW(s.bind(kEnv, 2), OutOfSlots);
  EXPECT_THROW(s.bind(kEnv, 0), StateError);       // already bound
  EXPECT_THROW(s.bind(kEnv, 99), InvalidArgument);  // out of range
  EXPECT_THROW(s.unbind(kSwa, 4), StateError);      // no unit
  EXPECT_THROW(s.evict(kSwa, 0), StateError);      // live, not cached
  std::vector<int64_t> after;
  StateWriter w2(after);
  s.write_state(w2);
  EXPECT_EQ(before, after);
}

TEST(RowSpace, ACachedBoundaryUnitGivesWayBeforeACachedUnitOfTheSameKind) {
  RowSpace s(100, 10, 20, 8);
  std::vector<std::pair<UnitKind, int64_t>> evicted;
  s.set_evict_listener([&](UnitKind k, int64_t owner) { evicted.emplace_back(k, owner); });
  for (int64_t o = 0; o < 4; ++o) s.bind(kSwa, o);  // rows 20-99
  s.bind(kEnv, 0);
  s.bind(kEnv, 1);  // rows 0-19: full
  s.set_cached(kSwa, 0, true);  // the top unit
  s.set_cached(kSwa, 3, true);  // the boundary unit (rows 20-39)
  s.unbind(kEnv, 1);
  s.bind(kEnv, 1);  // its own hole
  EXPECT_TRUE(evicted.empty());
  s.set_cached(kEnv, 0, true);
  s.bind(kEnv, 2);  // needs rows 20-29: the cached boundary unit is dropped
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], std::make_pair(kSwa, int64_t{3}));
  EXPECT_EQ(s.slot_of(kEnv, 2), 2);
  EXPECT_TRUE(s.is_cached(kEnv, 0));  // the cached envelope stayed
  s.check_invariants();
}

TEST(RowSpace, ALiveBoundaryUnitMovesIntoAHoleOfItsRegion) {
  RowSpace s(100, 10, 20, 8);
  for (int64_t o = 0; o < 6; ++o) s.bind(kEnv, o);  // rows 0-59
  s.bind(kSwa, 0);
  s.bind(kSwa, 1);  // rows 60-99
  s.unbind(kEnv, 1);
  s.unbind(kEnv, 2);  // holes at rows 10-29; live boundary envelope 5 at rows 50-59
  s.bind(kSwa, 2);    // needs 20 rows: envelopes 5 and 4 move into the holes
  EXPECT_EQ(s.slot_of(kSwa, 2), 2);  // rows 40-59
  EXPECT_EQ(s.slot_of(kEnv, 5), 1);
  EXPECT_EQ(s.slot_of(kEnv, 4), 2);
  const auto copies = s.take_copies();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ((std::vector<int32_t>{copies[0].src_row, copies[0].dst_row, copies[0].rows, copies[0].phase}),
            (std::vector<int32_t>{50, 10, 10, 0}));
  EXPECT_EQ((std::vector<int32_t>{copies[1].src_row, copies[1].dst_row, copies[1].rows, copies[1].phase}),
            (std::vector<int32_t>{40, 20, 10, 0}));
  EXPECT_EQ(s.counters().moves[0], 2);
  EXPECT_EQ(s.counters().moved_rows, 20);
  EXPECT_TRUE(s.take_copies().empty());
  s.check_invariants();
}

// A unit moved and then freed in the same step leaves no copy behind: that
// copy would write the rows another unit moves into in the same phase (two
// parallel writers). A unit moved twice has one copy from where its content is.
TEST(RowSpace, AFreedUnitsCopyIsDroppedAndAUnitMovedTwiceIsCopiedOnce) {
  RowSpace s(120, 10, 20, 16);
  for (int64_t o = 0; o < 6; ++o) s.bind(kEnv, o);  // rows 0-59
  for (int64_t o = 0; o < 3; ++o) s.bind(kSwa, o);  // rows 60-119
  s.unbind(kEnv, 1);
  s.unbind(kEnv, 2);
  s.bind(kSwa, 3);    // envelope 5: rows 50 -> 10, envelope 4: 40 -> 20
  s.unbind(kEnv, 5);  // its copy is dropped
  s.unbind(kEnv, 0);
  s.bind(kSwa, 4);    // envelope 3: 30 -> 0; envelope 4 on to rows 10-19, straight from 40
  EXPECT_EQ(s.slot_of(kEnv, 3), 0);
  EXPECT_EQ(s.slot_of(kEnv, 4), 1);
  s.check_invariants();
  const auto copies = s.take_copies();
  std::vector<std::vector<int32_t>> got;
  for (const RowCopy& c : copies) got.push_back({c.src_row, c.dst_row, c.rows, c.phase});
  EXPECT_EQ(got, (std::vector<std::vector<int32_t>>{{40, 10, 10, 0}, {30, 0, 10, 0}}));
}

// ---------------------------------------------------------------------------
// Randomized: a simulated memory checks every copy list.

struct Simulated {
  explicit Simulated(RowSpace& s) : space(s), rows(static_cast<size_t>(s.total_rows()), -1) {}

  static int64_t tag(UnitKind k, int64_t owner) { return (static_cast<int64_t>(k) << 32) | owner; }

  void apply_copies() {
    std::vector<RowCopy> copies = space.take_copies();
    for (const RowCopy& c : copies) later_phases += c.phase > 0;
    for (int32_t phase = 0; phase < RowSpace::kMaxCopyPhases; ++phase) {
      // Within a phase every copy reads before any writes: take the sources first.
      std::vector<std::vector<int64_t>> read;
      for (const RowCopy& c : copies)
        if (c.phase == phase) read.emplace_back(rows.begin() + c.src_row, rows.begin() + c.src_row + c.rows);
      // ... and writes in reverse order, so two writers of one row in a phase
      // (which a GPU runs in no defined order) show up as lost content.
      size_t i = read.size();
      for (auto c = copies.rbegin(); c != copies.rend(); ++c)
        if (c->phase == phase) --i, std::copy(read[i].begin(), read[i].end(), rows.begin() + c->dst_row);
    }
  }

  void write(UnitKind k, int64_t owner) {
    const int64_t first = space.first_row(k, space.slot_of(k, owner));
    std::fill(rows.begin() + first, rows.begin() + first + space.unit_rows(k), tag(k, owner));
  }

  void check() {
    for (UnitKind k : {kEnv, kSwa})
      for (int64_t owner = 0; owner < space.num_slots(k); ++owner) {
        if (!space.is_bound(k, owner) || !written[static_cast<size_t>(k)].count(owner)) continue;
        const int64_t first = space.first_row(k, space.slot_of(k, owner));
        for (int64_t r = first; r < first + space.unit_rows(k); ++r)
          ASSERT_EQ(rows[static_cast<size_t>(r)], tag(k, owner)) << "row " << r << " of owner " << owner;
      }
  }

  RowSpace& space;
  std::vector<int64_t> rows;
  std::map<int64_t, bool> written[2];
  int64_t later_phases = 0;
};

// Steps of several calls, as an engine makes them between two stage() calls:
// the copies are applied once, at the step's end, before the new units are
// written (the model's forward runs after the copy op).
TEST(RowSpace, RandomizedStepsKeepEveryLiveUnitsRowsAndBindExactlyWhatFits) {
  int64_t moves = 0, evictions = 0, later_phases = 0;
  for (int calls_per_step : {1, 12}) {
    for (int seed = 0; seed < 40; ++seed) {
      std::mt19937 rng(static_cast<unsigned>(seed));
      const int64_t env = 3 + seed % 9, unit = 4 + (seed * 7) % 13, total = 60 + (seed * 37) % 200;
      RowSpace s(total, env, unit, 1 << 20);
      Simulated mem(s);
      s.set_evict_listener([&](UnitKind k, int64_t o) { mem.written[static_cast<size_t>(k)].erase(o); });
      std::vector<std::pair<UnitKind, int64_t>> fresh;  // bound this step, written at its end
      for (int call = 1; call <= 600; ++call) {
        const UnitKind k = rng() % 2 ? kEnv : kSwa;
        const int64_t owner = static_cast<int64_t>(rng() % static_cast<unsigned>(s.num_slots(k)));
        const int op = static_cast<int>(rng() % 4);
        if (!s.is_bound(k, owner)) {
          if (s.fits(k == kEnv, k == kSwa)) {
            s.bind(k, owner);
            fresh.emplace_back(k, owner);
          } else {
            EXPECT_THROW(s.bind(k, owner), OutOfSlots);
          }
        } else if (op == 0) {
          s.unbind(k, owner);
          mem.written[static_cast<size_t>(k)].erase(owner);
        } else {
          s.set_cached(k, owner, op == 1);
        }
        s.check_invariants();
        if (call % calls_per_step != 0) continue;
        mem.apply_copies();
        for (const auto& [fk, fo] : fresh) {
          if (!s.is_bound(fk, fo)) continue;
          mem.write(fk, fo);
          mem.written[static_cast<size_t>(fk)][fo] = true;
        }
        fresh.clear();
        mem.check();
      }
      moves += s.counters().moves[0] + s.counters().moves[1];
      evictions += s.counters().evictions[0] + s.counters().evictions[1];
      later_phases += mem.later_phases;
    }
  }
  // The runs must reach the paths they check.
  EXPECT_GT(moves, 100);
  EXPECT_GT(evictions, 100);
  std::printf("moves %lld, evictions %lld, copies in later phases %lld\n", static_cast<long long>(moves),
              static_cast<long long>(evictions), static_cast<long long>(later_phases));
}

TEST(RowSpace, StateRoundTripsAndACorruptedOneIsRefused) {
  RowSpace s(100, 10, 20, 8);
  for (int64_t o = 0; o < 5; ++o) s.bind(kEnv, o);
  s.bind(kSwa, 0);
  s.set_cached(kEnv, 1, true);
  s.unbind(kEnv, 2);
  std::vector<int64_t> st;
  StateWriter w(st);
  s.write_state(w);
  StateReader r(st, "row space state");
  const RowSpace copy = RowSpace::read_state(r);
  r.finish();
  std::vector<int64_t> again;
  StateWriter w2(again);
  copy.write_state(w2);
  EXPECT_EQ(st, again);
  auto bad = st;
  bad[5] = 3;  // envelope slot 0 claims owner 3, which slot 3 owns too
  StateReader rb(bad, "row space state");
  EXPECT_THROW(RowSpace::read_state(rb), InvalidArgument);
}

}  // namespace
}  // namespace ukv
