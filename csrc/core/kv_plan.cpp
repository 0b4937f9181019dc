#include "core/kv_plan.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/ceil_div.h"
#include "core/errors.h"
#include "core/sizing.h"

namespace ukv {
namespace {

constexpr int64_t kCsaRatio = 4;  // the layers that carry the lightning indexer

int64_t row_bytes(const ModelKvSpec& m) { return m.head_dim * m.kv_elem_bytes + m.rope_head_dim * m.rope_elem_bytes; }

void validate(int64_t budget, const ModelKvSpec& m, const ServeSpec& s) {
  require(budget > 0, "budget_bytes must be > 0, got ", budget);
  require(!m.compress_ratios.empty(), "compress_ratios must list at least one layer");
  require(m.head_dim > 0 && m.kv_elem_bytes > 0, "head_dim and kv_elem_bytes must be > 0");
  require(m.rope_head_dim >= 0 && m.rope_elem_bytes > 0, "rope_head_dim must be >= 0 and rope_elem_bytes > 0");
  require(m.indexer_bytes_per_block >= 0, "indexer_bytes_per_block must be >= 0");
  require(s.block_size > 0 && s.window >= 0 && s.mtp_k >= 0 && s.max_num_seqs > 0,
          "block_size and max_num_seqs must be > 0, window and mtp_k >= 0");
  require(!s.max_num_batched_tokens || *s.max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ",
          s.max_num_batched_tokens.value_or(0));
  require(s.swa_budget_frac > 0.0 && s.swa_budget_frac < 1.0, "swa_budget_frac must be in (0, 1), got ",
          s.swa_budget_frac);
  for (int64_t r : m.compress_ratios) rows_per_compress_block(r, s.block_size);  // throws unless r | block_size
}

struct Costs {
  int64_t swa_block = 0, compressed_block = 0, indexer_block = 0;
};

Costs costs(const ModelKvSpec& m, const ServeSpec& s) {
  Costs c;
  const int64_t rb = row_bytes(m);
  for (int64_t r : m.compress_ratios) {
    c.swa_block += s.block_size * rb;
    c.compressed_block += rows_per_compress_block(r, s.block_size) * rb;
    if (r == kCsaRatio) c.indexer_block += m.indexer_bytes_per_block;
  }
  c.compressed_block += c.indexer_block;
  return c;
}

// Upstream's prefill-chunk allowance, in blocks, when the token budget is not given.
constexpr int64_t kUpstreamChunkBlocks = 64;

int64_t swa_blocks(int64_t budget, const ServeSpec& s, const Costs& c) {
  if (s.window == 0) return 0;
  if (s.full_retain) return static_cast<int64_t>(s.swa_budget_frac * static_cast<double>(budget)) / c.swa_block;
  const int64_t window_blocks = ceil_div(s.window + s.mtp_k, s.block_size);
  const int64_t chunk_blocks =
      s.max_num_batched_tokens ? ceil_div(*s.max_num_batched_tokens, s.block_size) : kUpstreamChunkBlocks;
  return s.max_num_seqs * (window_blocks + 1) + chunk_blocks;
}

// Fills rows and bytes for a candidate; type_slots decides the unified rows.
void fill_tensors(KvPlan& p, const ModelKvSpec& m, const ServeSpec& s, const Costs& c) {
  // c.indexer_block: indexer bytes of one logical block over all CSA layers.
  p.layer_rows.clear();
  const int64_t rb_kv = m.head_dim * m.kv_elem_bytes, rb_rope = m.rope_head_dim * m.rope_elem_bytes;
  int64_t rows_total = 0;
  for (int64_t r : m.compress_ratios) {
    int64_t rows;
    if (p.mode == PlanMode::StaticSplit || r == 0) {
      rows = layer_rows(p.mode == PlanMode::StaticSplit ? Layout::StaticSplit : Layout::Unified, r,
                        p.num_swa_blocks, p.num_logical_blocks, s.block_size);
    } else {
      const auto k = rows_per_compress_block(r, s.block_size);
      const auto t = std::find(p.compress_ks.begin(), p.compress_ks.end(), k) - p.compress_ks.begin();
      rows = layer_rows_for_slots(r, p.type_slots[static_cast<size_t>(t)], p.num_swa_blocks, s.block_size);
    }
    p.layer_rows.push_back(rows);
    rows_total += rows;
  }
  p.kv_bytes = rows_total * rb_kv;
  p.rope_bytes = rows_total * rb_rope;
  p.indexer_bytes = c.indexer_block * p.num_logical_blocks;
  p.total_bytes = p.kv_bytes + p.rope_bytes + p.indexer_bytes;
}

// Largest n in [0, hi] with fits(n), for a monotone predicate.
template <typename F>
int64_t largest_fitting(int64_t hi, F fits) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace

KvPlan plan_kv_layout(int64_t budget, const ModelKvSpec& m, const ServeSpec& s, PlanMode mode) {
  validate(budget, m, s);
  const Costs c = costs(m, s);
  KvPlan p;
  p.mode = mode;
  p.swa_block_bytes = c.swa_block;
  p.compressed_block_bytes = c.compressed_block;
  p.num_swa_blocks = swa_blocks(budget, s, c);
  const int64_t swa_bytes = p.num_swa_blocks * c.swa_block;
  require(swa_bytes < budget, "the SWA region alone (", p.num_swa_blocks, " blocks, ", swa_bytes,
          " bytes) does not fit budget_bytes ", budget);
  std::set<int64_t> ratios;
  for (int64_t r : m.compress_ratios) if (r > 0) ratios.insert(r);
  for (int64_t r : ratios) p.compress_ks.push_back(s.block_size / r);
  // The upstream block count: what the budget holds after the SWA region.
  const int64_t upstream_nb = c.compressed_block > 0 ? (budget - swa_bytes) / c.compressed_block : 0;
  auto candidate = [&](int64_t own_blocks) {
    KvPlan q = p;
    if (mode == PlanMode::StaticSplit) {
      q.num_logical_blocks = own_blocks;
    } else {
      q.type_slots = slot_counts(q.num_swa_blocks, own_blocks, q.compress_ks, s.block_size);
      q.num_logical_blocks = own_blocks;
      if (mode == PlanMode::UnifiedElastic && !q.compress_ks.empty()) {
        int64_t capacity = kMaxRows;  // every compress block the tightest type can hold
        for (size_t t = 0; t < q.compress_ks.size(); ++t)
          capacity = std::min(capacity, q.type_slots[t] * (s.block_size / q.compress_ks[t]));
        q.num_logical_blocks = capacity;
      }
    }
    fill_tensors(q, m, s, c);
    return q;
  };
  // Tensors are rounded up to whole slots (and elastic adds logical blocks),
  // so search the largest own-region size whose real tensors fit the budget.
  const int64_t own = largest_fitting(upstream_nb, [&](int64_t nb) { return candidate(nb).total_bytes <= budget; });
  return candidate(own);
}

}  // namespace ukv
