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

// The model's compress layers use exactly the configuration's compress types.
void require_matching_types(const ModelKvSpec& m, const ServeConfig& c) {
  std::set<int64_t> used;
  for (int64_t r : m.layer_ratios) {
    if (r == 0) continue;
    require(c.type_of_ratio(r) >= 0, "ModelKvSpec.layer_ratios has compress ratio ", r,
            ", which is not one of ServeConfig.compress_ratios (rows per block are derived from ratios, never given)");
    used.insert(r);
  }
  for (int64_t r : c.compress_ratios)
    require(used.count(r) != 0, "ServeConfig.compress_ratios has ratio ", r, ", which no layer of the model uses");
}

void validate_inputs(int64_t budget, const ModelKvSpec& m, const ServeConfig& c) {
  require(budget > 0, "budget_bytes must be > 0, got ", budget);
  validate(m);
  validate(c);
  require_matching_types(m, c);
}

struct Costs {
  int64_t swa_block = 0, compressed_block = 0, indexer_block = 0;
};

Costs costs(const ModelKvSpec& m, const ServeConfig& s) {
  Costs c;
  const int64_t rb = row_bytes(m);
  for (int64_t r : m.layer_ratios) {
    c.swa_block += s.block_size * rb;
    c.compressed_block += rows_per_compress_block(r, s.block_size) * rb;
    if (r == kCsaRatio) c.indexer_block += m.indexer_bytes_per_block;
  }
  c.compressed_block += c.indexer_block;
  return c;
}

// Upstream's prefill-chunk allowance, in blocks, when the token budget is not given.
constexpr int64_t kUpstreamChunkBlocks = 64;

int64_t swa_blocks(int64_t budget, const ServeConfig& s, const Costs& c) {
  if (s.window == 0) return 0;
  if (s.full_retain) return static_cast<int64_t>(s.swa_budget_frac * static_cast<double>(budget)) / c.swa_block;
  const int64_t window_blocks = ceil_div(s.window + s.mtp_k, s.block_size);
  const int64_t chunk_blocks = s.swa_sizing == SwaSizing::Step ? ceil_div(s.max_num_batched_tokens, s.block_size)
                                                                 : kUpstreamChunkBlocks;
  return s.max_num_seqs * (window_blocks + 1) + chunk_blocks;
}

// Fills rows and bytes for a candidate; type_slots decides the unified rows.
void fill_tensors(KvPlan& p, const Costs& c) {
  const ModelKvSpec& m = p.model;
  const ServeConfig& s = p.config;
  const PoolSizes& pools = p.pools;
  p.layer_rows.clear();
  const int64_t rb_kv = m.head_dim * m.kv_elem_bytes, rb_rope = m.rope_head_dim * m.rope_elem_bytes;
  int64_t rows_total = 0;
  for (int64_t r : m.layer_ratios) {
    int64_t rows;
    if (!s.unified() || r == 0) {
      rows = layer_rows(s.unified() ? Layout::Unified : Layout::StaticSplit, r, pools.num_swa_blocks,
                        pools.num_logical_blocks, s.block_size);
    } else {
      const int64_t t = s.type_of_ratio(r);
      rows = layer_rows_for_slots(r, pools.type_slots[static_cast<size_t>(t)], pools.num_swa_blocks, s.block_size);
    }
    p.layer_rows.push_back(rows);
    rows_total += rows;
  }
  p.kv_bytes = rows_total * rb_kv;
  p.rope_bytes = rows_total * rb_rope;
  p.indexer_bytes = c.indexer_block * pools.num_logical_blocks;
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

void validate(const ModelKvSpec& m) {
  require(!m.layer_ratios.empty(), "ModelKvSpec.layer_ratios must list at least one layer");
  for (int64_t r : m.layer_ratios) require(r >= 0, "ModelKvSpec.layer_ratios must be >= 0, got ", r);
  require(m.head_dim > 0, "ModelKvSpec.head_dim must be > 0, got ", m.head_dim);
  require(m.kv_elem_bytes > 0, "ModelKvSpec.kv_elem_bytes must be > 0, got ", m.kv_elem_bytes);
  require(m.rope_head_dim >= 0, "ModelKvSpec.rope_head_dim must be >= 0, got ", m.rope_head_dim);
  require(m.rope_elem_bytes > 0, "ModelKvSpec.rope_elem_bytes must be > 0, got ", m.rope_elem_bytes);
  require(m.indexer_bytes_per_block >= 0, "ModelKvSpec.indexer_bytes_per_block must be >= 0, got ",
          m.indexer_bytes_per_block);
}

KvPlan plan_kv_layout(int64_t budget, const ModelKvSpec& m, const ServeConfig& s) {
  validate_inputs(budget, m, s);
  require(!s.row_space(), "plan_kv_layout: layout 'row_space' is not available in this build");
  const Costs c = costs(m, s);
  KvPlan p;
  p.config = s;
  p.model = m;
  p.budget_bytes = budget;
  p.swa_block_bytes = c.swa_block;
  p.compressed_block_bytes = c.compressed_block;
  p.pools.num_swa_blocks = swa_blocks(budget, s, c);
  const int64_t swa_bytes = p.pools.num_swa_blocks * c.swa_block;
  require(swa_bytes < budget, "the SWA region alone (", p.pools.num_swa_blocks, " blocks, ", swa_bytes,
          " bytes) does not fit budget_bytes ", budget);
  const auto ks = s.compress_ks();
  // The upstream block count: what the budget holds after the SWA region.
  const int64_t upstream_nb = c.compressed_block > 0 ? (budget - swa_bytes) / c.compressed_block : 0;
  auto candidate = [&](int64_t own_blocks) {
    KvPlan q = p;
    q.pools.num_logical_blocks = own_blocks;
    if (s.unified()) {
      q.pools.type_slots = slot_counts(q.pools.num_swa_blocks, own_blocks, ks, s.block_size);
      if (s.layout == KvLayout::Elastic && !ks.empty()) {
        int64_t capacity = kMaxRows;  // every compress block the tightest type can hold
        for (size_t t = 0; t < ks.size(); ++t)
          capacity = std::min(capacity, q.pools.type_slots[t] * (s.block_size / ks[t]));
        q.pools.num_logical_blocks = capacity;
      }
    }
    fill_tensors(q, c);
    return q;
  };
  // Tensors are rounded up to whole slots (and elastic adds logical blocks),
  // so search the largest own-region size whose real tensors fit the budget.
  const int64_t own = largest_fitting(upstream_nb, [&](int64_t nb) { return candidate(nb).total_bytes <= budget; });
  KvPlan plan = candidate(own);
  validate(plan.config, plan.pools);  // what KvManager(plan) will check, refused here first
  return plan;
}

}  // namespace ukv
