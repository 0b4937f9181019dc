#include "core/slots/swa_blocks.h"

#include "core/common/errors.h"

namespace ukv {

SwaBlocks::SwaBlocks(int64_t num_pages, int64_t page_tokens, Coordinator* coordinator, RowSpace* rows,
                     int64_t checkpoint_capacity, KvEventLog* events)
    : coordinator_(coordinator), rows_(rows), unbound_free_(rows ? num_pages : 0),
      checkpoint_capacity_(checkpoint_capacity), ref_(static_cast<size_t>(num_pages), 0),
      contents_(num_pages, page_tokens, KvRole::Swa, events), lru_(num_pages) {
  if (rows_) {
    for (int64_t id = 0; id < num_pages; ++id) unbound_free_.push_back(id);
  } else if (!coordinator_) {
    static_pool_ = std::make_unique<TypePool>(num_pages, 0, page_tokens);
  }
}

int64_t SwaBlocks::free_slots() const {
  if (rows_) return (rows_->total_rows() - rows_->live_rows()) / rows_->unit_rows(UnitKind::Swa);
  return coordinator_ ? coordinator_->free_swa_slots() : static_pool_->free_slots();
}

int64_t SwaBlocks::held_slots() const {
  if (rows_) return rows_->live_units(UnitKind::Swa);
  return coordinator_ ? coordinator_->held_swa_slots() : static_pool_->held_slots(SlotOwner::Swa);
}

int64_t SwaBlocks::source_alloc() {
  if (coordinator_) return coordinator_->alloc_swa();
  if (!rows_) return static_pool_->alloc_swa();
  // A unit without evicting anything while the row space has room; else the
  // coldest cached page gives its unit up; else the row space makes room
  // (evicting cached envelopes or moving live ones).
  const int64_t unit_rows = rows_->unit_rows(UnitKind::Swa);
  const int64_t cold = rows_->coldest_cached(UnitKind::Swa);
  if (cold >= 0 && (unbound_free_.empty() || rows_->unheld_rows() < unit_rows)) {
    rows_->set_cached(UnitKind::Swa, cold, false);
    return cold;
  }
  require<OutOfSlots>(!unbound_free_.empty(), "No free SWA slots available");
  const int64_t id = unbound_free_.front();
  rows_->bind(UnitKind::Swa, id);  // OutOfSlots, nothing changed, when no room is left
  unbound_free_.pop_front();
  return id;
}

void SwaBlocks::source_free(int64_t id) {
  if (coordinator_) return coordinator_->free_swa(id);
  if (!rows_) return static_pool_->free_swa(id);
  if (contents_.has_hash(id)) return rows_->set_cached(UnitKind::Swa, id, true);
  rows_->unbind(UnitKind::Swa, id);  // nothing a later hit could use
  unbound_free_.push_back(id);
}

void SwaBlocks::source_claim(int64_t id) {
  if (coordinator_) return coordinator_->claim_swa(id);
  if (!rows_) return static_pool_->claim_swa(id);
  rows_->set_cached(UnitKind::Swa, id, false);
}

bool SwaBlocks::source_is_free(int64_t id) const {
  if (rows_) return !rows_->is_bound(UnitKind::Swa, id) || rows_->is_cached(UnitKind::Swa, id);
  return coordinator_ ? coordinator_->is_free_swa(id) : static_pool_->is_free_swa(id);
}

void SwaBlocks::on_row_evicted(int64_t id) {
  require<StateError>(ref_[static_cast<size_t>(id)] == 0, "SWA page ", id, " evicted while referenced");
  contents_.forget(id);
  unbound_free_.push_back(id);
}

int64_t SwaBlocks::alloc() {
  const int64_t id = source_alloc();
  contents_.forget(id);  // lazy eviction: reuse is the true eviction point
  ref_[static_cast<size_t>(id)] = 1;
  return id;
}

void SwaBlocks::claim(int64_t id) {
  auto& r = ref_[static_cast<size_t>(id)];
  if (r > 0) {
    ++r;
  } else {
    source_claim(id);
    r = 1;
  }
  refresh(id);
}

void SwaBlocks::release(int64_t id) {
  auto& r = ref_[static_cast<size_t>(id)];
  require<StateError>(r > 0, "SWA block ", id, " released with ref 0");
  if (--r == 0) source_free(id);
}

void SwaBlocks::pin(int64_t id) {
  if (lru_.contains(id)) {
    refresh(id);
    return;
  }
  ++ref_[static_cast<size_t>(id)];
  lru_.push_back(id);
  while (lru_.size() > checkpoint_capacity_) release(lru_.pop_front());
}

void SwaBlocks::evict_slot(int64_t id) {
  // Only released slots are borrowed; a pinned checkpoint keeps a reference
  // and so is never evicted this way.
  require<StateError>(ref_[static_cast<size_t>(id)] == 0, "SWA slot ", id, " evicted while referenced");
  contents_.forget(id);
}

void SwaBlocks::clear_cache() {
  // Pins exist only to keep cached checkpoints; without the cache they would
  // hold their slots forever.
  while (!lru_.empty()) release(lru_.pop_front());
  contents_.clear([this](int64_t id) { return ref_[static_cast<size_t>(id)] == 0; });
  if (!rows_) return;
  // Cached units keep nothing now: give them back.
  for (int64_t id = rows_->coldest_cached(UnitKind::Swa); id >= 0; id = rows_->coldest_cached(UnitKind::Swa)) {
    rows_->evict(UnitKind::Swa, id);
    unbound_free_.push_back(id);
  }
}

void SwaBlocks::check_invariants() const {
  int64_t held = 0;
  for (int64_t id = 0; id < num_blocks(); ++id) {
    const auto r = ref_[static_cast<size_t>(id)];
    require<StateError>(r >= 0, "SWA block ", id, " has negative ref");
    require<StateError>(r == 0 || !source_is_free(id), "SWA block ", id, " is referenced but its slot is free");
    require<StateError>(!lru_.contains(id) || r > 0, "pinned SWA block ", id, " has ref 0");
    held += r > 0;
  }
  require<StateError>(held == held_slots(), "SWA held-slot count ", held_slots(), " != referenced blocks ", held);
  if (rows_) {
    for (int64_t id = 0; id < num_blocks(); ++id) {
      const bool bound = rows_->is_bound(UnitKind::Swa, id), free = ref_[static_cast<size_t>(id)] == 0;
      require<StateError>(unbound_free_.contains(id) == (free && !bound), "SWA page ", id, " unbound-free membership");
      require<StateError>(rows_->is_cached(UnitKind::Swa, id) == (free && bound), "SWA page ", id,
                          " is cached in the row space iff it is free and holds a unit");
      require<StateError>(!(free && bound) || contents_.has_hash(id), "cached SWA page ", id, " has no content");
    }
  }
  require<StateError>(lru_.size() <= checkpoint_capacity_, "checkpoint LRU over capacity");
  contents_.check_invariants("SWA");
  if (static_pool_) static_pool_->check_invariants();
}

void SwaBlocks::write_state(StateWriter& w) const {
  w.put(num_blocks());
  for (int64_t id = 0; id < num_blocks(); ++id) {
    w.put(ref_[static_cast<size_t>(id)]);
    contents_.write_block(w, id);
  }
  contents_.write_map(w);
  w.put_vec(lru_.to_vector());
  if (static_pool_) static_pool_->write_state(w);
  if (rows_) w.put_vec(unbound_free_.to_vector());
}

void SwaBlocks::read_state(StateReader& r) {
  r.check(r.next() == num_blocks(), "the SWA block count differs from the configuration");
  for (int64_t id = 0; id < num_blocks(); ++id) {
    ref_[static_cast<size_t>(id)] = static_cast<int32_t>(r.in_range(0, INT32_MAX, "SWA block ref"));
    contents_.read_block(r, id);
  }
  contents_.read_map(r, "SWA");
  lru_ = SlotList(num_blocks());
  for (int64_t id : r.vec<int64_t>(num_blocks(), "pinned SWA block")) {
    r.check(id >= 0 && id < num_blocks() && !lru_.contains(id), "bad pinned SWA block ", id);
    lru_.push_back(id);
  }
  if (static_pool_) *static_pool_ = TypePool::read_state(r);
  if (rows_) {
    unbound_free_ = SlotList(num_blocks());
    for (int64_t id : r.vec<int64_t>(num_blocks(), "unbound free SWA page")) {
      r.check(id >= 0 && id < num_blocks() && !unbound_free_.contains(id), "bad unbound free SWA page ", id);
      unbound_free_.push_back(id);
    }
  }
}

}  // namespace ukv
