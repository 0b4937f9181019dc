// RowSpace: the allocator of the row-space layout (docs/design.md, "The
// row-space layout").
//
// One space of R rows, the same rows in every plane, holds two kinds of unit:
//   - envelopes of E rows (the compress rows of every compress layer, and the
//     CSA indexer, for one logical block), on a lattice from row 0 up:
//     slot p is rows [p*E, (p+1)*E);
//   - SWA units of U rows (one SWA page of every layer), on a lattice from
//     row R down: slot u is rows [swa_base + u*U, swa_base + (u+1)*U) with
//     swa_base = R - (R/U)*U.
// Envelopes fill from the bottom and SWA units from the top, so the free rows
// between the two regions (the gap) belong to neither: either kind grows
// into it. A free slot inside a region (a hole) is taken before the region
// grows, the deepest first (lowest envelope, highest unit), so holes drift
// to the boundary and a freed boundary slot shrinks its region at once.
//
// Every unit belongs to an owner: a logical block (envelope) or an SWA page
// (unit), both ids below the kind's slot count. A bound unit is live, or
// cached (its owner is free but keeps content the prefix cache may hit). When
// a unit is needed and there is no hole and no gap big enough, room is made
// in this order: a cached unit at the other region's boundary is evicted
// (its region shrinks); else the coldest cached unit of the same kind is
// evicted (its slot is reused); else the live unit at the other region's
// boundary is moved into a hole of its own region (or into the slot of that
// region's coldest cached unit, evicted). Evicting a cold cached unit is
// preferred to moving a live one. A move is a row copy the engine applies
// before the step that reads the rows (take_copies); copies between two
// takes never write rows another one still has to read (phases).
//
// So any set of live units whose rows sum to at most R fits: bind() fails
// only when the live rows plus the new unit would exceed R, which the KV
// manager's admission rules out (a yes stays a promise). Every operation is
// O(log n) but for the units it moves or evicts, deterministic, and checks
// ownership; a refused call changes nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "core/slots/slot_list.h"
#include "core/config/state_io.h"

namespace ukv {

enum class UnitKind : int64_t { Envelope = 0, Swa = 1 };

// Copy rows [src_row, src_row + rows) to [dst_row, dst_row + rows) in every
// plane. Copies of phase p run after every copy of phase p - 1 has read its
// rows; within a phase they touch disjoint rows.
struct RowCopy {
  int32_t src_row, dst_row, rows, phase;
};

struct RowSpaceCounters {
  int64_t binds[2] = {0, 0};
  int64_t evictions[2] = {0, 0};  // cached units dropped to make room
  int64_t moves[2] = {0, 0};      // live units moved
  int64_t moved_rows = 0;
};

class RowSpace {
 public:
  static constexpr int32_t kMaxCopyPhases = 4;
  // Called after a cached unit was evicted to make room (its owner is already
  // unbound): the owner's content is gone.
  using EvictListener = std::function<void(UnitKind kind, int64_t owner)>;

  // max_copies bounds the moves between two take_copies() calls.
  RowSpace(int64_t total_rows, int64_t envelope_rows, int64_t unit_rows, int64_t max_copies);

  int64_t total_rows() const { return rows_; }
  int64_t unit_rows(UnitKind k) const { return size_[idx(k)]; }
  int64_t num_slots(UnitKind k) const { return slots_[idx(k)]; }
  int64_t swa_base_row() const { return swa_base_; }
  int64_t first_row(UnitKind k, int64_t slot) const;
  int64_t max_copies() const { return max_copies_; }

  int64_t slot_of(UnitKind k, int64_t owner) const { return slot_of_[idx(k)][static_cast<size_t>(owner)]; }
  bool is_bound(UnitKind k, int64_t owner) const { return slot_of(k, owner) >= 0; }
  bool is_cached(UnitKind k, int64_t owner) const { return lru_[idx(k)].contains(owner); }
  int64_t bound_units(UnitKind k) const { return bound_[idx(k)]; }
  int64_t cached_units(UnitKind k) const { return lru_[idx(k)].size(); }
  int64_t live_units(UnitKind k) const { return bound_units(k) - cached_units(k); }
  int64_t live_rows() const;
  // Rows no unit holds (holes, the gap and the lattices' remainder).
  int64_t unheld_rows() const;
  // The coldest cached unit's owner, -1 when none; the cached owners, coldest first.
  int64_t coldest_cached(UnitKind k) const { return lru_[idx(k)].front(); }
  const SlotList& cached(UnitKind k) const { return lru_[idx(k)]; }
  // Whether live units of these many more envelopes and SWA units fit.
  bool fits(int64_t envelopes, int64_t units) const;

  // Gives owner a unit, making room as the header says. OutOfSlots when the
  // live rows plus this unit exceed the space; StateError when owner already
  // has one or is out of range. Nothing changes on a refusal.
  void bind(UnitKind k, int64_t owner);
  void unbind(UnitKind k, int64_t owner);
  // A bound unit's owner became free with content worth keeping (cached,
  // coldest last), or live again.
  void set_cached(UnitKind k, int64_t owner, bool cached);
  // Drops a cached unit now (the caller forgets the content itself).
  void evict(UnitKind k, int64_t owner);

  // The moves since the last call, in the order they happened.
  std::vector<RowCopy> take_copies();
  int64_t pending_copies() const { return static_cast<int64_t>(copies_.size()); }
  void set_evict_listener(EvictListener fn) { on_evict_ = std::move(fn); }
  const RowSpaceCounters& counters() const { return counters_; }

  void check_invariants() const;
  void write_state(StateWriter& w) const;
  static RowSpace read_state(StateReader& r);

 private:
  static size_t idx(UnitKind k) { return static_cast<size_t>(k); }
  static UnitKind other(UnitKind k) { return k == UnitKind::Envelope ? UnitKind::Swa : UnitKind::Envelope; }
  bool in_region(UnitKind k, int64_t slot) const;
  int64_t gap_rows() const;
  bool can_extend(UnitKind k) const;
  int64_t frontier_slot(UnitKind k) const;  // the region's slot next to the gap, -1 when empty
  // The deepest hole of kind k; with no_overlap, one whose rows no pending copy reads.
  int64_t deepest_hole(UnitKind k, bool no_overlap) const;
  // The phase a copy writing these rows needs: after every pending copy
  // (but `ignore`) that reads them.
  int32_t phase_for(int64_t dst_row, int64_t rows, int64_t ignore = -1) const;
  // The first phase in which a pending copy (but `ignore`) writes these rows
  // (kMaxCopyPhases when none does).
  int32_t first_overwrite(int64_t src_row, int64_t rows, int64_t ignore) const;
  // Drops the pending copy of a unit leaving its slot other than by a move.
  void cancel_copy(UnitKind k, int64_t owner);
  int64_t make_room(UnitKind k);
  void occupy(UnitKind k, int64_t slot, int64_t owner);
  void vacate(UnitKind k, int64_t slot);
  void evict_to_make_room(UnitKind k, int64_t owner);
  void move(UnitKind k, int64_t owner, int64_t to);
  void require_owner(UnitKind k, int64_t owner, const char* what) const;

  int64_t rows_;
  int64_t size_[2];
  int64_t slots_[2];
  int64_t swa_base_;
  int64_t max_copies_;
  std::vector<int32_t> slot_owner_[2];  // [kind][slot] -> owner or -1
  std::vector<int32_t> slot_of_[2];     // [kind][owner] -> slot or -1
  SlotList lru_[2];                     // cached owners, coldest first
  int64_t bound_[2] = {0, 0};
  int64_t env_top_ = 0;                 // envelope region: slots [0, env_top_)
  int64_t swa_low_ = 0;                 // SWA region: slots [swa_low_, slots_[Swa])
  std::set<int64_t> holes_[2];          // free slots inside each region
  std::vector<RowCopy> copies_;
  std::vector<int32_t> copy_prev_;  // [copy] -> the copy it carries content on from (a unit moved twice), or -1
  std::vector<int32_t> copy_index_[2];  // [kind][owner] -> its copy in copies_, or -1
  RowSpaceCounters counters_;
  EvictListener on_evict_;
};

}  // namespace ukv
