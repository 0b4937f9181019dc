// LogicalBlocks: the logical compress-block space of the KV manager.
//
// A logical block is what a sequence's block table holds and what the prefix
// cache hashes; it is shared by every CSA/HCA layer and by side pools such as
// the indexer. Ref counts, the content-hash map with a token-equality guard,
// and lazy eviction (a freed block keeps its hash until its id is reused, the
// FIFO free list makes the longest-freed block the first reused) follow
// upstream's BlockManager. In the unified layout each logical block also
// carries one physical block per compress type (its binding), kept across
// cache-free so a later hit finds its KV where it was written.
#pragma once

#include <cstdint>
#include <vector>

#include "core/manager/block_contents.h"
#include "core/manager/kv_events.h"
#include "core/slots/slot_list.h"

namespace ukv {

class LogicalBlocks {
 public:
  // Content changes are recorded in `events` (role Compress).
  LogicalBlocks(int64_t num_blocks, int64_t block_size, int64_t num_types, KvEventLog* events);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  int64_t free_count() const { return free_.size(); }
  int64_t ref(int64_t id) const { return ref_[static_cast<size_t>(id)]; }
  bool is_free(int64_t id) const { return free_.contains(id); }
  bool has_hash(int64_t id) const { return contents_.has_hash(id); }
  const SlotList& free_list() const { return free_; }

  // The cached block holding exactly these tokens under this hash, or -1.
  int64_t lookup(const CacheKey& hash, const int32_t* tokens) const { return contents_.lookup(hash, tokens); }

  // A prefix-cache hit: a free block leaves the free list with ref 1 and keeps
  // its hash; a used block gains a reference.
  void claim(int64_t id);
  // A true allocation of a free block (the manager picks which: usually the
  // longest-free one): drops its stale hash (emitting Removed if the cache
  // still pointed at it) and gives it ref 1. The caller decides about its
  // physical blocks.
  void take(int64_t id);
  // Drops a reference; at 0 the block joins the back of the free list with its
  // hash and binding kept. Returns true when it became free.
  bool release(int64_t id);

  void publish(int64_t id, const CacheKey& hash, const int32_t* tokens, bool has_parent, const CacheKey& parent,
               uint64_t salt) {
    contents_.publish(id, hash, tokens, has_parent, parent, salt);
  }
  // Forgets a block's content (the cache may no longer hit it).
  void drop_hash(int64_t id) { contents_.forget(id); }
  // Forgets the content of every free block, and the map (no event: the
  // manager records one AllCleared for both caches).
  void clear_cache();

  // --- physical bindings (unified layout) ---
  int32_t binding(int64_t type, int64_t id) const { return binding_[static_cast<size_t>(type)][static_cast<size_t>(id)]; }
  void set_binding(int64_t type, int64_t id, int32_t phys) {
    binding_[static_cast<size_t>(type)][static_cast<size_t>(id)] = phys;
  }
  bool is_bound(int64_t id) const { return binding_.empty() || binding(0, id) >= 0; }

  void check_invariants() const;
  void write_state(StateWriter& w) const;
  void read_state(StateReader& r);

 private:
  std::vector<int32_t> ref_;
  BlockContents contents_;
  std::vector<std::vector<int32_t>> binding_;   // [type][logical] -> phys or -1
  SlotList free_;
};

}  // namespace ukv
