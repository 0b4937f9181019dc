// Unit tests of the option-2 Coordinator (upstream's UnifiedKvCoordinator plus
// the fixes: own region first, coldest borrow, single eviction, joint
// admission).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "core/slots/coordinator.h"
#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {
namespace {

constexpr int64_t kCsa = 0, kHca = 1;

Coordinator make(int64_t num_swa, int64_t num_compress_blocks) {
  const auto slots = slot_counts(num_swa, num_compress_blocks, {32, 1}, 128);
  return Coordinator(num_swa, {{32, slots[0]}, {1, slots[1]}}, 128);
}

TEST(Coordinator, StartsWithSwaInTheSharedRegionAndCompressInItsOwn) {
  Coordinator c = make(4, 8);  // CSA: 4 + 2 slots, HCA: 4 + 1 slots
  EXPECT_EQ(c.alloc_swa(), 0);
  EXPECT_EQ(c.alloc_compress(kCsa), 4 * 4);    // slot 4, first own slot
  EXPECT_EQ(c.alloc_compress(kHca), 4 * 128);  // slot 4
  EXPECT_EQ(c.free_swa_slots(), 3);
  c.check_invariants();
}

TEST(Coordinator, CompressBorrowsReleasedSlotsOnlyWhenItsOwnRegionIsFull) {
  Coordinator c = make(2, 4);  // CSA own region: 1 slot = 4 blocks
  const int64_t s0 = c.alloc_swa(), s1 = c.alloc_swa();
  c.free_swa(s1);
  c.free_swa(s0);  // s1 released first: the coldest
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.alloc_compress(kCsa) / 4, 2);  // own region
  EXPECT_EQ(c.free_swa_slots(), 2);
  EXPECT_EQ(c.alloc_compress(kCsa) / 4, s1);  // borrow: longest-freed first
  EXPECT_FALSE(c.is_free_swa(s1));
  EXPECT_TRUE(c.is_free_swa(s0));
  EXPECT_EQ(c.free_swa_slots(), 1);
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{s1});
  c.check_invariants();
}

TEST(Coordinator, EvictionFiresOnceEvenWhenTwoTypesBorrowTheSlot) {
  Coordinator c(1, {{128, 1}, {128, 1}}, 128);  // no own regions
  std::vector<int64_t> seen;
  c.set_evict_listener([&](int64_t s) { seen.push_back(s); });
  c.free_swa(c.alloc_swa());
  EXPECT_EQ(c.alloc_compress(kCsa), 0);
  EXPECT_EQ(c.alloc_compress(kHca), 0);
  EXPECT_EQ(seen, std::vector<int64_t>{0});
  EXPECT_EQ(c.counters().swa_evictions, 1);
  EXPECT_THROW(c.alloc_swa(), OutOfSlots);
  c.free_compress(kCsa, 0);
  EXPECT_FALSE(c.is_free_swa(0));  // HCA still holds it
  c.free_compress(kHca, 0);
  EXPECT_TRUE(c.is_free_swa(0));
  EXPECT_EQ(c.alloc_swa(), 0);
  c.free_swa(0);
  c.alloc_compress(kCsa);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 0}));  // a new SWA tenancy, a new eviction
}

TEST(Coordinator, SwaReclaimOfAReleasedSlotDoesNotEvict) {
  Coordinator c(2, {{128, 2}}, 128);
  c.free_swa(c.alloc_swa());
  c.claim_swa(0);  // SWA prefix-cache hit on its own freed slot
  c.free_swa(0);
  EXPECT_TRUE(c.take_evicted_swa().empty());
  c.alloc_compress(kCsa);  // borrows slot 0? no: slot 1 never released, slot 0 is
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{0});
}

TEST(Coordinator, OwnershipErrorsLeaveStateUnchanged) {
  Coordinator c = make(2, 8);
  const int64_t s = c.alloc_swa();
  const int64_t p = c.alloc_compress(kCsa);
  const auto before = c.to_state();
  EXPECT_THROW(c.free_swa(1), StateError);  // never allocated
  EXPECT_THROW(c.claim_swa(s), StateError);  // already held
  EXPECT_THROW(c.free_swa(2), InvalidArgument);
  EXPECT_THROW(c.free_compress(kCsa, p + 1), StateError);
  EXPECT_THROW(c.free_compress(2, p), InvalidArgument);
  EXPECT_THROW(c.alloc_compress(-1), InvalidArgument);
  EXPECT_EQ(c.to_state(), before);
  c.free_swa(s);
  EXPECT_THROW(c.free_swa(s), StateError);
}

// Upstream's coord.csa / coord.hca: one type's pool through its own methods.
// A released shared slot a pool takes is out of SWA's reach and loses its
// cache entry once; it returns to SWA when no pool holds it any more. Shared
// slots are reserved only by the SWA space.
TEST(Coordinator, PoolMethodsKeepTheSwaSideExact) {
  Coordinator c(2, {{32, 3}, {1, 3}}, 128);  // own regions: slot 2 of each tensor
  EXPECT_EQ(c.pool(kCsa).free_slots(), 1);
  EXPECT_FALSE(c.pool_reserve_slot(kCsa, 0));  // never used: the SWA space's
  const int64_t s = c.alloc_swa();
  c.free_swa(c.alloc_swa());                   // slot 1 released, cached
  EXPECT_FALSE(c.pool_reserve_slot(kCsa, s));  // held by SWA
  EXPECT_THROW(c.pool_release_slot(kHca, s), StateError);
  EXPECT_THROW(c.pool_reserve_slot(kHca, 1), StateError);
  EXPECT_EQ(c.pool(kCsa).free_slots(), 2);
  EXPECT_EQ(c.pool_alloc_swa(kCsa), 1);        // the pool's shared slots first
  EXPECT_FALSE(c.is_free_swa(1));
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{1});
  EXPECT_EQ(c.pool_alloc_swa(kHca), 1);        // another pool: no second eviction
  EXPECT_TRUE(c.take_evicted_swa().empty());
  c.pool_free_swa(kCsa, 1);
  EXPECT_FALSE(c.is_free_swa(1));              // HCA still holds it
  c.pool_free_swa(kHca, 1);
  EXPECT_TRUE(c.is_free_swa(1));
  EXPECT_TRUE(c.pool_reserve_slot(kHca, 2));   // the own region: as upstream, no SWA side
  EXPECT_FALSE(c.pool_reserve_slot(kHca, 2));
  c.pool_claim_swa(kCsa, 2);
  EXPECT_EQ(c.free_swa_slots(), 1);
  EXPECT_EQ(c.pool_alloc_swa(kHca), 1);        // its one free slot, evicted already
  EXPECT_TRUE(c.take_evicted_swa().empty());
  EXPECT_THROW(c.pool_alloc_swa(kHca), OutOfSlots);
  EXPECT_FALSE(c.has_free_swa(1));
  c.pool_release_slot(kHca, 2);
  EXPECT_EQ(c.pool(kHca).free_slots(), 1);
  c.check_invariants();
  const auto state = c.to_state();
  EXPECT_EQ(Coordinator::from_state(state).to_state(), state);
}

TEST(Coordinator, PoolMethodErrorsLeaveStateUnchanged) {
  Coordinator c(2, {{32, 3}, {1, 3}}, 128);
  c.free_swa(c.alloc_swa());
  c.pool_claim_swa(kCsa, 0);
  const auto before = c.to_state();
  EXPECT_THROW(c.pool_alloc_swa(2), InvalidArgument);
  EXPECT_THROW(c.pool_reserve_slot(-1, 0), InvalidArgument);
  EXPECT_THROW(c.pool_reserve_slot(kCsa, 3), InvalidArgument);
  EXPECT_THROW(c.pool_reserve_slot(kHca, 0), StateError);  // released and free in HCA: the SWA space's
  EXPECT_THROW(c.pool_release_slot(kCsa, -1), InvalidArgument);
  EXPECT_THROW(c.pool_release_slot(kCsa, 0), StateError);  // an SWA block of that pool, not reserved
  EXPECT_THROW(c.pool_release_slot(kCsa, 1), StateError);  // never released by SWA
  EXPECT_THROW(c.pool_free_swa(kHca, 0), StateError);
  EXPECT_THROW(c.pool_free_swa(kCsa, 5), InvalidArgument);
  EXPECT_THROW(c.pool_claim_swa(kCsa, 0), StateError);
  EXPECT_THROW(c.pool_claim_swa(kHca, 1), StateError);
  EXPECT_THROW(c.claim_swa(0), StateError);                // taken through the CSA pool
  EXPECT_EQ(c.to_state(), before);
  c.check_invariants();
}

TEST(Coordinator, BadConstructorArguments) {
  EXPECT_THROW(Coordinator(-1, {}, 128), InvalidArgument);
  EXPECT_THROW(Coordinator(4, {{32, 3}}, 128), InvalidArgument);  // fewer slots than SWA
  EXPECT_THROW(Coordinator(4, {{48, 8}}, 128), InvalidArgument);  // k must divide block_size
  EXPECT_THROW(Coordinator(4, {{0, 8}}, 128), InvalidArgument);
  EXPECT_THROW(Coordinator(4, {{32, 8}}, 0), InvalidArgument);
}

// A slot SWA counts as free must not also be promised to compress (upstream's
// separate checks both counted it, and the allocation that followed failed).
TEST(Coordinator, JointAdmissionNeverCountsOneSlotTwice) {
  Coordinator c(1, {{128, 1}}, 128);  // one shared slot, no own region
  c.free_swa(c.alloc_swa());
  EXPECT_TRUE(c.has_free_swa(1));
  EXPECT_TRUE(c.has_free_compress(kCsa, 1));
  EXPECT_FALSE(c.can_allocate_jointly(1, {1}));  // upstream would say yes, then crash
  EXPECT_TRUE(c.can_allocate_jointly(1, {0}));
  EXPECT_TRUE(c.can_allocate_jointly(0, {1}));
}

// Exhaustive over small demands: whenever the check says yes, both orders of
// performing the allocations succeed. SWA holds slots 0-2 (num_swa - 3 slots
// stay never used) and frees the first pre_swa of them. Returns how many
// admitted demands were served with a lent never-used slot.
int64_t exhaust_small_joint_demands(int64_t num_swa, bool borrow_unreleased) {
  int64_t lent = 0;
  for (int64_t pre_swa = 0; pre_swa <= 3; ++pre_swa)
    for (int64_t n_swa = 0; n_swa <= 3; ++n_swa)
      for (int64_t n_c = 0; n_c <= 4 * (num_swa + 1); ++n_c)
        for (int64_t n_h = 0; n_h <= 260; n_h += 65)
          for (int order = 0; order < 2; ++order) {
            Coordinator c(num_swa, {{32, num_swa + 1}, {1, num_swa + 1}}, 128, borrow_unreleased);
            std::vector<int64_t> held;
            for (int64_t i = 0; i < 3; ++i) held.push_back(c.alloc_swa());
            for (int64_t i = 0; i < pre_swa; ++i) c.free_swa(held[static_cast<size_t>(i)]);
            if (!c.can_allocate_jointly(n_swa, {n_c, n_h})) continue;
            auto swa = [&] { for (int64_t i = 0; i < n_swa; ++i) c.alloc_swa(); };
            auto cmp = [&] {
              for (int64_t i = 0; i < n_c; ++i) c.alloc_compress(kCsa);
              for (int64_t i = 0; i < n_h; ++i) c.alloc_compress(kHca);
            };
            if (order == 0) { swa(); cmp(); } else { cmp(); swa(); }
            lent += c.counters().unreleased_borrows > 0;
            c.check_invariants();
          }
  return lent;
}

TEST(Coordinator, JointAdmissionIsAPromiseInAnyOrder) { EXPECT_EQ(exhaust_small_joint_demands(3, false), 0); }

// A borrow competes with SWA only for released slots SWA could take. A slot
// another type already borrowed is out of SWA's reach, so lending it to a
// second type costs SWA nothing and must not be refused.
TEST(Coordinator, JointAdmissionChargesSwaOnlyForSlotsItCouldTake) {
  Coordinator c(2, {{128, 2}, {128, 2}}, 128);  // no own regions, one block per slot
  c.alloc_swa();
  c.alloc_swa();
  c.free_swa(0);
  c.alloc_compress(0);  // type 0 borrows slot 0; slot 1 stays with SWA
  EXPECT_EQ(c.free_swa_slots(), 0);
  EXPECT_TRUE(c.can_allocate_jointly(0, {0, 1}));
  EXPECT_FALSE(c.can_allocate_jointly(0, {0, 2}));
  c.alloc_compress(1);  // and indeed type 1 gets slot 0 too
  c.check_invariants();
}

// Soundness over reachable states: random SWA/compress churn (which makes the
// pools' shared FIFOs diverge from each other and from SWA's), then every
// small demand and every interleaving of it. Whenever the check says yes,
// every order must succeed. Returns how many admitted demands had SWA and a
// borrow competing.
int64_t sweep_joint_admission_from_random_states(bool borrow_unreleased) {
  int64_t admitted_with_borrowing = 0;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    Coordinator c(3, {{128, 4}, {128, 3}, {64, 3}}, 128, borrow_unreleased);  // 1, 1 and 2 blocks per slot
    std::vector<int64_t> swa;
    std::vector<std::vector<int64_t>> held(3);
    for (int step = 0; step < 40; ++step) {
      const int type = static_cast<int>(rng() % 3);
      switch (rng() % 4) {
        case 0: if (c.has_free_swa(1)) swa.push_back(c.alloc_swa()); break;
        case 1:
          if (!swa.empty()) { c.free_swa(swa.back()); swa.pop_back(); std::shuffle(swa.begin(), swa.end(), rng); }
          break;
        case 2: if (c.free_compress_blocks(type) > 0) held[type].push_back(c.alloc_compress(type)); break;
        case 3:
          if (!held[type].empty()) {
            std::swap(held[type][rng() % held[type].size()], held[type].back());
            c.free_compress(type, held[type].back());
            held[type].pop_back();
          }
          break;
      }
    }
    for (int64_t n_swa = 0; n_swa <= 2; ++n_swa)
      for (int64_t d0 = 0; d0 <= 2; ++d0)
        for (int64_t d1 = 0; d1 <= 2; ++d1)
          for (int64_t d2 = 0; d2 <= 2; ++d2) {
            if (n_swa + d0 + d1 + d2 > 5 || !c.can_allocate_jointly(n_swa, {d0, d1, d2})) continue;
            std::vector<int> order;  // -1 = SWA, else a compress type
            order.insert(order.end(), static_cast<size_t>(n_swa), -1);
            order.insert(order.end(), static_cast<size_t>(d0), 0);
            order.insert(order.end(), static_cast<size_t>(d1), 1);
            order.insert(order.end(), static_cast<size_t>(d2), 2);
            const int64_t demand[] = {d0, d1, d2};
            bool borrows = false;
            for (int64_t t = 0; t < 3; ++t) borrows |= demand[t] > c.pool(t).free_own_compress_blocks();
            admitted_with_borrowing += n_swa > 0 && borrows;
            do {
              Coordinator copy = c;
              for (int role : order) {
                if (role < 0) copy.alloc_swa(); else copy.alloc_compress(role);
              }
            } while (std::next_permutation(order.begin(), order.end()));
          }
  }
  return admitted_with_borrowing;
}

TEST(Coordinator, JointAdmissionIsAPromiseInEveryInterleavingFromRandomStates) {
  EXPECT_GT(sweep_joint_admission_from_random_states(false), 50);  // it really admitted competing demands
}

TEST(Coordinator, JointAdmissionWithBorrowUnreleasedIsAPromiseInEveryInterleaving) {
  EXPECT_GT(sweep_joint_admission_from_random_states(true), 50);
}

// Argument errors must not depend on the state: a negative demand is refused
// even when an earlier type's demand already decides the answer.
TEST(Coordinator, JointAdmissionValidatesEveryArgumentFirst) {
  Coordinator c = make(2, 8);
  EXPECT_THROW(c.can_allocate_jointly(0, {1000000, -1}), InvalidArgument);
  EXPECT_THROW(c.can_allocate_jointly(-1, {1000000, 0}), InvalidArgument);
  EXPECT_THROW(c.can_allocate_jointly(0, {0}), InvalidArgument);
}

// Demands near INT64_MAX must be refused, not wrap around into a yes.
TEST(Coordinator, JointAdmissionRefusesHugeDemands) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  Coordinator no_own_region(2, {{32, 2}}, 128);
  EXPECT_FALSE(no_own_region.can_allocate_jointly(0, {kHuge}));
  EXPECT_FALSE(no_own_region.can_allocate_jointly(0, {kHuge - 1}));
  // Slot 0 is borrowed by type 0 but free for type 1, so type 1 can borrow
  // it: the SWA demand plus that borrow must not wrap around either.
  Coordinator c(2, {{128, 2}, {128, 2}}, 128);
  c.alloc_swa();
  c.alloc_swa();
  c.free_swa(0);
  c.alloc_compress(0);
  EXPECT_FALSE(c.can_allocate_jointly(kHuge, {0, 1}));
  EXPECT_FALSE(c.can_allocate_jointly(1, {0, 0}));
}

// The SWA space is valid in every layer tensor, dense layers included, so its
// rows must fit the int32 row limit even when there is no compress type.
TEST(Coordinator, SwaSpaceRowsMustFitTheRowLimit) {
  constexpr int64_t kHugeBlock = int64_t{1} << 20;  // few slots reach the limit: a fast test
  EXPECT_THROW(Coordinator(kMaxRows / kHugeBlock + 1, {}, kHugeBlock), InvalidArgument);
  EXPECT_NO_THROW(Coordinator(kMaxRows / kHugeBlock, {}, kHugeBlock));
}

TEST(Coordinator, ListenerReplacesTheEvictionQueue) {
  Coordinator c(2, {{128, 2}}, 128);
  c.free_swa(c.alloc_swa());
  c.alloc_compress(0);
  EXPECT_EQ(c.pending_evictions(), 1);  // no listener: queued
  std::vector<int64_t> heard;
  c.set_evict_listener([&](int64_t slot) {
    EXPECT_FALSE(c.is_free_swa(slot));  // the state is final when the listener runs
    heard.push_back(slot);
  });
  c.free_swa(c.alloc_swa());             // slot 1
  c.alloc_compress(0);
  EXPECT_EQ(heard, std::vector<int64_t>{1});
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{0});  // only what was queued before
  EXPECT_EQ(c.counters().swa_evictions, 2);
}

TEST(Coordinator, SwaBatchesAreAllOrNothing) {
  Coordinator c = make(3, 8);
  EXPECT_EQ(c.alloc_swa_n(2), (std::vector<int64_t>{0, 1}));
  const auto before = c.to_state();
  EXPECT_THROW(c.alloc_swa_n(2), OutOfSlots);
  const int64_t duplicate[] = {0, 0}, not_held[] = {0, 2}, out_of_range[] = {0, 3};
  EXPECT_THROW(c.free_swa_many(duplicate, 2), StateError);
  EXPECT_THROW(c.free_swa_many(not_held, 2), StateError);
  EXPECT_THROW(c.free_swa_many(out_of_range, 2), InvalidArgument);
  EXPECT_EQ(c.to_state(), before);
  const int64_t held[] = {1, 0};
  c.free_swa_many(held, 2);
  EXPECT_EQ(c.alloc_swa_n(3), (std::vector<int64_t>{2, 1, 0}));  // FIFO: never-used slot 2 first
}

TEST(Coordinator, FromStateRejectsInconsistentSwaRecords) {
  Coordinator c = make(2, 8);
  c.alloc_swa();
  auto st = c.to_state();
  // The SWA records follow the header and the pools' states: find slot 0's
  // (state, cached) pair by its position from the end (2 slots x 2 values,
  // the free list (length 1 + 1 id), the queue length, 5 counters).
  const size_t slot0 = st.size() - (4 + 2 + 1 + 5);
  ASSERT_EQ(st[slot0], 1);   // held
  st[slot0 + 1] = 1;         // ...yet marked as caching a released block
  EXPECT_THROW(Coordinator::from_state(st), InvalidArgument);
  st[slot0 + 1] = 0;
  st[slot0] = 2;             // released, but still reserved in the pools
  EXPECT_THROW(Coordinator::from_state(st), InvalidArgument);
}

TEST(Coordinator, StateRoundTripContinuesIdentically) {
  Coordinator a = make(8, 64);
  std::vector<int64_t> swa;
  for (int i = 0; i < 8; ++i) swa.push_back(a.alloc_swa());
  for (int i = 0; i < 8; i += 2) a.free_swa(swa[static_cast<size_t>(i)]);
  for (int i = 0; i < 70; ++i) a.alloc_compress(kCsa);  // 64 own + 6 borrowed
  for (int i = 0; i < 200; ++i) a.alloc_compress(kHca);
  Coordinator b = Coordinator::from_state(a.to_state());
  EXPECT_EQ(a.to_state(), b.to_state());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.alloc_compress(kCsa), b.alloc_compress(kCsa));
  EXPECT_EQ(a.alloc_swa(), b.alloc_swa());
  EXPECT_EQ(a.take_evicted_swa(), b.take_evicted_swa());
}

// ---- borrow_unreleased_swa: compress may borrow slots SWA never used ----

Coordinator make_borrowing(int64_t num_swa, int64_t num_compress_blocks) {
  const auto slots = slot_counts(num_swa, num_compress_blocks, {32, 1}, 128);
  return Coordinator(num_swa, {{32, slots[0]}, {1, slots[1]}}, 128, true);
}

TEST(CoordinatorBorrowUnreleased, IsOffByDefault) {
  Coordinator c = make(4, 4);  // CSA own region: 1 slot
  EXPECT_FALSE(c.borrow_unreleased_swa());
  for (int i = 0; i < 4; ++i) c.alloc_compress(kCsa);
  EXPECT_EQ(c.free_compress_blocks(kCsa), 0);  // the never-used SWA slots stay reserved
  EXPECT_FALSE(c.has_free_compress(kCsa, 1));
  const auto before = c.to_state();
  EXPECT_THROW(c.alloc_compress(kCsa), OutOfSlots);
  EXPECT_EQ(c.to_state(), before);
}

TEST(CoordinatorBorrowUnreleased, LendsTheNeverUsedSlotSwaWouldTakeLast) {
  Coordinator c = make_borrowing(4, 4);
  EXPECT_TRUE(c.borrow_unreleased_swa());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.alloc_compress(kCsa) / 4, 4);  // own region first
  EXPECT_EQ(c.free_compress_blocks(kCsa), 4 * 4);  // 4 never-used slots of 4 blocks
  EXPECT_TRUE(c.has_free_compress(kCsa, 16));
  EXPECT_FALSE(c.has_free_compress(kCsa, 17));
  EXPECT_EQ(c.alloc_compress(kCsa), 3 * 4);  // slot 3: the back of SWA's free list
  EXPECT_FALSE(c.is_free_swa(3));
  EXPECT_EQ(c.free_swa_slots(), 3);
  EXPECT_EQ(c.pool(kHca).owner(3), SlotOwner::Free);  // lent to every pool
  EXPECT_EQ(c.counters().unreleased_borrows, 1);
  EXPECT_EQ(c.counters().swa_evictions, 0);  // SWA never wrote it: nothing to evict
  EXPECT_TRUE(c.take_evicted_swa().empty());
  EXPECT_EQ(c.free_compress_blocks(kCsa), 3 + 3 * 4);
  c.check_invariants();
  EXPECT_EQ(c.alloc_swa_n(3), (std::vector<int64_t>{0, 1, 2}));  // SWA's order is unchanged
  EXPECT_THROW(c.alloc_swa(), OutOfSlots);
  EXPECT_EQ(c.free_compress_blocks(kCsa), 3);  // the open lent slot's free blocks
  c.check_invariants();
}

TEST(CoordinatorBorrowUnreleased, ReleasedSlotsAreBorrowedFirst) {
  Coordinator c = make_borrowing(3, 4);
  c.free_swa(c.alloc_swa());  // slot 0: released, may cache an SWA block
  for (int i = 0; i < 4; ++i) c.alloc_compress(kCsa);
  EXPECT_EQ(c.alloc_compress(kCsa) / 4, 0);  // exactly what the default would borrow
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{0});
  EXPECT_EQ(c.counters().unreleased_borrows, 0);
  for (int i = 0; i < 3; ++i) c.alloc_compress(kCsa);
  EXPECT_EQ(c.alloc_compress(kCsa) / 4, 2);  // only then a never-used one
  EXPECT_EQ(c.counters().unreleased_borrows, 1);
  EXPECT_TRUE(c.take_evicted_swa().empty());
  c.check_invariants();
}

TEST(CoordinatorBorrowUnreleased, SecondTypeSharesTheLentSlotBeforeAnotherIsLent) {
  Coordinator c = make_borrowing(3, 4);  // CSA own: 1 slot, HCA own: 1 slot
  for (int i = 0; i < 5; ++i) c.alloc_compress(kCsa);  // lends slot 2
  for (int i = 0; i < 128; ++i) EXPECT_EQ(c.alloc_compress(kHca) / 128, 3);  // HCA's own region
  EXPECT_EQ(c.alloc_compress(kHca) / 128, 2);  // free in HCA's pool since it was lent
  EXPECT_EQ(c.counters().unreleased_borrows, 1);
  EXPECT_EQ(c.free_swa_slots(), 2);
  c.check_invariants();
}

TEST(CoordinatorBorrowUnreleased, ALentSlotReturnsToSwaOnceCompressFreesIt) {
  Coordinator c = make_borrowing(3, 4);
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(c.alloc_compress(kCsa));
  c.free_compress(kCsa, ids.back());  // slot 2 empty again
  EXPECT_TRUE(c.is_free_swa(2));
  EXPECT_EQ(c.free_swa_slots(), 3);
  EXPECT_EQ(c.alloc_swa_n(3), (std::vector<int64_t>{0, 1, 2}));  // rejoined at the back
  EXPECT_TRUE(c.take_evicted_swa().empty());
  c.check_invariants();
  c.free_swa(2);  // now a released slot like any other: a borrow evicts its cache entry
  EXPECT_EQ(c.alloc_compress(kCsa) / 4, 2);
  EXPECT_EQ(c.take_evicted_swa(), std::vector<int64_t>{2});
  EXPECT_EQ(c.counters().unreleased_borrows, 1);
}

TEST(CoordinatorBorrowUnreleased, BatchesAreAllOrNothing) {
  Coordinator c = make_borrowing(2, 4);
  const auto before = c.to_state();
  EXPECT_THROW(c.alloc_compress_n(kCsa, 4 + 2 * 4 + 1), OutOfSlots);
  EXPECT_EQ(c.to_state(), before);
  EXPECT_EQ(c.alloc_compress_n(kCsa, 4 + 2 * 4).size(), 12u);  // own slot, then slots 1 and 0
  EXPECT_EQ(c.counters().unreleased_borrows, 2);
  EXPECT_EQ(c.free_swa_slots(), 0);
  EXPECT_THROW(c.alloc_compress(kCsa), OutOfSlots);
  c.check_invariants();
}

// Every never-used free slot is contested: SWA and compress may each take it.
TEST(CoordinatorBorrowUnreleased, JointAdmissionCountsNeverUsedSlotsForEitherRoleOnce) {
  Coordinator c(2, {{128, 2}, {128, 2}}, 128, true);  // no own regions, one block per slot
  EXPECT_TRUE(c.can_allocate_jointly(0, {2, 2}));
  EXPECT_TRUE(c.can_allocate_jointly(2, {0, 0}));
  EXPECT_TRUE(c.can_allocate_jointly(1, {1, 0}));
  // (1, {1, 1}) would succeed too (type 1 borrows the slot lent to type 0), but
  // the check charges each type's borrow to SWA: conservative, never unsound.
  EXPECT_FALSE(c.can_allocate_jointly(1, {1, 1}));
  EXPECT_FALSE(c.can_allocate_jointly(1, {2, 0}));
  EXPECT_FALSE(c.can_allocate_jointly(2, {0, 1}));
  Coordinator upstream(2, {{128, 2}, {128, 2}}, 128);
  EXPECT_FALSE(upstream.can_allocate_jointly(0, {1, 0}));
}

TEST(CoordinatorBorrowUnreleased, JointAdmissionIsAPromiseInAnyOrder) {
  EXPECT_GT(exhaust_small_joint_demands(4, true), 0);  // slot 3 was lent in some admitted demands
}

TEST(CoordinatorBorrowUnreleased, StateCarriesTheOptionAndContinuesIdentically) {
  Coordinator a = make_borrowing(4, 4);
  a.free_swa(a.alloc_swa());
  for (int i = 0; i < 6; ++i) a.alloc_compress(kCsa);  // own, slot 0 (released), then lending
  Coordinator b = Coordinator::from_state(a.to_state());
  EXPECT_TRUE(b.borrow_unreleased_swa());
  EXPECT_EQ(a.to_state(), b.to_state());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.alloc_compress(kCsa), b.alloc_compress(kCsa));
  EXPECT_EQ(a.counters().unreleased_borrows, b.counters().unreleased_borrows);
  EXPECT_EQ(a.alloc_swa(), b.alloc_swa());
  EXPECT_FALSE(Coordinator::from_state(make(4, 4).to_state()).borrow_unreleased_swa());
  auto st = a.to_state();
  st[3] = 2;  // the flag follows num_swa_base, block_size and the type count
  EXPECT_THROW(Coordinator::from_state(st), InvalidArgument);
}

}  // namespace
}  // namespace ukv
