// KvManager::import_sequence and check_exportable: a decoding sequence moved
// between managers of different layouts, the refusals that change nothing,
// and publication limited to the blocks whose trailing window travelled.
#include <gtest/gtest.h>

#include <vector>

#include "core/common/errors.h"
#include "core/manager/kv_manager.h"
#include "manager_test_support.h"

namespace ukv {
namespace {

using testing_support::kBs;
using testing_support::tokens;

ServeConfig config(KvLayout layout) { return testing_support::small_config(layout); }

PoolSizes pools(int64_t logical_blocks) {
  PoolSizes p;
  p.num_logical_blocks = logical_blocks;
  p.num_swa_blocks = 16;
  return p;
}

// Admits and prefills the prompt in one chunk, then samples token 7: decoding.
void decoding(KvManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t chunk = n - m.allocate(id, prompt.data(), n);
  const int32_t sampled = 7;
  m.ensure_for_tokens(&id, &chunk, 1);
  m.commit_prefill(&id, &chunk, &sampled, 1);
}

void decode_steps(KvManager& m, int64_t id, int steps) {
  for (int i = 0; i < steps; ++i) {
    const int64_t one = 1;
    const int32_t token = 9;
    ASSERT_EQ(m.can_append(&id, &one, 1), 1);
    m.append(&id, &one, 1);
    m.commit_decode(&id, &one, &token, 1);
  }
}

// The exported sequence's known tokens.
std::vector<int32_t> known(const KvManager& m, int64_t id) { return m.tokens(id); }

TEST(KvManagerTransfer, ImportedSequenceDecodesAsIfPrefilledThere) {
  KvManager a(config(KvLayout::Static), pools(32));
  KvManager b(config(KvLayout::Upstream), pools(32));
  decoding(a, 1, tokens(650, 1));
  decode_steps(a, 1, 3);
  a.check_exportable(1);
  const auto t = known(a, 1);
  decoding(b, 4, tokens(300, 2));  // another sequence live on B
  EXPECT_EQ(b.import_sequence(6, t.data(), static_cast<int64_t>(t.size()), a.num_computed(1)), 0);
  EXPECT_EQ(b.num_computed(6), 653);
  EXPECT_EQ(b.tokens(6), t);
  EXPECT_EQ(b.transfer_swa_begin(653), 653 - 127);
  // The window's pages are held, the ones before it are not.
  const auto& swa = b.swa_table(6);
  for (int64_t page = 0; page < static_cast<int64_t>(swa.size()); ++page)
    EXPECT_EQ(swa[static_cast<size_t>(page)] >= 0, page >= (653 - 128) / kBs && page <= 652 / kBs) << page;
  b.check_invariants();
  decode_steps(b, 6, 200);
  b.check_invariants();
  EXPECT_EQ(b.num_computed(6), 853);
}

TEST(KvManagerTransfer, OnlyBlocksWhoseTrailingWindowTravelledArePublished) {
  KvManager a(config(KvLayout::Upstream), pools(32));
  KvManager b(config(KvLayout::Upstream), pools(32));
  decoding(a, 1, tokens(700, 3));
  EXPECT_EQ(a.can_allocate(known(a, 1).data(), 700), 5 * kBs);  // A wrote every SWA row of its prompt
  const auto t = known(a, 1);
  ASSERT_EQ(b.import_sequence(1, t.data(), 701, 700), 0);
  // Rows from 573 travelled: no boundary up to 640 has its trailing window (from 512) in B.
  EXPECT_EQ(b.can_allocate(t.data(), 700), 0);
  decode_steps(b, 1, 100);  // past 768: the boundary at 768 has its window [640, 768)
  const auto longer = known(b, 1);
  EXPECT_EQ(b.can_allocate(longer.data(), 790), 6 * kBs);
}

TEST(KvManagerTransfer, RefusalsChangeNothing) {
  KvManager a(config(KvLayout::Upstream), pools(32));
  decoding(a, 1, tokens(1000, 4));
  const auto t = known(a, 1);
  const auto n = static_cast<int64_t>(t.size());
  for (KvLayout layout : {KvLayout::Static, KvLayout::Upstream, KvLayout::Elastic}) {
    KvManager small(config(layout), pools(6));  // 8 blocks never fit
    const auto before = small.to_state();
    EXPECT_EQ(small.import_sequence(2, t.data(), n, n - 1), KvManager::kNeverFits);
    EXPECT_EQ(small.to_state(), before);
    KvManager busy(config(layout), pools(12));
    decoding(busy, 5, tokens(1000, 5));  // holds 8 of its 12 blocks
    const auto busy_before = busy.to_state();
    EXPECT_EQ(busy.import_sequence(2, t.data(), n, n - 1), KvManager::kNotNow);
    EXPECT_EQ(busy.to_state(), busy_before);
  }
}

TEST(KvManagerTransfer, BadImportsAndExportsThrowWithNothingChanged) {
  KvManager a(config(KvLayout::Upstream), pools(32));
  a.allocate(1, tokens(300, 6).data(), 300);
  EXPECT_THROW(a.check_exportable(1), StateError);  // still prefilling
  EXPECT_THROW(a.check_exportable(2), InvalidArgument);  // unknown
  decoding(a, 3, tokens(300, 7));
  const int64_t id = 3, one = 1;
  a.append(&id, &one, 1);
  EXPECT_THROW(a.check_exportable(3), StateError);  // appended, not committed
  const auto t = known(a, 3);
  const auto n = static_cast<int64_t>(t.size());
  const auto before = a.to_state();
  EXPECT_THROW(a.import_sequence(-1, t.data(), n, n - 1), InvalidArgument);
  EXPECT_THROW(a.import_sequence(3, t.data(), n, n - 1), InvalidArgument);  // live
  EXPECT_THROW(a.import_sequence(4, t.data(), n, n - 2), InvalidArgument);
  EXPECT_THROW(a.import_sequence(4, t.data(), 1, 0), InvalidArgument);
  EXPECT_EQ(a.to_state(), before);
  ServeConfig retain = config(KvLayout::Upstream);
  retain.full_retain = true;
  KvManager r(retain, pools(32));
  const auto r_before = r.to_state();
  EXPECT_THROW(r.import_sequence(4, t.data(), n, n - 1), InvalidArgument);
  EXPECT_EQ(r.to_state(), r_before);
}

TEST(KvManagerTransfer, GenerationAndCachedPrefixSurviveStateAndChangeWithReuse) {
  KvManager a(config(KvLayout::Upstream), pools(32));
  decoding(a, 1, tokens(700, 8));
  const int64_t first = a.generation(1);
  const auto t = known(a, 1);
  KvManager b(config(KvLayout::Upstream), pools(32));
  decoding(b, 2, tokens(300, 8));  // B caches the first two blocks of the same tokens
  const int64_t cached = b.import_sequence(5, t.data(), static_cast<int64_t>(t.size()), 700);
  EXPECT_EQ(cached, 2 * kBs);
  EXPECT_EQ(b.cached_prefix(5), cached);  // what the scatter must leave alone
  EXPECT_EQ(b.generation(5), 2);          // B's second admission
  EXPECT_EQ(KvManager::from_state(b.to_state())->cached_prefix(5), cached);
  EXPECT_EQ(KvManager::from_state(b.to_state())->generation(5), 2);
  const int64_t id = 1;
  a.deallocate(&id, 1);
  decoding(a, 1, tokens(700, 8));
  EXPECT_GT(a.generation(1), first);  // the same id again: another admission
}

}  // namespace
}  // namespace ukv
