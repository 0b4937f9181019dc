// Coordinator: upstream's "option-2" unified KV pool (UnifiedKvCoordinator),
// generalised to any list of compress types.
//
// One SWA slot space [0, num_swa_base) is valid in every layer tensor (dense
// and every compress type), so an SWA id means the same 128 rows everywhere.
// Each compress type has its own TypePool over its own tensor: slots
// [0, num_swa_base) are shared with SWA, the rest are the type's own region.
//
//  - SWA may take slot s only when s is free in every compress pool.
//  - A compress type may take s only when SWA does not hold it; it prefers its
//    own region and borrows the longest-released SWA slot last, so SWA
//    prefix-cache entries survive as long as possible.
//  - Upstream, a slot SWA never used stays reserved in every pool. With
//    borrow_unreleased_swa (opt-in; the elastic layout turns it on, where SWA
//    leaves most of its space unused), a pool that would otherwise run out
//    lends the never-used free slot SWA would take last into every pool and
//    borrows it; no cache entry can sit there, so nothing is evicted. The
//    option only turns what would be an exhaustion into a borrow: every other
//    call behaves exactly as without it.
//  - When a compress type first borrows a released slot that may still back a
//    cached SWA block, that cache entry is evicted exactly once, before the
//    allocating call returns, so a later SWA prefix hit can never claim rows
//    compress has overwritten: the eviction listener runs synchronously, and
//    the slot is also queued for take_evicted_swa().
//  - has_free_swa / has_free_compress are O(1) counters and exact (SWA never
//    counts a slot compress has borrowed).
//  - can_allocate_jointly answers for an SWA demand and per-type compress
//    demands together, never counting one slot for two roles (upstream's
//    separate checks could both count one released slot).
//
// Every failing operation throws (errors.h) and leaves the state unchanged.
// Deterministic: the same calls give the same ids. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "core/slots/slot_list.h"
#include "core/slots/type_pool.h"

namespace ukv {

struct CompressTypeSpec {
  int64_t k;          // rows per compress block (CSA 32, HCA 1 at block 128)
  int64_t num_slots;  // slots of this type's tensor (>= num_swa_base)
};

struct CoordinatorCounters {
  int64_t swa_allocs = 0, swa_frees = 0, swa_claims = 0;
  int64_t swa_evictions = 0;  // cached SWA entries dropped because compress borrowed the slot
  int64_t unreleased_borrows = 0;  // never-used SWA slots lent to compress (borrow_unreleased_swa)
};

class Coordinator {
 public:
  using EvictListener = std::function<void(int64_t swa_slot)>;

  Coordinator(int64_t num_swa_base, std::vector<CompressTypeSpec> types, int64_t block_size = 128,
              bool borrow_unreleased_swa = false);

  int64_t num_swa_base() const { return num_swa_base_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_types() const { return static_cast<int64_t>(pools_.size()); }
  bool enabled() const { return num_swa_base_ > 0; }
  bool borrow_unreleased_swa() const { return borrow_unreleased_swa_; }
  // what: the public operation asking, named by a range error.
  const TypePool& pool(int64_t type, const char* what = "pool") const;

  // --- SWA role ---
  int64_t alloc_swa();
  void free_swa(int64_t slot);
  void claim_swa(int64_t slot);  // SWA cache-hit reclaim of a specific available slot
  bool is_free_swa(int64_t slot) const;
  bool has_free_swa(int64_t n) const { return !enabled() || swa_free_.size() >= n; }
  int64_t free_swa_slots() const { return swa_free_.size(); }
  bool swa_slot_is_held(int64_t slot) const;
  int64_t held_swa_slots() const { return held_swa_; }
  // A released shared slot that some pool holds: compress blocks, or an SWA
  // block made through the pool methods below (which the KV manager never calls).
  bool compress_busy(int64_t slot) const { return busy_[static_cast<size_t>(slot)] > 0; }
  std::vector<int64_t> alloc_swa_n(int64_t n);         // all-or-nothing
  void alloc_swa_into(int64_t n, int64_t* out);        // the same into out[0, n)
  void free_swa_many(const int64_t* slots, size_t n);  // validated first

  // --- compress role ---
  int64_t alloc_compress(int64_t type);
  void free_compress(int64_t type, int64_t phys);
  // Blocks alloc_compress(type) can still hand out: the pool's, plus with
  // borrow_unreleased_swa those of the never-used SWA slots it may be lent.
  bool has_free_compress(int64_t type, int64_t n) const;
  int64_t free_compress_blocks(int64_t type) const;
  std::vector<int64_t> alloc_compress_n(int64_t type, int64_t n);         // all-or-nothing
  void alloc_compress_into(int64_t type, int64_t n, int64_t* out);        // the same into out[0, n)
  void free_compress_many(int64_t type, const int64_t* ids, size_t n);    // validated first

  // --- one compress type's pool through its own methods (UnifiedTypePool's) ---
  // Upstream exposes each type's pool (coord.csa, coord.hca) with the whole
  // pool interface. Here those calls keep the SWA bookkeeping exact: a
  // released shared slot a pool takes this way (an SWA block of that type's
  // tensor alone) counts like compress blocks in it: SWA may no longer take
  // it and its cached SWA block is evicted once; it returns to SWA when every
  // pool has freed it. In the shared region a reservation is the SWA space's
  // own (it holds the slot or never used it), so release refuses those, and
  // reserving a released slot that is free in the pool is refused too (it
  // could not be told from the SWA space's); the own region is the pool's.
  // Queries go through pool(type) (free_slots, has_free_swa, slot_is_free).
  bool pool_reserve_slot(int64_t type, int64_t slot);  // false if the slot is not free in that pool
  void pool_release_slot(int64_t type, int64_t slot);  // no-op on a free slot
  int64_t pool_alloc_swa(int64_t type);                // the pool's shared (released) slots first
  void pool_free_swa(int64_t type, int64_t slot);
  void pool_claim_swa(int64_t type, int64_t slot);

  // A promise: true only when n_swa SWA allocations and compress_demand[t]
  // allocations of each type t, made in any order from the current state, all
  // succeed. It may refuse conservatively when the order would matter. A role
  // that is disabled (no SWA space, a pool of 0 slots) ignores its demand, as
  // has_free_swa / has_free_compress do. freeable_slots: distinct released
  // shared slots the caller first makes free in every pool (the KV manager's
  // reclaimable cached compress slots); each gives SWA a slot and its pools a
  // shared slot, minus the free compress blocks they had open in it. With
  // borrow_unreleased_swa every never-used free slot counts as lendable room
  // of every pool, and as contested with SWA.
  bool can_allocate_jointly(int64_t n_swa, const std::vector<int64_t>& compress_demand,
                            const std::vector<int64_t>& freeable_slots = {}) const;

  // --- cross-role eviction ---
  void set_evict_listener(EvictListener listener) { listener_ = std::move(listener); }
  std::vector<int64_t> take_evicted_swa();  // slots evicted since the last call, in order
  int64_t pending_evictions() const { return static_cast<int64_t>(evicted_.size()); }

  const CoordinatorCounters& counters() const { return counters_; }
  void check_invariants() const;

  std::vector<int64_t> to_state() const;
  static Coordinator from_state(const std::vector<int64_t>& state);
  // The same without the header, inside an enclosing object's state.
  void write_state(StateWriter& w) const;
  static Coordinator read_state(StateReader& r);

 private:
  enum class SwaState : uint8_t { Available = 0, Held = 1, Released = 2 };

  void check_type(int64_t type, const char* what) const;
  void check_swa_slot(int64_t slot, const char* what) const;
  void reserve_in_all_pools(int64_t slot);
  void take_swa_slot(int64_t slot);  // an available slot becomes SWA-held
  void lend_unreleased_slot();       // the never-used free slot SWA would take last becomes released
  int64_t lendable_slots() const { return borrow_unreleased_swa_ ? unreleased_.size() : 0; }
  int64_t slots_needed(int64_t type, int64_t blocks) const;
  TypePool& pool_for(int64_t type, const char* what);
  // A pool took a free slot / gave one back: for a shared (released) slot,
  // keep SWA's free list and cache tags exact.
  void pool_took(int64_t slot);
  void pool_gave_back(int64_t slot);

  int64_t num_swa_base_, block_size_;
  bool borrow_unreleased_swa_;
  std::vector<TypePool> pools_;
  // Per shared slot: Available = never used by SWA, reserved in every pool,
  // SWA may take it; Held = SWA owns it; Released = SWA freed it (or, with
  // borrow_unreleased_swa, lent it unused) to the pools; SWA may take it back
  // while busy_[s] == 0, i.e. it is free in every pool.
  std::vector<SwaState> swa_state_;
  std::vector<int32_t> busy_;      // pools holding a released slot (compress blocks, or a pool's SWA block)
  std::vector<uint8_t> cached_;    // released slot may still back a cached SWA block
  SlotList swa_free_;              // slots SWA may take now, FIFO
  SlotList unreleased_;            // the members of swa_free_ in state Available, in its order
  int64_t held_swa_ = 0;              // slots in state Held
  std::deque<int64_t> evicted_;
  EvictListener listener_;
  CoordinatorCounters counters_;
};

}  // namespace ukv
