// The KvManager on the row-space layout: admission against the row budget,
// SWA pages smaller than a block, and a randomized serving run whose KV lives
// in a simulated row space, so that every read (prefix hits and relocated
// units included) is checked against the content it must find.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {
namespace {

constexpr int64_t kBs = 128, kPage = 32, kEnv = 128, kUnit = 64;  // a unit: 32 tokens x 2 rows

struct Config {
  ServeConfig serve;
  PoolSizes pools;
};

Config row_space(int64_t total_rows, int64_t mtp_k = 0) {
  Config c;
  c.serve.block_size = kBs;
  c.serve.swa_page_tokens = kPage;
  c.serve.window = 128;
  c.serve.mtp_k = mtp_k;
  c.serve.layout = KvLayout::RowSpace;
  c.serve.max_num_seqs = 8;
  c.serve.max_blocks_per_seq = 64;
  c.serve.max_num_batched_tokens = 512;
  c.pools.total_rows = total_rows;
  c.pools.envelope_rows = kEnv;
  c.pools.swa_unit_rows = kUnit;
  return c;
}

std::vector<int32_t> tokens(int64_t n, int32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(seed * 100003 + i);
  return t;
}

void one_chunk(KvManager& m, int64_t id, int64_t n) {
  const int32_t sampled = 7;
  m.ensure_for_tokens(&id, &n, 1);
  m.commit_prefill(&id, &n, &sampled, 1);
}

TEST(RowSpaceManager, QuotaBoundsArePagesOfTheWindow) {
  const Config c = row_space(4096);
  const KvManager m(c.serve, c.pools);
  // 127 tokens before a hit's end span ceil(127 / 32) = 4 pages; any 128-token
  // range spans at most 128 / 32 + 1 = 5.
  EXPECT_EQ(m.tail_pages(), 4);
  EXPECT_EQ(m.prefill_quota_bound(), 5 + 5);  // the previous window + the chunk's window
  EXPECT_EQ(m.decode_quota_bound(), 5);       // 129 positions (window + 1 new): still 5 pages
}

// Admission is E * (live envelopes + new blocks) + U * (reserved pages +
// quota) <= R: requests of 8 blocks and a 10-page quota take 8*128 + 10*64 =
// 1664 rows each, so 3 fit in 5000 rows and 4 in 6656, exactly.
TEST(RowSpaceManager, AdmissionIsTheRowBudget) {
  for (const int64_t fit : {3, 4}) {
    for (const int64_t spare : {0, 1663}) {
      const Config c = row_space(fit * 1664 + spare);
      KvManager m(c.serve, c.pools);
      for (int64_t id = 0; id < fit; ++id) {
        const auto t = tokens(8 * kBs, static_cast<int32_t>(id + 1));
        ASSERT_EQ(m.allocate(id, t.data(), 8 * kBs), 0) << "request " << id << " of " << fit;
      }
      const auto next = tokens(8 * kBs, 99);
      EXPECT_EQ(m.allocate(fit, next.data(), 8 * kBs), KvManager::kNotNow) << fit << " + " << spare;
      m.check_invariants();
    }
  }
}

// Admission reserves envelopes; a chunk binds those of the blocks it writes.
// So one step binds (and moves units for) at most what it computes, however
// long the prompts it admits.
TEST(RowSpaceManager, EnvelopesAreBoundByTheChunkThatWritesThem) {
  const Config c = row_space(8192);
  KvManager m(c.serve, c.pools);
  const auto t = tokens(40 * kBs, 1);
  ASSERT_EQ(m.allocate(1, t.data(), 40 * kBs), 0);
  const RowSpace& rows = *m.row_space();
  EXPECT_EQ(rows.bound_units(UnitKind::Envelope), 0);
  EXPECT_EQ(m.phys_table(1, 0), std::vector<int32_t>(40, 0));  // none yet: read as envelope 0
  // 40 blocks need 5120 rows: a second 40-block request does not fit beside the reservation.
  const auto other = tokens(40 * kBs, 2);
  EXPECT_EQ(m.can_allocate(other.data(), 40 * kBs), KvManager::kNotNow);
  const int64_t id = 1, chunk = 300;  // blocks 0..2
  m.ensure_for_tokens(&id, &chunk, 1);
  EXPECT_EQ(rows.bound_units(UnitKind::Envelope), 3);
  const auto staged = m.phys_table(1, 0);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(staged[static_cast<size_t>(b)], rows.slot_of(UnitKind::Envelope, m.logical_table(1)[static_cast<size_t>(b)]));
  m.check_invariants();
  const auto copy = KvManager::from_state(m.to_state());  // the reservation is rebuilt from the state
  copy->check_invariants();
  m.deallocate(&id, 1);  // the reserved blocks go back with the bound ones
  EXPECT_EQ(rows.bound_units(UnitKind::Envelope), 0);
  EXPECT_EQ(m.can_allocate(other.data(), 40 * kBs), 0);
  m.check_invariants();
}

TEST(RowSpaceManager, RefusalsTellNotNowFromNeverFits) {
  const Config c = row_space(3 * 1664);
  KvManager m(c.serve, c.pools);
  // 36 blocks need 36 * 128 + 10 * 64 = 5248 rows > 4992 with nothing live.
  const auto huge = tokens(36 * kBs, 5);
  EXPECT_EQ(m.can_allocate(huge.data(), 36 * kBs), KvManager::kNeverFits);
  EXPECT_EQ(m.allocate(1, huge.data(), 36 * kBs), KvManager::kNeverFits);
  // 34 blocks: 4352 + 640 = 4992 rows: fits an empty space, not one with a request live.
  const auto big = tokens(34 * kBs, 6);
  EXPECT_EQ(m.can_allocate(big.data(), 34 * kBs), 0);
  const auto small = tokens(kBs, 7);
  ASSERT_EQ(m.allocate(2, small.data(), kBs), 0);
  EXPECT_EQ(m.can_allocate(big.data(), 34 * kBs), KvManager::kNotNow);
  EXPECT_EQ(m.num_sequences(), 1);
  m.check_invariants();
}

// A window-only chunk writes the pages from (300 - 128) / 32 = 5 on, so block
// 1's page 4 (positions 128..159) is never written. A hit ending at 256 needs
// pages 4..7: refused, unless the chunk had room for every page.
TEST(RowSpaceManager, PartlyWrittenWindowsAreNotHit) {  // pages smaller than the window
  const auto t = tokens(300, 3);
  for (const bool room : {false, true}) {
    // Tight: 3 envelopes + a 10-page quota, nothing beyond the promise.
    const Config c = row_space(room ? 4096 : 3 * kEnv + 10 * kUnit);
    KvManager m(c.serve, c.pools);
    ASSERT_EQ(m.allocate(1, t.data(), 300), 0);
    one_chunk(m, 1, 300);
    EXPECT_EQ(m.stats().whole_chunks, room ? 1 : 0);
    const int64_t id = 1;
    m.deallocate(&id, 1);
    EXPECT_EQ(m.can_allocate(t.data(), 300), room ? 2 * kBs : 0) << "room " << room;
    m.check_invariants();
  }
}

TEST(RowSpaceManager, PagesTheConfigurationCannotUseAreRefused) {
  Config c = row_space(4096);
  c.serve.swa_page_tokens = 48;  // does not divide block_size 128
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = row_space(4096);
  c.serve.swa_page_tokens = 16;  // CSA (ratio 4) writes 32 rows per block: k does not divide the page
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = row_space(int64_t{1} << 31);  // rows past int32
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
  c = row_space(kEnv - 1);  // no envelope fits
  EXPECT_THROW(KvManager(c.serve, c.pools), InvalidArgument);
}

// ---- a serving run over a simulated row space ----

// Content of position p of a token sequence: a hash of tokens[0..p].
std::vector<uint64_t> prefix_tags(const std::vector<int32_t>& t) {
  std::vector<uint64_t> tags(t.size());
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < t.size(); ++i) {
    h = (h ^ static_cast<uint32_t>(t[i])) * 1099511628211ull;
    tags[i] = h;
  }
  return tags;
}

class SimulatedRows {
 public:
  SimulatedRows(KvManager& m, int64_t total_rows) : m_(m), rows_(static_cast<size_t>(total_rows), 0) {}

  // The moves since the last step, applied phase by phase; a phase reads
  // all its sources before it writes (its copies may run in parallel).
  void apply_copies() {
    const auto copies = m_.take_copies();
    for (int32_t phase = 0; phase < RowSpace::kMaxCopyPhases; ++phase) {
      std::vector<std::pair<const RowCopy*, std::vector<uint64_t>>> reads;
      for (const RowCopy& c : copies)
        if (c.phase == phase)
          reads.emplace_back(&c, std::vector<uint64_t>(rows_.begin() + c.src_row, rows_.begin() + c.src_row + c.rows));
      for (const auto& [c, data] : reads) std::copy(data.begin(), data.end(), rows_.begin() + c->dst_row);
      moved_ += static_cast<int64_t>(reads.size());
    }
  }

  void write(int64_t seq, const std::vector<uint64_t>& tags, int64_t from, int64_t to) {
    const auto swa = m_.staged_swa_table(seq);
    for (int64_t p = from; p < to; ++p) {
      rows_[static_cast<size_t>(envelope_row(seq, p))] = tags[static_cast<size_t>(p)];
      if (swa[static_cast<size_t>(p / kPage)] >= 0) rows_[static_cast<size_t>(swa_row(swa, p))] = tags[static_cast<size_t>(p)];
    }
  }

  // Every computed position's envelope row, and the window's SWA rows.
  void check(int64_t seq, const std::vector<uint64_t>& tags, int64_t window) {
    const int64_t n = m_.num_computed(seq);
    const auto swa = m_.staged_swa_table(seq);
    for (int64_t p = 0; p < n; ++p) {
      ASSERT_EQ(rows_[static_cast<size_t>(envelope_row(seq, p))], tags[static_cast<size_t>(p)])
          << "envelope row of seq " << seq << " pos " << p;
      if (p <= n - window) continue;  // the query at n reads [n - window + 1, n]
      ASSERT_GE(swa[static_cast<size_t>(p / kPage)], 0) << "window page of seq " << seq << " pos " << p;
      ASSERT_EQ(rows_[static_cast<size_t>(swa_row(swa, p))], tags[static_cast<size_t>(p)])
          << "SWA row of seq " << seq << " pos " << p;
    }
  }

  int64_t moved() const { return moved_; }

 private:
  int64_t envelope_row(int64_t seq, int64_t p) const {
    const int32_t env = m_.phys_table(seq, 0)[static_cast<size_t>(p / kBs)];
    return m_.row_space()->first_row(UnitKind::Envelope, env) + p % kBs;
  }
  int64_t swa_row(const std::vector<int32_t>& swa, int64_t p) const {
    const int32_t unit = swa[static_cast<size_t>(p / kPage)];
    return m_.row_space()->first_row(UnitKind::Swa, unit) + (p % kPage) * (kUnit / kPage);
  }

  KvManager& m_;
  std::vector<uint64_t> rows_;
  int64_t moved_ = 0;
};

struct Live {
  std::vector<int32_t> tokens;
  int64_t prompt = 0;
};

// Prompts share a few prefixes, so hits are common; the space is tight, so
// units are evicted and moved.
std::vector<int32_t> random_prompt(std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> prefix(0, 3), len(1, 9), tail(100, 100000);
  auto t = tokens(kBs * len(rng), prefix(rng));
  t.resize(t.size() + static_cast<size_t>(len(rng) * 13), 0);
  for (size_t i = t.size() - 13; i < t.size(); ++i) t[i] = tail(rng);
  return t;
}

TEST(RowSpaceManager, ServingRunReadsWhatItWroteThroughHitsAndMoves) {
  const int64_t rows = 40 * kEnv + 24 * kUnit;
  const Config c = row_space(rows, /*mtp_k=*/1);
  KvManager m(c.serve, c.pools);
  SimulatedRows mem(m, rows);
  std::mt19937 rng(5);
  std::map<int64_t, Live> live;
  int64_t next_id = 0, hits = 0;
  for (int step = 0; step < 600; ++step) {
    // Admit one request when it fits; finish a random one now and then.
    const auto prompt = random_prompt(rng);
    const int64_t cached = m.allocate(next_id, prompt.data(), static_cast<int64_t>(prompt.size()));
    if (cached >= 0) {
      hits += cached;
      live[next_id++] = {prompt, static_cast<int64_t>(prompt.size())};
    }
    if (!live.empty() && (cached < 0 || rng() % 4 == 0)) {
      auto it = live.begin();
      std::advance(it, static_cast<int64_t>(rng() % live.size()));
      const int64_t id = it->first;
      m.deallocate(&id, 1);
      live.erase(it);
    }
    for (auto& [id, s] : live) {
      const int64_t done = m.num_computed(id);
      const auto tags = prefix_tags(s.tokens);
      if (done < s.prompt) {  // a prefill chunk of up to 200 tokens
        const int64_t n = std::min<int64_t>(s.prompt - done, 1 + static_cast<int64_t>(rng() % 200));
        m.ensure_for_tokens(&id, &n, 1);
        mem.apply_copies();
        mem.check(id, tags, c.serve.window);
        mem.write(id, tags, done, done + n);
        const int32_t sampled = done + n == s.prompt ? static_cast<int32_t>(rng() % 1000) : -1;
        m.commit_prefill(&id, &n, &sampled, 1);
        if (sampled >= 0) s.tokens.push_back(sampled);
        continue;
      }
      const int64_t two = 2;  // the next token and one draft
      if (m.can_append(&id, &two, 1) == 0) continue;
      m.append(&id, &two, 1);
      mem.apply_copies();
      mem.check(id, tags, c.serve.window);
      const int64_t accepted = 1 + static_cast<int64_t>(rng() % 2);
      std::vector<int32_t> fresh(static_cast<size_t>(accepted));
      for (auto& tok : fresh) tok = static_cast<int32_t>(rng() % 1000);
      s.tokens.insert(s.tokens.end(), fresh.begin(), fresh.end());
      mem.write(id, prefix_tags(s.tokens), done, done + accepted);
      m.commit_decode(&id, &accepted, fresh.data(), 1);
    }
    m.check_invariants();
    // The state, pending copies included, survives a round trip.
    if (m.row_space()->pending_copies() > 0 && step % 7 == 0) {
      const auto copy = KvManager::from_state(m.to_state());
      EXPECT_EQ(copy->to_state(), m.to_state());
    }
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(m.row_space()->counters().evictions[0] + m.row_space()->counters().evictions[1], 0);
  EXPECT_GT(mem.moved(), 0);  // the run really relocated units
}

}  // namespace
}  // namespace ukv
