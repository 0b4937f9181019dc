// Scenario tests of the KvManager core against hand-derived expectations.
// The randomized model-based serving test lives in tests/test_kv_manager_model.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {
namespace {

constexpr int64_t kBs = 128;

struct Config {
  ServeConfig serve;
  PoolSizes pools;
};

Config small_config(bool unified) {
  Config c;
  c.serve.block_size = kBs;
  c.serve.window = 128;
  c.serve.layout = unified ? KvLayout::Upstream : KvLayout::Static;
  c.serve.max_num_seqs = 8;
  c.serve.max_blocks_per_seq = 16;
  c.pools.num_logical_blocks = 32;
  c.pools.num_swa_blocks = 16;
  return c;
}

std::vector<int32_t> tokens(int64_t n, int32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(seed * 100003 + i);
  return t;
}

// Prefill a whole prompt in one chunk and sample one token.
void chunk(KvManager& m, int64_t id, int64_t n, int32_t sampled = -1) {
  m.ensure_for_tokens(&id, &n, 1);
  m.commit_prefill(&id, &n, &sampled, 1);
}

void prefill(KvManager& m, int64_t id, int64_t cached, const std::vector<int32_t>& toks) {
  chunk(m, id, static_cast<int64_t>(toks.size()) - cached, 7);
}

void decode_step(KvManager& m, int64_t id) {
  const int64_t one_token = 1;
  m.append(&id, &one_token, 1);
  const int64_t one = 1;
  const int32_t tok = 9;
  m.commit_decode(&id, &one, &tok, 1);
}

class BothLayouts : public ::testing::TestWithParam<bool> {};

TEST_P(BothLayouts, AllocatePrefillDecodeFree) {
  const Config c = small_config(GetParam());
  KvManager m(c.serve, c.pools);
  const auto t = tokens(300, 1);  // 3 blocks
  EXPECT_EQ(m.allocate(1, t.data(), 300), 0);
  EXPECT_EQ(m.logical_table(1).size(), 3u);
  EXPECT_EQ(m.swa_table(1), (std::vector<int32_t>{-1, -1, -1}));
  prefill(m, 1, 0, t);
  // Window-only SWA: positions [172, 300) live in blocks 1 and 2.
  const auto& swa = m.swa_table(1);
  EXPECT_EQ(swa[0], -1);
  EXPECT_GE(swa[1], 0);
  EXPECT_GE(swa[2], 0);
  m.check_invariants();
  for (int step = 0; step < 200; ++step) {
    const int64_t id = 1;
    const int64_t one_token = 1;
    ASSERT_EQ(m.can_append(&id, &one_token, 1), 1);
    decode_step(m, 1);
    m.check_invariants();
  }
  EXPECT_EQ(m.num_computed(1), 500);
  EXPECT_EQ(m.logical_table(1).size(), 4u);
  const int64_t one = 1;
  m.deallocate(&one, 1);
  m.check_invariants();
  EXPECT_EQ(m.free_logical_blocks(), 32);
  EXPECT_EQ(m.held_swa_slots(), 0);
}

TEST_P(BothLayouts, PrefixHitReusesBlocksAndTheirRows) {
  const Config c = small_config(GetParam());
  KvManager m(c.serve, c.pools);
  const auto t = tokens(512, 2);  // 4 full blocks
  m.allocate(1, t.data(), 512);
  for (int c = 0; c < 4; ++c) chunk(m, 1, kBs);  // block-sized chunks write every SWA row
  const auto logical = m.logical_table(1);
  const auto phys0 = m.phys_table(1, 0);
  const int64_t first = 1;
  m.deallocate(&first, 1);
  // The last block is never a hit; blocks 0..2 are, gated by the SWA window tail.
  EXPECT_EQ(m.can_allocate(t.data(), 512), 3 * kBs);
  EXPECT_EQ(m.allocate(2, t.data(), 512), 3 * kBs);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(m.logical_table(2)[static_cast<size_t>(i)], logical[static_cast<size_t>(i)]);
    EXPECT_EQ(m.phys_table(2, 0)[static_cast<size_t>(i)], phys0[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(m.swa_table(2)[0], -1);  // before the trailing window: never read
  EXPECT_GE(m.swa_table(2)[2], 0);   // tail block claimed from the SWA cache
  m.check_invariants();
}

// The fewest SWA blocks that admit a request of n tokens: its promise and
// nothing beyond it, so no page outside the window can be lent to its chunk.
Config tightest_swa_pool(bool unified, const std::vector<int32_t>& t) {
  Config c = small_config(unified);
  for (c.pools.num_swa_blocks = 1;; ++c.pools.num_swa_blocks) {
    KvManager probe(c.serve, c.pools);
    if (probe.can_allocate(t.data(), static_cast<int64_t>(t.size())) >= 0) return c;
  }
}

TEST_P(BothLayouts, OneChunkPrefillWritesTheWholeChunkWhenThereIsRoom) {
  const Config c = small_config(GetParam());
  KvManager m(c.serve, c.pools);
  const auto t = tokens(512, 2);
  m.allocate(1, t.data(), 512);
  prefill(m, 1, 0, t);  // pages beyond every promise: the whole chunk gets SWA rows
  EXPECT_EQ(m.stats().whole_chunks, 1);
  const int64_t first = 1;
  m.deallocate(&first, 1);
  EXPECT_EQ(m.can_allocate(t.data(), 512), 3 * kBs);  // every block but the last is a hit
  m.check_invariants();
}

TEST_P(BothLayouts, OneChunkPrefillWithoutRoomOnlyWritesTheWindow) {
  const auto t = tokens(512, 2);
  const Config c = tightest_swa_pool(GetParam(), t);
  KvManager m(c.serve, c.pools);
  ASSERT_EQ(m.allocate(1, t.data(), 512), 0);
  prefill(m, 1, 0, t);  // window-only: SWA block 2 was never written
  EXPECT_EQ(m.stats().whole_chunks, 0);
  const int64_t first = 1;
  m.deallocate(&first, 1);
  EXPECT_EQ(m.can_allocate(t.data(), 512), 0);  // the trailing-window gate refuses the stale window
}

// The model writes every position of the pages a chunk holds
// (swa_slot_mapping), so the window's first block, which it reaches into, is
// written whole and serves a hit. (Partly written pages, never published,
// arise with pages smaller than the window: the row-space tests cover them.)
TEST_P(BothLayouts, PagesTheWindowReachesIntoAreWrittenWhole) {
  const auto t = tokens(300, 3);
  const Config c = tightest_swa_pool(GetParam(), t);
  KvManager m(c.serve, c.pools);
  ASSERT_EQ(m.allocate(1, t.data(), 300), 0);
  prefill(m, 1, 0, t);  // the window [172, 300) lies in blocks 1 and 2: both written from 128
  EXPECT_EQ(m.stats().whole_chunks, 0);
  const int64_t first = 1;
  m.deallocate(&first, 1);
  EXPECT_EQ(m.can_allocate(t.data(), 300), 2 * kBs);
}

TEST_P(BothLayouts, ErrorsLeaveStateUnchanged) {
  const Config c = small_config(GetParam());
  KvManager m(c.serve, c.pools);
  const auto t = tokens(200, 4);
  m.allocate(1, t.data(), 200);
  const auto before = m.to_state();
  EXPECT_THROW(m.allocate(1, t.data(), 200), InvalidArgument);
  const int64_t id = 1, unknown = 2, too_many = 201, ok = 10, one = 1;
  const int32_t none = -1, sampled = 3;
  EXPECT_THROW(m.ensure_for_tokens(&id, &too_many, 1), InvalidArgument);
  EXPECT_THROW(m.ensure_for_tokens(&unknown, &one, 1), InvalidArgument);
  const int64_t pair[2] = {1, 2}, counts[2] = {ok, ok};
  EXPECT_THROW(m.ensure_for_tokens(pair, counts, 2), InvalidArgument);  // second unknown: first untouched
  EXPECT_THROW(m.commit_prefill(&id, &too_many, &none, 1), InvalidArgument);
  EXPECT_THROW(m.commit_prefill(&id, &ok, &sampled, 1), InvalidArgument);  // sampled before the prompt end
  const int64_t one_token = 1;
  EXPECT_THROW(m.can_append(&id, &one_token, 1), InvalidArgument);  // still in prefill
  EXPECT_THROW(m.commit_decode(&id, &one, t.data(), 1), InvalidArgument);
  const int64_t twice[2] = {1, 1};
  EXPECT_THROW(m.deallocate(twice, 2), InvalidArgument);
  const auto big = tokens(17 * kBs, 5);
  EXPECT_THROW(m.allocate(3, big.data(), 17 * kBs), InvalidArgument);  // > max_blocks_per_seq
  EXPECT_EQ(m.to_state(), before);
}

TEST_P(BothLayouts, StateRoundTrip) {
  const Config c = small_config(GetParam());
  KvManager m(c.serve, c.pools);
  const auto t = tokens(700, 6);
  m.allocate(1, t.data(), 700);
  prefill(m, 1, 0, t);
  const auto u = tokens(256, 7);
  m.allocate(2, u.data(), 256);
  auto copy = KvManager::from_state(m.to_state());
  EXPECT_EQ(copy->to_state(), m.to_state());
  const auto v = tokens(400, 8);
  EXPECT_EQ(copy->allocate(3, v.data(), 400), m.allocate(3, v.data(), 400));
  EXPECT_EQ(copy->logical_table(3), m.logical_table(3));
  EXPECT_EQ(copy->phys_table(3, 1), m.phys_table(3, 1));
}

INSTANTIATE_TEST_SUITE_P(Layouts, BothLayouts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Unified" : "StaticSplit"; });

TEST(KvManager, AdmissionCountsSwaQuotaJointlyWithCompress) {
  // One shared slot only; CSA/HCA own regions hold exactly the logical blocks.
  Config c = small_config(true);
  c.pools.num_swa_blocks = 4;
  c.pools.num_logical_blocks = 4;
  KvManager m(c.serve, c.pools);
  const auto t = tokens(100, 1);
  EXPECT_EQ(m.prefill_quota_bound(), 4);  // two window spans of 2 blocks at block 128
  EXPECT_EQ(m.decode_quota_bound(), 2);   // window + 1 token: 2 blocks
  EXPECT_EQ(m.allocate(1, t.data(), 100), 0);  // quota min(4, 1 block) = 1
  EXPECT_EQ(m.swa_reserved(), 1);
  m.check_invariants();
}

TEST(KvManager, BadConfigurations) {
  Config c = small_config(true);
  c.serve.window = 0;
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);  // window 0 with SWA blocks
  c = small_config(true);
  c.serve.compress_ratios = {48};  // does not divide block_size
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = small_config(true);
  c.pools.type_slots = {16, 16};  // HCA fine, CSA 16 slots * 4 = 64 >= 32 fine; but must cover SWA slots
  EXPECT_NO_THROW(KvManager(c.serve, c.pools));
  c.pools.type_slots = {17, 16};
  c.pools.num_logical_blocks = 100;  // more logical blocks than CSA can hold
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = small_config(false);
  c.pools.type_slots = {1, 1};
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = small_config(true);
  c.serve.swa_page_tokens = 64;  // pages smaller than a block need the row-space layout
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = small_config(true);
  c.serve.compress_ratios = {128, 4};  // types are named in ascending ratio order
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
}

// Elastic sizing: 68 logical blocks, CSA holds them in 16 SWA slots + 1 own
// slot. SWA has not used a slot yet, so only borrow_unreleased_swa lets a
// long prompt in.
TEST(KvManager, ElasticAdmissionBorrowsSwaSlotsSwaNeverUsed) {
  for (bool lend : {false, true}) {
    Config c = small_config(true);
    c.pools.num_logical_blocks = 68;
    c.pools.type_slots = {17, 17};
    c.serve.max_blocks_per_seq = 64;
    c.serve.layout = lend ? KvLayout::Elastic : KvLayout::Upstream;
    KvManager m(c.serve, c.pools);
    const auto t = tokens(40 * kBs, 1);
    // Without lending CSA owns one slot (4 blocks) until SWA has used and
    // released others: the prompt is not admitted now, but could be later.
    EXPECT_EQ(m.allocate(1, t.data(), 40 * kBs), lend ? 0 : KvManager::kNotNow);
    if (!lend) continue;
    // 40 CSA blocks: 4 in the own slot, 36 in 9 lent SWA slots; the prompt's
    // SWA quota (4) stays free for it.
    EXPECT_EQ(m.coordinator()->counters().unreleased_borrows, 9);
    EXPECT_EQ(m.free_swa_slots(), 16 - 9);
    EXPECT_EQ(m.coordinator()->counters().swa_evictions, 0);
    prefill(m, 1, 0, t);
    m.check_invariants();
    const auto copy = KvManager::from_state(m.to_state());
    EXPECT_EQ(copy->config().layout, KvLayout::Elastic);
    EXPECT_EQ(copy->to_state(), m.to_state());
  }
}

// Row space of 10 envelopes and 10 SWA units of 10 rows each. A 4-block
// prompt leaves 3 cached envelopes; a 2-block sequence then holds 2 live
// envelopes and 2 reserved pages. The prompt again: 3 free hits go live
// beside 1 fresh block, and its quota is 4 pages: 10 * (2 + 4) + 10 * (2 + 4)
// rows exceed the 100, so the answer must be not now (counting only the fresh
// block said yes, and allocate then broke the promise it had just made).
TEST(KvManager, RowSpaceAdmissionCountsFreeHitsAsLiveEnvelopes) {
  Config c = small_config(true);
  c.serve.layout = KvLayout::RowSpace;
  c.pools = PoolSizes{};
  c.pools.total_rows = 100;
  c.pools.envelope_rows = 10;
  c.pools.swa_unit_rows = 10;
  KvManager m(c.serve, c.pools);
  const auto a = tokens(3 * kBs + 1, 1);
  ASSERT_EQ(m.allocate(1, a.data(), 3 * kBs + 1), 0);
  for (int64_t done = 0; done < 3 * kBs + 1; done += kBs)  // block-sized chunks: every page published
    chunk(m, 1, std::min(kBs, 3 * kBs + 1 - done), done + kBs >= 3 * kBs + 1 ? 7 : -1);
  const int64_t first = 1;
  m.deallocate(&first, 1);
  const auto b = tokens(200, 2);
  ASSERT_EQ(m.allocate(2, b.data(), 200), 0);
  EXPECT_EQ(m.can_allocate(a.data(), 3 * kBs + 1), KvManager::kNotNow);
  EXPECT_EQ(m.allocate(3, a.data(), 3 * kBs + 1), KvManager::kNotNow);
  m.check_invariants();
  const int64_t second = 2;
  m.deallocate(&second, 1);
  EXPECT_EQ(m.allocate(3, a.data(), 3 * kBs + 1), 3 * kBs);  // alone it fits, with its hits
  m.check_invariants();
}

}  // namespace
}  // namespace ukv
