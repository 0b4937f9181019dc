#include "core/manager/kv_manager.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/manager/block_hash.h"
#include "core/common/ceil_div.h"
#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {
namespace {

}  // namespace

// Moves the row space may make between two stage() calls: every unit one step
// can bind, each of which may move the other kind's boundary units until it
// has its rows. The prefill chunks' share (their blocks and pages) and the
// decode share (each sequence's next block and decode pages) are kept apart,
// so chunks cannot use up what append() needs. A third share, as large as the
// prefill one, is for the blocks a KV tier loads at admission
// (kv_manager_tiers.cpp): loads cannot use up what the chunks need.
int64_t KvManager::prefill_copy_share(const ServeConfig& c, const PoolSizes& p) {
  // Each sequence's chunk may straddle one more block and page than its tokens fill.
  return (ceil_div(c.max_num_batched_tokens, c.block_size) + ceil_div(c.max_num_batched_tokens, c.swa_page()) +
          2 * c.max_num_seqs) *
         moves_per_bind(p);
}

int64_t KvManager::decode_copy_share(const ServeConfig& c, const PoolSizes& p) {
  return 4 * c.max_num_seqs * (1 + c.mtp_k) * moves_per_bind(p);
}

int64_t KvManager::moves_per_bind(const PoolSizes& p) {
  const int64_t big = std::max(p.envelope_rows, p.swa_unit_rows), small = std::min(p.envelope_rows, p.swa_unit_rows);
  return ceil_div(big, small) + 1;
}

KvManager::KvManager(const ServeConfig& config, const PoolSizes& pools)
    : serve_((validate(config, pools), config)),
      pools_(resolved(config, pools)),
      ks_(config.compress_ks()),
      logical_(pools_.num_logical_blocks, serve_.block_size,
               serve_.unified() && !serve_.row_space() ? num_types() : 0, &events_),
      reclaimable_(serve_.unified() && !serve_.row_space() ? pools_.num_swa_blocks : 0),
      unbound_free_(serve_.row_space() ? pools_.num_logical_blocks : 0),
      row_seq_(static_cast<size_t>(serve_.max_num_seqs), -1), row_len_(static_cast<size_t>(serve_.max_num_seqs), 0) {
  const int64_t bs = serve_.block_size;
  page_ = serve_.swa_page();
  ppb_ = serve_.pages_per_block();
  if (serve_.window > 0) {
    tail_pages_ = std::max<int64_t>(1, ceil_div(serve_.window + serve_.mtp_k - 1, page_));
    const int64_t chunk_span = span_pages(serve_.full_retain ? serve_.max_num_batched_tokens : serve_.window, page_);
    // Prefill: the previous chunk's window (or the claimed hit tail) plus the
    // pages this chunk writes. Decode: the window of the first query plus the
    // positions of this and the previous step's speculative tokens. After the
    // prompt, held pages (one window) never exceed the decode bound.
    prefill_peak_ = std::max(tail_pages_, span_pages(serve_.window, page_)) + chunk_span;
    decode_peak_ = span_pages(serve_.window + 2 * (1 + serve_.mtp_k) - 1, page_);
    // A chunk of c tokens from position p holds floor((p % page + c - window)
    // / page) pages below its last window, at most floor((c + page - 1 -
    // window) / page): over a step's chunks (max_num_batched_tokens tokens,
    // max_num_seqs chunks) no more than this. Full retain's quota already
    // covers whole chunks.
    if (!serve_.full_retain)
      whole_chunk_pages_ = (serve_.max_num_batched_tokens +
                            serve_.max_num_seqs * std::max<int64_t>(0, page_ - 1 - serve_.window)) / page_;
  }
  retention_blocks_ = serve_.retention_interval / bs;
  const bool sparse = serve_.full_retain && retention_blocks_ > 0;
  const auto checkpoint_capacity =
      sparse ? static_cast<int64_t>(static_cast<double>(pools_.num_swa_blocks) * serve_.checkpoint_frac) : 0;
  if (serve_.row_space()) {
    rows_ = std::make_unique<RowSpace>(pools_.total_rows, pools_.envelope_rows, pools_.swa_unit_rows,
                                       2 * prefill_copy_share(serve_, pools_) + decode_copy_share(serve_, pools_));
    for (int64_t b = 0; b < pools_.num_logical_blocks; ++b) unbound_free_.push_back(b);
  } else if (serve_.unified()) {
    std::vector<CompressTypeSpec> types;
    for (int64_t t = 0; t < num_types(); ++t)
      types.push_back({ks_[static_cast<size_t>(t)], pools_.type_slots[static_cast<size_t>(t)]});
    coord_ = std::make_unique<Coordinator>(pools_.num_swa_blocks, types, bs, serve_.layout == KvLayout::Elastic);
    for (int64_t t = 0; t < num_types(); ++t)
      owner_of_phys_.emplace_back(static_cast<size_t>(coord_->pool(t).num_compress_ids()), -1);
    live_in_slot_.assign(static_cast<size_t>(pools_.num_swa_blocks), 0);
  }
  if (serve_.window > 0)
    swa_ = std::make_unique<SwaBlocks>(pools_.num_swa_blocks, page_, coord_.get(), rows_.get(), checkpoint_capacity, &events_);
  install_evict_listener();
  swa_reserved_ = checkpoint_reserve();
}

void KvManager::install_evict_listener() {
  // Compress borrowing a released slot drops the SWA block cached there, before
  // compress overwrites its rows.
  if (coord_ && swa_) coord_->set_evict_listener([this](int64_t slot) { swa_->evict_slot(slot); });
  // The row space dropped a cached unit to make room: its content is gone.
  if (rows_)
    rows_->set_evict_listener([this](UnitKind kind, int64_t owner) {
      if (kind == UnitKind::Swa) return swa_->on_row_evicted(owner);
      logical_.drop_hash(owner);
      unbound_free_.push_back(owner);
    });
}

// ------------------------------------------------------------------ lookup --

KvManager::Sequence& KvManager::seq(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  require(it != seqs_.end(), "unknown sequence id ", seq_id);
  return it->second;
}

const KvManager::Sequence& KvManager::seq(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  require(it != seqs_.end(), "unknown sequence id ", seq_id);
  return it->second;
}

const std::vector<int32_t>& KvManager::logical_table(int64_t seq_id) const { return seq(seq_id).logical; }
const std::vector<int32_t>& KvManager::swa_table(int64_t seq_id) const { return seq(seq_id).swa; }
std::vector<int32_t> KvManager::phys_table(int64_t seq_id, int64_t type) const {
  const int64_t tables = serve_.num_phys_tables();
  require(type >= 0 && type < tables, "phys_table: compress type ", type, " out of range [0, ", tables,
          ") (the row-space layout has one envelope table, 0)");
  std::vector<int32_t> out;
  for (int32_t id : seq(seq_id).logical) out.push_back(phys_of(type, id));
  return out;
}

std::vector<int32_t> KvManager::staged_swa_table(int64_t seq_id) const {
  std::vector<int32_t> out;
  for (int32_t page : seq(seq_id).swa) out.push_back(unit_of(page));
  return out;
}
int64_t KvManager::num_computed(int64_t seq_id) const { return seq(seq_id).num_computed; }
int64_t KvManager::num_tokens(int64_t seq_id) const { return static_cast<int64_t>(seq(seq_id).tokens.size()); }
const std::vector<int32_t>& KvManager::tokens(int64_t seq_id) const { return seq(seq_id).tokens; }
const std::vector<CacheKey>& KvManager::block_hashes(int64_t seq_id) const { return seq(seq_id).hashes; }

// ----------------------------------------------------------------- prefill --

void KvManager::require_distinct_known(const int64_t* seq_ids, int64_t n, const char* what) const {
  require(n >= 0, what, ": batch size must be >= 0, got ", n);
  // A fresh mark per batch finds repeats in O(n), without sorting a copy.
  const uint64_t mark = ++batch_mark_;
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = seq(seq_ids[i]);
    require(s.batch_mark != mark, what, ": seq_ids holds sequence ", seq_ids[i], " twice");
    s.batch_mark = mark;
  }
}

void KvManager::push_block(Sequence& s, int64_t id) {
  s.dirty_lo = std::min<int64_t>(s.dirty_lo, static_cast<int64_t>(s.logical.size()));
  s.logical.push_back(static_cast<int32_t>(id));
  s.swa.insert(s.swa.end(), static_cast<size_t>(ppb_), -1);
}

void KvManager::alloc_page(Sequence& s, int64_t page) {
  auto& entry = s.swa[static_cast<size_t>(page)];
  entry = static_cast<int32_t>(swa_->alloc());
  ++s.swa_held;
  s.dirty_lo = std::min(s.dirty_lo, page / ppb_);
}

void KvManager::apply_deallocate(int64_t seq_id) {
  Sequence& s = seq(seq_id);
  for (auto i = static_cast<int64_t>(s.logical.size()) - 1; i >= 0; --i) {
    const int64_t id = s.logical[static_cast<size_t>(i)];
    if (logical_.release(id)) on_block_freed(id);
  }
  if (swa_)
    for (auto it = s.swa.rbegin(); it != s.swa.rend(); ++it)
      if (*it >= 0) swa_->release(*it);
  swa_reserved_ -= s.swa_quota;
  set_extra_pages(s, 0);
  seqs_.erase(seq_id);
}

void KvManager::deallocate(const int64_t* seq_ids, int64_t n) {
  require_distinct_known(seq_ids, n, "deallocate");
  for (int64_t i = 0; i < n; ++i) apply_deallocate(seq_ids[i]);
}

void KvManager::clear_cache() {
  logical_.clear_cache();
  if (swa_) swa_->clear_cache();
  events_.all_cleared();
  if (!rows_) return;
  // Cached envelopes hold nothing a hit could use now: give them back.
  for (int64_t id = rows_->coldest_cached(UnitKind::Envelope); id >= 0;
       id = rows_->coldest_cached(UnitKind::Envelope)) {
    rows_->evict(UnitKind::Envelope, id);
    unbound_free_.push_back(id);
  }
}

int32_t KvManager::phys_of(int64_t table, int32_t id) const {
  // A reserved envelope (no chunk reached the block yet) reads as envelope 0:
  // no valid index reaches an entry of it, and a stray one stays in bounds.
  if (rows_) return static_cast<int32_t>(std::max<int64_t>(0, rows_->slot_of(UnitKind::Envelope, id)));
  return coord_ ? logical_.binding(table, id) : id;
}

int32_t KvManager::unit_of(int32_t page) const {
  return page < 0 || !rows_ ? page : static_cast<int32_t>(rows_->slot_of(UnitKind::Swa, page));
}

void KvManager::on_block_freed(int64_t id) {
  if (!rows_) return on_live_change(id, -1);
  if (logical_.has_hash(id)) return rows_->set_cached(UnitKind::Envelope, id, true);
  // Nothing a later hit could use: the envelope goes back, or the reservation
  // of a block no chunk reached.
  if (rows_->is_bound(UnitKind::Envelope, id)) rows_->unbind(UnitKind::Envelope, id);
  else --envelopes_reserved_;
  unbound_free_.push_back(id);
}

void KvManager::on_block_claimed(int64_t id) {
  if (rows_) rows_->set_cached(UnitKind::Envelope, id, false);
  else on_live_change(id, +1);
}

}  // namespace ukv
