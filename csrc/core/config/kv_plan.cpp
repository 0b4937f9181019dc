#include "core/config/kv_plan.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/common/ceil_div.h"
#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {
namespace {

constexpr int64_t kCsaRatio = 4;  // the layers that carry the lightning indexer

int64_t row_bytes(const ModelKvSpec& m) { return nope_row_bytes(m) + rope_row_bytes(m); }

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
  // Every layer has its own tensor: SWA block w is rows [w * bs, (w + 1) * bs),
  // compress block id c rows compress_base + c * k + [0, k).
  const Layout layout = s.unified() ? Layout::Unified : Layout::StaticSplit;
  const int64_t base = compress_base_row(layout, pools.num_swa_blocks, s.block_size);
  p.layer_base_rows.assign(m.layer_ratios.size(), 0);
  p.layer_indexer_planes.assign(m.layer_ratios.size(), -1);
  p.layer_indexer_offsets.assign(m.layer_ratios.size(), 0);
  p.layer_compress_bases.clear();
  p.layer_block_strides.clear();
  p.layer_swa_rows.clear();
  for (int64_t r : m.layer_ratios) {
    p.layer_compress_bases.push_back(r == 0 ? 0 : base);
    p.layer_block_strides.push_back(rows_per_compress_block(r, s.block_size));
    for (int64_t v : {s.block_size, s.block_size, int64_t{0}, s.block_size, s.block_size}) p.layer_swa_rows.push_back(v);
  }
}

// ---------------------------------------------------------------- row space --

// The CSA indexer blocks inside an envelope: each CSA layer's block (bytes
// contiguous in one plane, as the indexer kernels address it) in the NoPE or
// the RoPE part of the fewest rows that hold them all.
struct IndexerPacking {
  int64_t rows = 0;
  int64_t in_nope = 0;  // layers whose block is in the NoPE plane (the first ones)
};

IndexerPacking pack_indexer(const ModelKvSpec& m, int64_t num_csa_layers) {
  IndexerPacking pk;
  const int64_t ib = m.indexer_bytes_per_block;
  if (num_csa_layers == 0 || ib == 0) return pk;
  const int64_t nope = nope_row_bytes(m), rope = rope_row_bytes(m);
  const auto blocks_in = [&](int64_t rows) { return rows * nope / ib + rows * rope / ib; };
  pk.rows = ceil_div(num_csa_layers * ib, nope + rope);  // a lower bound
  while (blocks_in(pk.rows) < num_csa_layers) ++pk.rows;
  pk.in_nope = std::min(num_csa_layers, pk.rows * nope / ib);
  return pk;
}

KvPlan plan_row_space(int64_t budget, const ModelKvSpec& m, const ServeConfig& s) {
  const int64_t rb = row_bytes(m), b = s.swa_page();
  const int64_t rows = budget / rb;
  require(rows <= kMaxRows, "budget_bytes ", budget, " holds ", rows, " rows of ", rb,
          " bytes: more than the int32 row limit ", kMaxRows, " (row indices are int32)");
  // Classes: the compress types in ascending ratio, then the dense layers.
  std::vector<int64_t> class_ratio = s.compress_ratios;
  class_ratio.push_back(0);
  std::vector<int64_t> count(class_ratio.size(), 0), index_in_class(m.layer_ratios.size());
  for (size_t l = 0; l < m.layer_ratios.size(); ++l) {
    const int64_t r = m.layer_ratios[l];
    const size_t c = r == 0 ? class_ratio.size() - 1 : static_cast<size_t>(s.type_of_ratio(r));
    index_in_class[l] = count[c]++;
  }
  const auto k_of = [&](size_t c) { return class_ratio[c] == 0 ? b : s.block_size / class_ratio[c]; };
  // Envelope offsets (compress rows of class c start at o[c]) and unit
  // offsets (class c's SWA rows start at u[c]); u[c] >= o[c] because k <= b.
  std::vector<int64_t> o(class_ratio.size()), u(class_ratio.size());
  int64_t env_kv_rows = 0, unit_rows = 0;
  for (size_t c = 0; c < class_ratio.size(); ++c) {
    o[c] = env_kv_rows;
    u[c] = unit_rows;
    if (class_ratio[c] != 0) env_kv_rows += count[c] * k_of(c);
    unit_rows += count[c] * b;
  }
  const int64_t csa_type = s.type_of_ratio(kCsaRatio);
  const IndexerPacking pk = pack_indexer(m, csa_type < 0 ? 0 : count[static_cast<size_t>(csa_type)]);
  const int64_t env_rows = env_kv_rows + pk.rows;

  KvPlan p;
  p.config = s;
  p.model = m;
  p.budget_bytes = budget;
  PoolSizes& pools = p.pools;
  pools.total_rows = rows;
  pools.envelope_rows = env_rows;
  pools.swa_unit_rows = unit_rows;
  // One block and the pages of a decode step's window (as KvManager's decode
  // bound: the window of the first query plus this and the last step's
  // speculative positions).
  const int64_t min_rows = env_rows + span_pages(s.window + 2 * (1 + s.mtp_k) - 1, b) * unit_rows;
  require(rows >= min_rows, "budget_bytes ", budget, " holds ", rows, " rows of ", rb,
          " bytes, fewer than one sequence needs: an envelope (", env_rows, " rows) and a decode window of SWA units (",
          unit_rows, " rows each), ", min_rows, " rows");
  pools.num_logical_blocks = rows / env_rows;
  pools.num_swa_blocks = s.window > 0 ? rows / unit_rows : 0;
  p.swa_base_row = rows - (rows / unit_rows) * unit_rows;
  p.kv_bytes = rows * nope_row_bytes(m);
  p.rope_bytes = rows * rope_row_bytes(m);
  p.total_bytes = p.kv_bytes + p.rope_bytes;  // the indexer lives inside the envelopes
  p.swa_block_bytes = unit_rows * rb;
  p.compressed_block_bytes = env_rows * rb;
  for (size_t l = 0; l < m.layer_ratios.size(); ++l) {
    const int64_t r = m.layer_ratios[l];
    const size_t c = r == 0 ? class_ratio.size() - 1 : static_cast<size_t>(s.type_of_ratio(r));
    const int64_t k = k_of(c), base = o[c] + index_in_class[l] * k;
    p.layer_base_rows.push_back(base);
    p.layer_rows.push_back(rows - base);
    p.layer_compress_bases.push_back(0);
    p.layer_block_strides.push_back(r == 0 ? 0 : env_rows);
    // Token q of a page: unit_row + (u[c] - o[c]) + (q / k) * count * k + q % k
    // from the layer's base row, the same for every layer of the class.
    for (int64_t v : {b, unit_rows, p.swa_base_row + u[c] - o[c], k, count[c] * k}) p.layer_swa_rows.push_back(v);
    int64_t plane = -1, offset = 0;
    if (r == kCsaRatio && pk.rows > 0) {
      const int64_t j = index_in_class[l];
      const bool nope = j < pk.in_nope;
      plane = nope ? 0 : 1;
      offset = env_kv_rows * (nope ? nope_row_bytes(m) : rope_row_bytes(m)) +
               (nope ? j : j - pk.in_nope) * m.indexer_bytes_per_block;
    }
    p.layer_indexer_planes.push_back(plane);
    p.layer_indexer_offsets.push_back(offset);
  }
  return p;
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

int64_t nope_row_bytes(const ModelKvSpec& m) { return m.head_dim * m.kv_elem_bytes; }
int64_t rope_row_bytes(const ModelKvSpec& m) { return m.rope_head_dim * m.rope_elem_bytes; }

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
  if (s.row_space()) {
    KvPlan plan = plan_row_space(budget, m, s);
    validate(plan.config, plan.pools);
    return plan;
  }
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
