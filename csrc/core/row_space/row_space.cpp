#include "core/row_space/row_space.h"

#include <algorithm>

#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {
namespace {

const char* kind_name(UnitKind k) { return k == UnitKind::Envelope ? "envelope" : "SWA unit"; }

bool overlaps(int64_t a, int64_t a_rows, int64_t b, int64_t b_rows) {
  return a_rows > 0 && b_rows > 0 && a < b + b_rows && b < a + a_rows;
}

}  // namespace

RowSpace::RowSpace(int64_t total_rows, int64_t envelope_rows, int64_t unit_rows, int64_t max_copies)
    : rows_(total_rows), size_{envelope_rows, unit_rows}, max_copies_(max_copies) {
  require(total_rows > 0 && total_rows <= kMaxRows, "row space: total_rows must be in [1, ", kMaxRows, "], got ",
          total_rows);
  require(envelope_rows > 0 && envelope_rows <= total_rows, "row space: envelope_rows must be in [1, total_rows ",
          total_rows, "], got ", envelope_rows);
  require(unit_rows > 0 && unit_rows <= total_rows, "row space: swa_unit_rows must be in [1, total_rows ", total_rows,
          "], got ", unit_rows);
  require(max_copies >= 0, "row space: max_copies must be >= 0, got ", max_copies);
  slots_[0] = total_rows / envelope_rows;
  slots_[1] = total_rows / unit_rows;
  swa_base_ = total_rows - slots_[1] * unit_rows;
  swa_low_ = slots_[1];
  for (size_t k = 0; k < 2; ++k) {
    slot_owner_[k].assign(static_cast<size_t>(slots_[k]), -1);
    slot_of_[k].assign(static_cast<size_t>(slots_[k]), -1);
    copy_index_[k].assign(static_cast<size_t>(slots_[k]), -1);
    lru_[k] = SlotList(slots_[k]);
  }
}

int64_t RowSpace::first_row(UnitKind k, int64_t slot) const {
  return k == UnitKind::Envelope ? slot * size_[0] : swa_base_ + slot * size_[1];
}

int64_t RowSpace::live_rows() const {
  return live_units(UnitKind::Envelope) * size_[0] + live_units(UnitKind::Swa) * size_[1];
}

int64_t RowSpace::unheld_rows() const { return rows_ - bound_[0] * size_[0] - bound_[1] * size_[1]; }

bool RowSpace::fits(int64_t envelopes, int64_t units) const {
  // Sums of counts below the int32 slot limit times row sizes below 2^31: no overflow.
  return envelopes >= 0 && units >= 0 && live_rows() + envelopes * size_[0] + units * size_[1] <= rows_;
}

bool RowSpace::in_region(UnitKind k, int64_t slot) const {
  return k == UnitKind::Envelope ? slot < env_top_ : slot >= swa_low_;
}

int64_t RowSpace::gap_rows() const { return first_row(UnitKind::Swa, swa_low_) - env_top_ * size_[0]; }

bool RowSpace::can_extend(UnitKind k) const {
  const bool lattice_left = k == UnitKind::Envelope ? env_top_ < slots_[0] : swa_low_ > 0;
  return lattice_left && gap_rows() >= size_[idx(k)];
}

int64_t RowSpace::frontier_slot(UnitKind k) const {
  if (k == UnitKind::Envelope) return env_top_ > 0 ? env_top_ - 1 : -1;
  return swa_low_ < slots_[1] ? swa_low_ : -1;
}

int32_t RowSpace::phase_for(int64_t dst_row, int64_t rows, int64_t ignore) const {
  int32_t phase = 0;
  for (size_t i = 0; i < copies_.size(); ++i) {
    const RowCopy& c = copies_[i];
    if (static_cast<int64_t>(i) != ignore && overlaps(dst_row, rows, c.src_row, c.rows))
      phase = std::max(phase, c.phase + 1);
  }
  return phase;
}

int32_t RowSpace::first_overwrite(int64_t src_row, int64_t rows, int64_t ignore) const {
  int32_t phase = kMaxCopyPhases;
  for (size_t i = 0; i < copies_.size(); ++i) {
    const RowCopy& c = copies_[i];
    if (static_cast<int64_t>(i) != ignore && overlaps(src_row, rows, c.dst_row, c.rows))
      phase = std::min(phase, c.phase);
  }
  return phase;
}

void RowSpace::cancel_copy(UnitKind k, int64_t owner) {
  int32_t& index = copy_index_[idx(k)][static_cast<size_t>(owner)];
  // Nothing needs the content any more. Left in place, the copies (a chain
  // for a unit moved on from where a copy put it) would still write rows a
  // later move may fill in the same phase.
  for (int64_t cur = index; cur >= 0; cur = copy_prev_[static_cast<size_t>(cur)])
    copies_[static_cast<size_t>(cur)].rows = 0;
  index = -1;
}

int64_t RowSpace::deepest_hole(UnitKind k, bool no_overlap) const {
  const auto& holes = holes_[idx(k)];
  const auto acceptable = [&](int64_t slot) {
    return !no_overlap || phase_for(first_row(k, slot), size_[idx(k)]) == 0;
  };
  if (k == UnitKind::Envelope) {
    for (int64_t slot : holes)
      if (acceptable(slot)) return slot;
  } else {
    for (auto it = holes.rbegin(); it != holes.rend(); ++it)
      if (acceptable(*it)) return *it;
  }
  return -1;
}

void RowSpace::occupy(UnitKind k, int64_t slot, int64_t owner) {
  const size_t i = idx(k);
  if (in_region(k, slot)) {
    holes_[i].erase(slot);
  } else if (k == UnitKind::Envelope) {  // the region grows by one slot into the gap
    env_top_ = slot + 1;
  } else {
    swa_low_ = slot;
  }
  slot_owner_[i][static_cast<size_t>(slot)] = static_cast<int32_t>(owner);
  slot_of_[i][static_cast<size_t>(owner)] = static_cast<int32_t>(slot);
  ++bound_[i];
}

void RowSpace::vacate(UnitKind k, int64_t slot) {
  const size_t i = idx(k);
  slot_of_[i][static_cast<size_t>(slot_owner_[i][static_cast<size_t>(slot)])] = -1;
  slot_owner_[i][static_cast<size_t>(slot)] = -1;
  --bound_[i];
  holes_[i].insert(slot);
  // Free slots next to the gap leave the region: the gap grows.
  for (int64_t f = frontier_slot(k); f >= 0 && slot_owner_[i][static_cast<size_t>(f)] < 0; f = frontier_slot(k)) {
    holes_[i].erase(f);
    if (k == UnitKind::Envelope) --env_top_; else ++swa_low_;
  }
}

void RowSpace::evict_to_make_room(UnitKind k, int64_t owner) {
  lru_[idx(k)].erase(owner);
  cancel_copy(k, owner);
  vacate(k, slot_of(k, owner));
  ++counters_.evictions[idx(k)];
  if (on_evict_) on_evict_(k, owner);
}

void RowSpace::move(UnitKind k, int64_t owner, int64_t to) {
  const size_t i = idx(k);
  const int64_t from = slot_of(k, owner), rows = size_[i];
  const int64_t dst_row = first_row(k, to);
  int32_t& index = copy_index_[i][static_cast<size_t>(owner)];
  // Moved before in this step: its first source still holds the content, so
  // that copy can end here instead (nothing reads its old destination), if
  // it still reads the source before any copy overwrites it. Otherwise a
  // second copy carries the content on from the old destination.
  const int32_t rerouted = index >= 0 ? phase_for(dst_row, rows, index) : kMaxCopyPhases;
  const bool reroute =
      index >= 0 && rerouted < first_overwrite(copies_[static_cast<size_t>(index)].src_row, rows, index);
  const int32_t phase = reroute  ? rerouted
                        : index >= 0 ? std::max(phase_for(dst_row, rows), copies_[static_cast<size_t>(index)].phase + 1)
                                     : phase_for(dst_row, rows);
  // Checked before anything changes.
  require<StateError>(reroute || static_cast<int64_t>(copies_.size()) < max_copies_, "row space: more than ",
                      max_copies_, " unit moves between two take_copies() calls; stage the tables every step");
  require<StateError>(phase < kMaxCopyPhases, "internal: a row copy needs more than ", kMaxCopyPhases, " phases");
  if (reroute) {
    RowCopy& c = copies_[static_cast<size_t>(index)];
    c.dst_row = static_cast<int32_t>(dst_row);
    c.phase = phase;
  } else {
    copies_.push_back({static_cast<int32_t>(first_row(k, from)), static_cast<int32_t>(dst_row),
                       static_cast<int32_t>(rows), phase});
    copy_prev_.push_back(index);  // -1, or the link this one carries on from
    index = static_cast<int32_t>(copies_.size() - 1);
  }
  vacate(k, from);
  occupy(k, to, owner);
  ++counters_.moves[i];
  counters_.moved_rows += rows;
}

int64_t RowSpace::make_room(UnitKind k) {
  const UnitKind o = other(k);
  for (;;) {
    int64_t slot = deepest_hole(k, false);
    if (slot >= 0) return slot;
    if (can_extend(k)) return k == UnitKind::Envelope ? env_top_ : swa_low_ - 1;
    const int64_t f = frontier_slot(o);
    require<StateError>(f >= 0, "internal: row space has no room for a ", kind_name(k), " and nothing to give way");
    const int64_t boundary_owner = slot_owner_[idx(o)][static_cast<size_t>(f)];
    if (is_cached(o, boundary_owner)) {  // the boundary gives way: its region shrinks
      evict_to_make_room(o, boundary_owner);
      continue;
    }
    if (const int64_t cold = coldest_cached(k); cold >= 0) {  // reuse the coldest slot of this kind
      evict_to_make_room(k, cold);
      continue;
    }
    // Move the live boundary unit deeper into its region: into a hole whose
    // rows no pending copy still reads, else the slot of a cached unit, else
    // any hole (a later copy phase).
    int64_t to = deepest_hole(o, true);
    if (to < 0) {
      for (int64_t v = lru_[idx(o)].front(); v >= 0 && to < 0; v = lru_[idx(o)].next(v))
        if (v != boundary_owner && phase_for(first_row(o, slot_of(o, v)), size_[idx(o)]) == 0) to = slot_of(o, v);
      // A cached unit deeper than the live boundary: evicting it leaves a hole.
      if (to >= 0) evict_to_make_room(o, slot_owner_[idx(o)][static_cast<size_t>(to)]);
    }
    if (to < 0) to = deepest_hole(o, false);
    if (to < 0 && coldest_cached(o) >= 0) {
      evict_to_make_room(o, coldest_cached(o));
      continue;
    }
    require<StateError>(to >= 0, "internal: row space has no room for a ", kind_name(k),
                        " although the live rows fit (", live_rows(), " of ", rows_, ")");
    move(o, boundary_owner, to);
  }
}

void RowSpace::require_owner(UnitKind k, int64_t owner, const char* what) const {
  require(owner >= 0 && owner < slots_[idx(k)], "row space ", what, ": ", kind_name(k), " owner ", owner,
          " out of range [0, ", slots_[idx(k)], ")");
}

void RowSpace::bind(UnitKind k, int64_t owner) {
  require_owner(k, owner, "bind");
  require<StateError>(!is_bound(k, owner), "row space bind: ", kind_name(k), " owner ", owner, " already has a unit");
  require<OutOfSlots>(fits(k == UnitKind::Envelope, k == UnitKind::Swa), "No free KV slots available: a ",
                      kind_name(k), " of ", size_[idx(k)], " rows does not fit beside ", live_rows(),
                      " live rows of ", rows_);
  const int64_t slot = make_room(k);
  occupy(k, slot, owner);
  ++counters_.binds[idx(k)];
}

void RowSpace::unbind(UnitKind k, int64_t owner) {
  require_owner(k, owner, "unbind");
  require<StateError>(is_bound(k, owner), "row space unbind: ", kind_name(k), " owner ", owner, " has no unit");
  if (lru_[idx(k)].contains(owner)) lru_[idx(k)].erase(owner);
  cancel_copy(k, owner);
  vacate(k, slot_of(k, owner));
}

void RowSpace::set_cached(UnitKind k, int64_t owner, bool cached) {
  require_owner(k, owner, "set_cached");
  require<StateError>(is_bound(k, owner), "row space set_cached: ", kind_name(k), " owner ", owner, " has no unit");
  SlotList& lru = lru_[idx(k)];
  if (cached && !lru.contains(owner)) lru.push_back(owner);
  if (!cached && lru.contains(owner)) lru.erase(owner);
}

void RowSpace::evict(UnitKind k, int64_t owner) {
  require_owner(k, owner, "evict");
  require<StateError>(is_cached(k, owner), "row space evict: ", kind_name(k), " owner ", owner, " is not cached");
  lru_[idx(k)].erase(owner);
  cancel_copy(k, owner);
  vacate(k, slot_of(k, owner));
  ++counters_.evictions[idx(k)];
}

std::vector<RowCopy> RowSpace::take_copies() {
  for (size_t k = 0; k < 2; ++k)
    for (auto& index : copy_index_[k]) index = -1;
  std::vector<RowCopy> out;
  for (const RowCopy& c : copies_)
    if (c.rows > 0) out.push_back(c);  // cancelled ones copy nothing
  copies_.clear();
  copy_prev_.clear();
  return out;
}

void RowSpace::check_invariants() const {
  require<StateError>(gap_rows() >= 0, "row space: the regions overlap (gap ", gap_rows(), ")");
  for (size_t k = 0; k < 2; ++k) {
    const auto kind = static_cast<UnitKind>(k);
    int64_t bound = 0;
    for (int64_t slot = 0; slot < slots_[k]; ++slot) {
      const int32_t owner = slot_owner_[k][static_cast<size_t>(slot)];
      const bool inside = in_region(kind, slot);
      require<StateError>(owner < 0 || inside, "row space: ", kind_name(kind), " slot ", slot, " outside its region");
      require<StateError>((owner < 0 && inside) == (holes_[k].count(slot) != 0), "row space: ", kind_name(kind),
                          " slot ", slot, " hole membership");
      if (owner < 0) continue;
      ++bound;
      require<StateError>(slot_of_[k][static_cast<size_t>(owner)] == slot, "row space: ", kind_name(kind), " slot ",
                          slot, " owner map");
    }
    for (int64_t owner = 0; owner < slots_[k]; ++owner) {
      const int32_t slot = slot_of_[k][static_cast<size_t>(owner)];
      require<StateError>(slot < 0 || slot_owner_[k][static_cast<size_t>(slot)] == owner, "row space: ",
                          kind_name(kind), " owner ", owner, " slot map");
      require<StateError>(!lru_[k].contains(owner) || slot >= 0, "row space: cached ", kind_name(kind), " owner ",
                          owner, " has no unit");
    }
    require<StateError>(bound == bound_[k], "row space: ", kind_name(kind), " bound count");
    const int64_t f = frontier_slot(kind);
    require<StateError>(f < 0 || slot_owner_[k][static_cast<size_t>(f)] >= 0, "row space: ", kind_name(kind),
                        " region ends in a free slot");
  }
  require<StateError>(static_cast<int64_t>(copies_.size()) <= max_copies_, "row space: copy list over capacity");
  // Copies of one phase run in parallel: none may write rows another one of
  // the same phase reads or writes.
  for (size_t i = 0; i < copies_.size(); ++i)
    for (size_t j = 0; j < copies_.size(); ++j) {
      const RowCopy &a = copies_[i], &b = copies_[j];
      require<StateError>(i == j || a.phase != b.phase ||
                              (!overlaps(a.dst_row, a.rows, b.src_row, b.rows) &&
                               !overlaps(a.dst_row, a.rows, b.dst_row, b.rows)),
                          "row space: copies ", i, " and ", j, " of phase ", a.phase, " touch the same rows");
    }
}

void RowSpace::write_state(StateWriter& w) const {
  for (int64_t v : {rows_, size_[0], size_[1], max_copies_}) w.put(v);
  for (size_t k = 0; k < 2; ++k) {
    w.put_vec(slot_owner_[k]);
    w.put_vec(lru_[k].to_vector());
  }
  w.put(static_cast<int64_t>(copies_.size()));
  for (size_t i = 0; i < copies_.size(); ++i) {
    const RowCopy& c = copies_[i];
    for (int64_t v : {c.src_row, c.dst_row, c.rows, c.phase, copy_prev_[i]}) w.put(v);
  }
  for (size_t k = 0; k < 2; ++k) w.put_vec(copy_index_[k]);
  for (size_t k = 0; k < 2; ++k)
    for (int64_t v : {counters_.binds[k], counters_.evictions[k], counters_.moves[k]}) w.put(v);
  w.put(counters_.moved_rows);
}

RowSpace RowSpace::read_state(StateReader& r) {
  const int64_t rows = r.next(), env = r.next(), unit = r.next(), max_copies = r.next();
  RowSpace s(rows, env, unit, max_copies);  // validates the geometry
  for (size_t k = 0; k < 2; ++k) {
    const auto kind = static_cast<UnitKind>(k);
    const auto owners = r.vec<int64_t>(s.slots_[k], "row space slot");
    r.check(static_cast<int64_t>(owners.size()) == s.slots_[k], "row space slot count differs from the geometry");
    for (int64_t slot = 0; slot < s.slots_[k]; ++slot) {
      const int64_t owner = owners[static_cast<size_t>(slot)];
      if (owner < 0) continue;
      r.check(owner < s.slots_[k] && s.slot_of_[k][static_cast<size_t>(owner)] < 0, "bad row space owner ", owner);
      s.slot_owner_[k][static_cast<size_t>(slot)] = static_cast<int32_t>(owner);
      s.slot_of_[k][static_cast<size_t>(owner)] = static_cast<int32_t>(slot);
      ++s.bound_[k];
      if (kind == UnitKind::Envelope) s.env_top_ = std::max(s.env_top_, slot + 1);
      else s.swa_low_ = std::min(s.swa_low_, slot);
    }
    for (int64_t owner : r.vec<int64_t>(s.slots_[k], "cached owner")) {
      r.check(owner >= 0 && owner < s.slots_[k] && s.slot_of_[k][static_cast<size_t>(owner)] >= 0 &&
                  !s.lru_[k].contains(owner),
              "bad cached owner ", owner);
      s.lru_[k].push_back(owner);
    }
  }
  for (size_t k = 0; k < 2; ++k)
    for (int64_t slot = 0; slot < s.slots_[k]; ++slot)
      if (s.slot_owner_[k][static_cast<size_t>(slot)] < 0 && s.in_region(static_cast<UnitKind>(k), slot))
        s.holes_[k].insert(slot);
  const int64_t ncopies = r.count(max_copies, "row copy");
  for (int64_t i = 0; i < ncopies; ++i) {
    RowCopy c{};
    c.src_row = static_cast<int32_t>(r.in_range(0, rows - 1, "copy source"));
    c.dst_row = static_cast<int32_t>(r.in_range(0, rows - 1, "copy destination"));
    c.rows = static_cast<int32_t>(r.in_range(0, rows, "copy rows"));  // 0: cancelled
    c.phase = static_cast<int32_t>(r.in_range(0, kMaxCopyPhases - 1, "copy phase"));
    s.copies_.push_back(c);
    s.copy_prev_.push_back(static_cast<int32_t>(r.in_range(-1, i - 1, "copy chain link")));
  }
  for (size_t k = 0; k < 2; ++k) {
    const auto index = r.vec<int64_t>(s.slots_[k], "copy index");
    r.check(static_cast<int64_t>(index.size()) == s.slots_[k], "copy index count differs from the geometry");
    for (size_t i = 0; i < index.size(); ++i) {
      r.check(index[i] >= -1 && index[i] < ncopies, "bad copy index ", index[i]);
      s.copy_index_[k][i] = static_cast<int32_t>(index[i]);
    }
  }
  for (size_t k = 0; k < 2; ++k)
    for (int64_t* v : {&s.counters_.binds[k], &s.counters_.evictions[k], &s.counters_.moves[k]}) *v = r.next();
  s.counters_.moved_rows = r.next();
  try {
    s.check_invariants();
  } catch (const StateError& e) {
    throw InvalidArgument(r.what() + " is inconsistent (row space): " + e.what());
  }
  return s;
}

}  // namespace ukv
