// SwaBlocks: the content-addressed sliding-window page pool (upstream's
// SlidingWindowPool).
//
// A page holds page_tokens positions of every layer. In the slot layouts a
// page is a block and its id is its slot: rows [id*block_size,
// (id+1)*block_size) of every layer tensor. Slots come from the unified
// Coordinator (shared with compress) or, in the static split, from a private
// SWA-only TypePool. In the row-space layout the ids are the manager's own
// (the tables translate them), and each held or cached page has an SWA unit
// of the RowSpace: a released page with content keeps its unit as a cached
// one, a released page without content gives it back, and the row space may
// evict a cached page's unit to make room (on_row_evicted). Pages keep their
// hash after release (lazy eviction at reuse), and the coordinator's eviction
// listener drops it when compress borrows the slot, before compress writes
// there. With sparse retention, checkpoint pages are pinned by an extra
// reference in an LRU of bounded capacity.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/manager/block_contents.h"
#include "core/slots/coordinator.h"
#include "core/row_space/row_space.h"
#include "core/slots/slot_list.h"
#include "core/slots/type_pool.h"

namespace ukv {

class SwaBlocks {
 public:
  // Page ids come from the coordinator, else from the row space, else (the
  // static split) from a private pool.
  // Content changes are recorded in `events` (role Swa).
  SwaBlocks(int64_t num_pages, int64_t page_tokens, Coordinator* coordinator, RowSpace* rows,
            int64_t checkpoint_capacity, KvEventLog* events);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  bool enabled() const { return num_blocks() > 0; }
  int64_t free_slots() const;   // pages SWA may take now
  int64_t held_slots() const;   // pages SWA holds (tables and pins)
  int64_t ref(int64_t id) const { return ref_[static_cast<size_t>(id)]; }
  int64_t checkpoint_capacity() const { return checkpoint_capacity_; }
  int64_t pinned() const { return lru_.size(); }
  bool is_pinned(int64_t id) const { return lru_.contains(id); }

  int64_t lookup(const CacheKey& hash, const int32_t* tokens) const { return contents_.lookup(hash, tokens); }  // -1 if absent
  int64_t alloc();                // fresh block, ref 1, stale hash dropped
  void claim(int64_t id);         // cache hit: a free block is reclaimed, a held one shared
  void release(int64_t id);       // ref - 1; at 0 the slot returns (hash kept)
  // block_hash: the hash of the compress block holding the page (the event's parent).
  void publish(int64_t id, const CacheKey& hash, const int32_t* tokens, const CacheKey& block_hash, uint64_t salt) {
    contents_.publish(id, hash, tokens, true, block_hash, salt);
  }
  void pin(int64_t id);           // checkpoint pin / LRU refresh
  void refresh(int64_t id) { if (lru_.contains(id)) { lru_.erase(id); lru_.push_back(id); } }
  void evict_slot(int64_t id);    // compress took this released slot: forget its content
  void on_row_evicted(int64_t id);  // the row space dropped this cached page's unit
  void clear_cache();

  void check_invariants() const;
  void write_state(StateWriter& w) const;
  void read_state(StateReader& r);

 private:
  int64_t source_alloc();
  void source_free(int64_t id);
  void source_claim(int64_t id);
  bool source_is_free(int64_t id) const;

  Coordinator* coordinator_;
  RowSpace* rows_;
  SlotList unbound_free_;  // row space: released pages without a unit, longest-free first
  std::unique_ptr<TypePool> static_pool_;
  int64_t checkpoint_capacity_;
  std::vector<int32_t> ref_;
  BlockContents contents_;
  SlotList lru_;  // pinned checkpoints, least recently used first
};

}  // namespace ukv
