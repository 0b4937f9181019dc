// TypePool: the slot free-list of one layer type's unified_kv tensor.
//
// The tensor is cut into slots of block_size rows (one SWA block each). A slot
// is homogeneous at any time:
//   Free      on the free list;
//   Reserved  held by an external owner (the Coordinator's SWA space);
//   Swa       one SWA block, phys id = slot;
//   Compress  split into block_size / k compress blocks, phys id =
//             slot * (block_size / k) + sub, first row = phys * k.
// Ids are base 0, so every row offset is non-negative.
//
// Slots [0, shared_slots) are the region shared with SWA; the rest is the
// type's own compress region. Compress allocation takes its own region first
// and borrows a shared slot only when the own region is exhausted, the
// longest-free one first, so SWA prefix-cache entries live as long as possible
// (upstream took the most recently freed one even with room in its own
// region). SWA allocation prefers the shared region for the same reason.
//
// All operations are O(1) amortised; free counts are counters. Every failing
// operation throws (errors.h) and leaves the pool unchanged. Not thread-safe:
// owners (the torch class, the KV manager) serialise calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/slots/slot_list.h"
#include "core/config/state_io.h"

namespace ukv {

enum class SlotOwner : int64_t { Free = 0, Reserved = 1, Swa = 2, Compress = 3 };

const char* slot_owner_name(SlotOwner owner);

struct TypePoolCounters {
  int64_t swa_allocs = 0, swa_frees = 0;
  int64_t compress_allocs = 0, compress_frees = 0;
  int64_t borrows = 0;  // compress allocations that opened a slot of the shared region
};

class TypePool {
 public:
  // k = 0: SWA-only pool (no compress blocks). Throws InvalidArgument unless
  // num_slots >= 0, block_size > 0, k == 0 or k divides block_size,
  // 0 <= shared_slots <= num_slots, and num_slots * block_size rows fit int32.
  TypePool(int64_t num_slots, int64_t k, int64_t block_size, int64_t shared_slots = 0);

  int64_t num_slots() const { return num_slots_; }
  int64_t k() const { return k_; }
  int64_t block_size() const { return block_size_; }
  int64_t shared_slots() const { return shared_slots_; }
  int64_t blocks_per_slot() const { return blocks_per_slot_; }
  int64_t num_compress_ids() const { return num_slots_ * blocks_per_slot_; }
  bool enabled() const { return num_slots_ > 0; }

  // --- external reservation (Coordinator) ---
  bool reserve_slot(int64_t slot);  // Free -> Reserved; false if the slot is not free
  void release_slot(int64_t slot);  // Reserved -> Free; no-op on a free slot
  bool slot_is_free(int64_t slot) const;
  SlotOwner owner(int64_t slot) const;

  // --- SWA role (a pool used on its own, e.g. the static-split SWA pool) ---
  int64_t alloc_swa();
  void free_swa(int64_t slot);
  void claim_swa(int64_t slot);  // take a specific free slot (cache-hit reclaim)
  bool is_free_swa(int64_t slot) const;
  bool has_free_swa(int64_t n) const;
  std::vector<int64_t> alloc_swa_n(int64_t n);              // all-or-nothing
  void alloc_swa_into(int64_t n, int64_t* out);             // the same into out[0, n)
  void free_swa_many(const int64_t* slots, size_t n);       // validated first

  // --- compress role ---
  // opened_slot (optional) receives the slot when this call took a free slot,
  // -1 when it filled a sub-block of an already open slot.
  int64_t alloc_compress(int64_t* opened_slot = nullptr);
  // Returns true when the block's slot became free (its last block was freed).
  bool free_compress(int64_t phys);
  bool has_free_compress(int64_t n) const;
  // what: the public operation asking, named by a range error.
  bool compress_id_is_held(int64_t phys, const char* what = "compress_id_is_held") const;
  std::vector<int64_t> alloc_compress_n(int64_t n);         // all-or-nothing
  void alloc_compress_into(int64_t n, int64_t* out);        // the same into out[0, n)
  void free_compress_many(const int64_t* ids, size_t n);    // validated first

  // --- counts (all O(1)) ---
  int64_t free_slots() const { return own_free_.size() + shared_free_.size(); }
  int64_t free_own_slots() const { return own_free_.size(); }
  int64_t free_shared_slots() const { return shared_free_.size(); }
  // Compress blocks available without taking a free slot (open slots' free subs).
  int64_t open_free_blocks() const { return open_free_blocks_; }
  // Compress blocks available without borrowing from the shared region.
  int64_t free_own_compress_blocks() const { return open_free_blocks_ + own_free_.size() * blocks_per_slot_; }
  int64_t free_compress_blocks() const { return open_free_blocks_ + free_slots() * blocks_per_slot_; }
  int64_t held_slots(SlotOwner owner) const { return held_[static_cast<size_t>(owner)]; }
  const TypePoolCounters& counters() const { return counters_; }

  // Throws StateError if any internal invariant is broken (tests, soak runs).
  void check_invariants() const;

  // Exact state as int64s; from_state(to_state()) continues identically.
  std::vector<int64_t> to_state() const;
  static TypePool from_state(const std::vector<int64_t>& state);
  // The same without the header, inside an enclosing object's state.
  void write_state(StateWriter& w) const;
  static TypePool read_state(StateReader& r);

 private:
  void check_slot(int64_t slot, const char* what) const;
  SlotOwner owner_of(int64_t slot, const char* what) const;  // range-checked, errors name `what`
  void check_compress_id(int64_t phys, const char* what) const;
  SlotList& free_list_of(int64_t slot) { return slot < shared_slots_ ? shared_free_ : own_free_; }
  void take_free_slot(int64_t slot, SlotOwner to);
  void put_free_slot(int64_t slot);
  int64_t first_free_sub(int64_t slot) const;
  void set_sub_free(int64_t slot, int64_t sub, bool is_free);
  bool sub_is_free(int64_t slot, int64_t sub) const;

  int64_t num_slots_, k_, block_size_, shared_slots_, blocks_per_slot_, words_per_slot_;
  std::vector<SlotOwner> owner_;
  SlotList own_free_, shared_free_;
  SlotList open_;                     // compress slots with at least one free sub-block, FIFO
  std::vector<uint64_t> free_subs_;   // bitmap, words_per_slot_ words per slot
  std::vector<int32_t> used_subs_;    // held sub-blocks per compress slot
  int64_t open_free_blocks_ = 0;
  int64_t held_[4] = {0, 0, 0, 0};
  TypePoolCounters counters_;
};

}  // namespace ukv
