// Unit tests of TypePool against hand-derived expectations (upstream's
// UnifiedTypePool with ukv's fixes: ownership checks, own region first, FIFO ids).
#include <gtest/gtest.h>

#include <vector>

#include "core/common/errors.h"
#include "core/slots/type_pool.h"

namespace ukv {
namespace {

TEST(TypePool, CompressIdsPackSubBlocksOfOneSlot) {
  TypePool p(3, 32, 128);  // 4 CSA blocks per slot
  EXPECT_EQ(p.blocks_per_slot(), 4);
  EXPECT_EQ(p.alloc_compress(), 0);  // slot 0, sub 0
  EXPECT_EQ(p.alloc_compress(), 1);
  EXPECT_EQ(p.alloc_compress(), 2);
  EXPECT_EQ(p.alloc_compress(), 3);
  EXPECT_EQ(p.alloc_compress(), 4);  // slot 1
  EXPECT_EQ(p.free_slots(), 1);
  EXPECT_EQ(p.free_compress_blocks(), 3 + 4);
  p.check_invariants();
}

TEST(TypePool, LastFreedSubBlockReturnsTheSlot) {
  TypePool p(2, 32, 128);
  int64_t a = p.alloc_compress(), b = p.alloc_compress();
  EXPECT_FALSE(p.free_compress(a));
  EXPECT_EQ(p.owner(0), SlotOwner::Compress);
  EXPECT_TRUE(p.free_compress(b));
  EXPECT_EQ(p.owner(0), SlotOwner::Free);
  EXPECT_EQ(p.free_slots(), 2);
  EXPECT_EQ(p.free_compress_blocks(), 8);
  p.check_invariants();
}

TEST(TypePool, FreedSubBlockIsReusedBeforeANewSlot) {
  TypePool p(4, 1, 128);  // HCA: 128 blocks per slot
  for (int i = 0; i < 128; ++i) EXPECT_EQ(p.alloc_compress(), i);
  EXPECT_EQ(p.alloc_compress(), 128);  // slot 1 opens
  p.free_compress(5);                  // slot 0 reopens, behind slot 1 in the open FIFO
  for (int i = 129; i < 256; ++i) EXPECT_EQ(p.alloc_compress(), i);
  EXPECT_EQ(p.alloc_compress(), 5);
  p.check_invariants();
}

TEST(TypePool, DoubleFreeAndForeignIdsAreRejectedWithoutChange) {
  TypePool p(2, 32, 128);
  const int64_t a = p.alloc_compress();
  p.free_compress(a);
  const auto before = p.to_state();
  EXPECT_THROW(p.free_compress(a), StateError);      // slot free again
  EXPECT_THROW(p.free_compress(6), StateError);      // never allocated
  EXPECT_THROW(p.free_compress(8), InvalidArgument);  // out of range
  EXPECT_THROW(p.free_compress(-1), InvalidArgument);
  p.alloc_compress();
  const auto held = p.to_state();
  EXPECT_THROW(p.free_compress(1), StateError);  // sub 1 of an open slot is free
  EXPECT_THROW(p.free_swa(0), StateError);       // compress slot is not SWA's
  EXPECT_EQ(p.to_state(), held);
  EXPECT_NE(before, held);
}

TEST(TypePool, OwnRegionBeforeSharedRegion) {
  TypePool p(4, 128, 128, /*shared_slots=*/2);  // 1 block per slot
  EXPECT_EQ(p.alloc_compress(), 2);
  EXPECT_EQ(p.alloc_compress(), 3);
  EXPECT_EQ(p.counters().borrows, 0);
  EXPECT_EQ(p.alloc_compress(), 0);
  EXPECT_EQ(p.counters().borrows, 1);
  EXPECT_EQ(p.alloc_swa(), 1);  // SWA prefers the shared region
  EXPECT_THROW(p.alloc_compress(), OutOfSlots);
  EXPECT_THROW(p.alloc_swa(), OutOfSlots);
}

TEST(TypePool, ExhaustionMessagesMatchUpstream) {
  TypePool p(1, 128, 128);
  p.alloc_compress();
  try {
    p.alloc_compress();
    FAIL();
  } catch (const OutOfSlots& e) {
    EXPECT_STREQ(e.what(), "No free KV slots available");
  }
  TypePool s(0, 0, 128);
  EXPECT_TRUE(s.has_free_swa(5));  // a disabled pool never blocks admission
  EXPECT_THROW(s.alloc_swa(), OutOfSlots);
}

TEST(TypePool, ReserveAndRelease) {
  TypePool p(3, 32, 128);
  EXPECT_TRUE(p.reserve_slot(1));
  EXPECT_FALSE(p.reserve_slot(1));
  EXPECT_FALSE(p.slot_is_free(1));
  EXPECT_EQ(p.alloc_compress(), 0);
  EXPECT_EQ(p.alloc_compress(), 1);
  p.release_slot(1);
  p.release_slot(2);  // releasing a free slot is a no-op (upstream behaviour)
  EXPECT_TRUE(p.slot_is_free(1));
  EXPECT_THROW(p.release_slot(0), StateError);  // compress-held: not the caller's to release
  p.check_invariants();
}

TEST(TypePool, ClaimSwaNeedsAFreeSlot) {
  TypePool p(3, 0, 128);
  p.claim_swa(2);
  EXPECT_EQ(p.owner(2), SlotOwner::Swa);
  EXPECT_THROW(p.claim_swa(2), StateError);
  EXPECT_EQ(p.alloc_swa(), 0);
  p.free_swa(0);
  EXPECT_THROW(p.free_swa(0), StateError);
  EXPECT_EQ(p.alloc_swa(), 1);  // FIFO: 0 went to the back
}

TEST(TypePool, BadConstructorArguments) {
  EXPECT_THROW(TypePool(-1, 32, 128), InvalidArgument);
  EXPECT_THROW(TypePool(4, 33, 128), InvalidArgument);
  EXPECT_THROW(TypePool(4, 256, 128), InvalidArgument);
  EXPECT_THROW(TypePool(4, 32, 0), InvalidArgument);
  EXPECT_THROW(TypePool(4, 32, 128, 5), InvalidArgument);
  EXPECT_THROW(TypePool(int64_t{1} << 25, 32, 128), InvalidArgument);  // > int32 rows
}

TEST(TypePool, BatchMethodsAreAllOrNothing) {
  TypePool p(2, 32, 128);
  EXPECT_EQ(p.alloc_compress_n(3), (std::vector<int64_t>{0, 1, 2}));
  const auto before = p.to_state();
  EXPECT_THROW(p.alloc_compress_n(6), OutOfSlots);  // 5 left
  EXPECT_THROW(p.alloc_compress_n(-1), InvalidArgument);
  const int64_t duplicate[] = {0, 1, 0}, foreign[] = {0, 1, 3}, out_of_range[] = {0, 8};
  EXPECT_THROW(p.free_compress_many(duplicate, 3), StateError);
  EXPECT_THROW(p.free_compress_many(foreign, 3), StateError);
  EXPECT_THROW(p.free_compress_many(out_of_range, 2), InvalidArgument);
  EXPECT_EQ(p.to_state(), before);
  const int64_t held[] = {2, 0, 1};
  p.free_compress_many(held, 3);
  EXPECT_EQ(p.free_compress_blocks(), 8);
  EXPECT_EQ(p.alloc_swa_n(2), (std::vector<int64_t>{1, 0}));  // slot 0 went to the back when it emptied
  const int64_t swa_duplicate[] = {1, 1};
  EXPECT_THROW(p.free_swa_many(swa_duplicate, 2), StateError);
  p.check_invariants();
}

TEST(TypePool, SwaOnlyPoolHasNoCompressRole) {
  TypePool p(2, 0, 128);
  EXPECT_EQ(p.blocks_per_slot(), 0);
  EXPECT_TRUE(p.has_free_compress(1000));
  EXPECT_EQ(p.free_compress_blocks(), 0);
  EXPECT_THROW(p.alloc_compress(), InvalidArgument);
  EXPECT_THROW(p.free_compress(0), InvalidArgument);
  EXPECT_TRUE(p.alloc_compress_n(0).empty());
  EXPECT_THROW(p.alloc_compress_n(1), InvalidArgument);
  EXPECT_EQ(p.alloc_swa(), 0);
}

TEST(TypePool, OneBlockPerSlotNeverLeavesASlotOpen) {
  TypePool p(3, 256, 256, 1);  // k = block_size
  EXPECT_EQ(p.alloc_compress(), 1);  // own region first
  EXPECT_EQ(p.alloc_compress(), 2);
  EXPECT_EQ(p.open_free_blocks(), 0);
  EXPECT_TRUE(p.free_compress(1));   // the slot is free again at once
  EXPECT_EQ(p.alloc_compress(), 1);
  EXPECT_EQ(p.alloc_compress(), 0);  // then the shared slot
  EXPECT_EQ(p.counters().borrows, 1);
  p.check_invariants();
}

TEST(TypePool, StateRoundTripContinuesIdentically) {
  TypePool a(5, 1, 128, 2);
  for (int i = 0; i < 300; ++i) a.alloc_compress();
  for (int64_t id = 256; id < 556; id += 3) a.free_compress(id);  // own region: slots 2..4
  TypePool b = TypePool::from_state(a.to_state());
  EXPECT_EQ(a.to_state(), b.to_state());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.alloc_compress(), b.alloc_compress());
  auto bad = a.to_state();
  bad[4] = 3;  // claim slot 0 is compress-held with inconsistent bitmaps/lists
  EXPECT_THROW(TypePool::from_state(bad), InvalidArgument);
}

}  // namespace
}  // namespace ukv
