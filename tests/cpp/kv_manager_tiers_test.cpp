// KvManager::allocate_loaded and locate_blocks / locate_pages: a prefix found
// in a KV tier is admitted as computed but published only by the first
// commit_prefill (a sequence that ends before leaves nothing unfilled in the
// prefix cache), refusals change nothing, and published blocks are located
// where they are. Whole chunks (set_whole_chunks) come from their reserve.
#include <gtest/gtest.h>

#include <vector>

#include "core/common/errors.h"
#include "core/manager/block_hash.h"
#include "core/manager/kv_manager.h"
#include "manager_test_support.h"

namespace ukv {
namespace {

using testing_support::kBs;
using testing_support::tokens;

ServeConfig config(KvLayout layout) {
  ServeConfig c = testing_support::small_config(layout);
  c.max_num_batched_tokens = 1024;
  if (layout == KvLayout::RowSpace) c.swa_page_tokens = 32;  // pages smaller than blocks
  return c;
}

PoolSizes pools(KvLayout layout) {
  PoolSizes p;
  if (layout == KvLayout::RowSpace) {
    p.total_rows = 64 * 128;
    p.envelope_rows = 128;
    p.swa_unit_rows = 64;
    return p;
  }
  p.num_logical_blocks = 32;
  p.num_swa_blocks = 16;
  return p;
}

class Tiers : public ::testing::TestWithParam<KvLayout> {};

TEST_P(Tiers, LoadedPrefixIsComputedAndPublishedByTheFirstCommit) {
  KvManager m(config(GetParam()), pools(GetParam()));
  const auto prompt = tokens(5 * kBs + 17, 1);
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t id = 3;
  ASSERT_EQ(m.allocate_loaded(id, prompt.data(), n, 3 * kBs), 3 * kBs);
  EXPECT_EQ(m.num_computed(id), 3 * kBs);
  EXPECT_TRUE(m.block_hashes(id).empty());                // nothing published before the rows are filled
  EXPECT_EQ(m.can_allocate(prompt.data(), n), 0);         // so nothing hits
  // The SWA pages of the window - 1 positions before the loaded end are held.
  const auto& swa = m.swa_table(id);
  EXPECT_GE(swa[static_cast<size_t>(3 * m.config().pages_per_block() - 1)], 0);
  const int64_t chunk = n - 3 * kBs;
  const int32_t sampled = 5;
  m.ensure_for_tokens(&id, &chunk, 1);
  m.commit_prefill(&id, &chunk, &sampled, 1);
  EXPECT_EQ(m.block_hashes(id).size(), 5u);
  m.check_invariants();
  EXPECT_EQ(m.can_allocate(prompt.data(), n), 5 * kBs);  // the loaded blocks hit like computed ones
}

TEST_P(Tiers, SequenceEndingBeforeItsFirstChunkLeavesNothingCached) {
  KvManager m(config(GetParam()), pools(GetParam()));
  const auto prompt = tokens(4 * kBs + 1, 2);
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t id = 1;
  ASSERT_EQ(m.allocate_loaded(id, prompt.data(), n, 4 * kBs), 4 * kBs);
  m.deallocate(&id, 1);
  m.check_invariants();
  EXPECT_EQ(m.can_allocate(prompt.data(), n), 0);
  EXPECT_TRUE(m.take_events().events.empty());
}

TEST_P(Tiers, RefusalsAndBadArgumentsChangeNothing) {
  KvManager m(config(GetParam()), pools(GetParam()));
  const auto prompt = tokens(3 * kBs, 3);
  const auto n = static_cast<int64_t>(prompt.size());
  EXPECT_THROW(m.allocate_loaded(0, prompt.data(), n, kBs + 1), InvalidArgument);  // not a block boundary
  EXPECT_THROW(m.allocate_loaded(0, prompt.data(), n, n), InvalidArgument);        // the last token is computed
  const auto one = tokens(1, 4);
  for (int64_t id = 0; id < 8; ++id) ASSERT_EQ(m.allocate(id, one.data(), 1), 0);  // max_num_seqs live
  EXPECT_EQ(m.allocate_loaded(8, prompt.data(), n, 2 * kBs), KvManager::kNotNow);
  EXPECT_EQ(m.num_sequences(), 8);
  EXPECT_FALSE(m.has_sequence(8));
  m.check_invariants();
}

TEST_P(Tiers, LocatesPublishedBlocksAndPages) {
  KvManager m(config(GetParam()), pools(GetParam()));
  const auto prompt = tokens(2 * kBs + 5, 5);
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t id = 0, chunk = n;
  const int32_t sampled = 1;
  ASSERT_EQ(m.allocate(id, prompt.data(), n), 0);
  m.ensure_for_tokens(&id, &chunk, 1);
  m.commit_prefill(&id, &chunk, &sampled, 1);
  if (m.row_space()) (void)m.take_copies();
  const auto& hashes = m.block_hashes(id);
  ASSERT_EQ(hashes.size(), 2u);
  const int64_t tables = m.config().num_phys_tables();
  std::vector<int32_t> out(static_cast<size_t>(2 * (1 + tables)));
  m.locate_blocks(hashes.data(), prompt.data(), 2, out.data());
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(out[static_cast<size_t>(b * (1 + tables))], m.logical_table(id)[static_cast<size_t>(b)]);
    for (int64_t t = 0; t < tables; ++t)
      EXPECT_EQ(out[static_cast<size_t>(b * (1 + tables) + 1 + t)], m.phys_table(id, t)[static_cast<size_t>(b)]);
  }
  // The last block's page is in the decode window, held: its unit is the staged one.
  const int64_t ppb = m.config().pages_per_block(), page = m.config().swa_page();
  const CacheKey page_key = swa_page_hash(m.config().prefix_hash, hashes[1], ppb - 1, ppb);
  int32_t unit = -2;
  m.locate_pages(&page_key, prompt.data() + 2 * kBs - page, 1, &unit);
  EXPECT_GE(unit, 0);
  EXPECT_EQ(unit, m.staged_swa_table(id)[static_cast<size_t>(2 * ppb - 1)]);
  // Other tokens under the same hash: not found.
  const auto other = tokens(kBs, 9);
  m.locate_blocks(hashes.data(), other.data(), 1, out.data());
  EXPECT_EQ(out[0], -1);
}

// Admissions until the promises fill the pools, then one step of chunks
// within max_num_batched_tokens: with whole chunks on, every chunk gets the
// pages of all its positions from the reserve admission kept apart; off,
// the pools have no room beyond the promises and only last windows get pages.
int64_t whole_chunks_of_a_full_step(KvLayout layout, bool whole) {
  KvManager m(config(layout), pools(layout));
  m.set_whole_chunks(whole);
  std::vector<int64_t> ids;
  const auto prompt_of = [](int64_t id) { return tokens(3 * kBs + 1, static_cast<int32_t>(id + 1)); };
  for (int64_t id = 0; id < m.config().max_num_seqs; ++id) {
    const auto p = prompt_of(id);
    if (m.allocate(id, p.data(), static_cast<int64_t>(p.size())) < 0) break;
    ids.push_back(id);
  }
  EXPECT_GE(ids.size(), 2u);
  EXPECT_LT(ids.size(), static_cast<size_t>(m.config().max_num_seqs));  // the pools, not max_num_seqs, refused
  const std::vector<int64_t> step(ids.begin(), ids.begin() + 2);       // 2 * 385 <= 1024 tokens
  const std::vector<int64_t> counts(2, 3 * kBs + 1);
  m.ensure_for_tokens(step.data(), counts.data(), 2);
  m.check_invariants();
  const int64_t whole_chunks = m.stats().whole_chunks;
  for (int64_t id : step)
    for (int64_t j = 0; whole && j <= (3 * kBs) / m.config().swa_page(); ++j)
      EXPECT_GE(m.swa_table(id)[static_cast<size_t>(j)], 0) << "sequence " << id << " page " << j;
  const std::vector<int32_t> sampled(2, 5);
  m.commit_prefill(step.data(), counts.data(), sampled.data(), 2);
  m.check_invariants();
  return whole_chunks;
}

TEST_P(Tiers, WholeChunksComeFromTheirReserveWhenPromisesFillThePools) {
  EXPECT_EQ(whole_chunks_of_a_full_step(GetParam(), true), 2);
  EXPECT_EQ(whole_chunks_of_a_full_step(GetParam(), false), 0);
}

TEST_P(Tiers, WholeChunksAreRefusedWhileLivePromisesHoldTheirReserve) {
  KvManager m(config(GetParam()), pools(GetParam()));
  int64_t id = 0;
  for (auto p = tokens(3 * kBs + 1, 1); m.allocate(id, p.data(), static_cast<int64_t>(p.size())) >= 0; ++id)
    p = tokens(3 * kBs + 1, static_cast<int32_t>(id + 2));
  const auto before = m.to_state();
  EXPECT_THROW(m.set_whole_chunks(true), OutOfSlots);
  EXPECT_EQ(m.to_state(), before);
  EXPECT_FALSE(m.whole_chunks());
}

INSTANTIATE_TEST_SUITE_P(Layouts, Tiers,
                         ::testing::Values(KvLayout::Static, KvLayout::Upstream, KvLayout::Elastic,
                                           KvLayout::RowSpace));

}  // namespace
}  // namespace ukv
