#include "core/kv_manager.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/block_hash.h"
#include "core/ceil_div.h"
#include "core/errors.h"
#include "core/sizing.h"

namespace ukv {
namespace {

// Most blocks that any w consecutive positions touch.
int64_t span_blocks(int64_t w, int64_t block_size) {
  return w <= 0 ? 0 : ceil_div(w - 1, block_size) + 1;
}

}  // namespace

KvManager::KvManager(const ServeConfig& config, const PoolSizes& pools)
    : serve_((validate(config, pools), config)),
      pools_{pools.num_logical_blocks, pools.num_swa_blocks, resolved_type_slots(config, pools)},
      ks_(config.compress_ks()),
      logical_(pools_.num_logical_blocks, serve_.block_size, serve_.unified() ? num_types() : 0),
      reclaimable_(serve_.unified() ? pools_.num_swa_blocks : 0),
      row_seq_(static_cast<size_t>(serve_.max_num_seqs), -1), row_len_(static_cast<size_t>(serve_.max_num_seqs), 0) {
  const int64_t bs = serve_.block_size;
  if (serve_.window > 0) {
    tail_blocks_ = std::max<int64_t>(1, ceil_div(serve_.window + serve_.mtp_k - 1, bs));
    const int64_t chunk_span = span_blocks(serve_.full_retain ? serve_.max_num_batched_tokens : serve_.window, bs);
    // Prefill: the previous chunk's window (or the claimed hit tail) plus the
    // blocks this chunk writes. Decode: the window of the first query plus the
    // positions of this and the previous step's speculative tokens. After the
    // prompt, held blocks (one window) never exceed the decode bound.
    prefill_peak_ = std::max(tail_blocks_, span_blocks(serve_.window, bs)) + chunk_span;
    decode_peak_ = span_blocks(serve_.window + 2 * (1 + serve_.mtp_k) - 1, bs);
  }
  retention_blocks_ = serve_.retention_interval / bs;
  const bool sparse = serve_.full_retain && retention_blocks_ > 0;
  const auto checkpoint_capacity =
      sparse ? static_cast<int64_t>(static_cast<double>(pools_.num_swa_blocks) * serve_.checkpoint_frac) : 0;
  if (serve_.unified()) {
    std::vector<CompressTypeSpec> types;
    for (int64_t t = 0; t < num_types(); ++t)
      types.push_back({ks_[static_cast<size_t>(t)], pools_.type_slots[static_cast<size_t>(t)]});
    coord_ = std::make_unique<Coordinator>(pools_.num_swa_blocks, types, bs, serve_.layout == KvLayout::Elastic);
    for (int64_t t = 0; t < num_types(); ++t)
      owner_of_phys_.emplace_back(static_cast<size_t>(coord_->pool(t).num_compress_ids()), -1);
    live_in_slot_.assign(static_cast<size_t>(pools_.num_swa_blocks), 0);
  }
  if (serve_.window > 0) swa_ = std::make_unique<SwaBlocks>(pools_.num_swa_blocks, bs, coord_.get(), checkpoint_capacity);
  install_evict_listener();
  swa_reserved_ = checkpoint_reserve();
}

void KvManager::install_evict_listener() {
  // Compress borrowing a released slot drops the SWA block cached there (C3).
  if (coord_ && swa_) coord_->set_evict_listener([this](int64_t slot) { swa_->evict_slot(slot); });
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
const std::vector<int32_t>& KvManager::phys_table(int64_t seq_id, int64_t type) const {
  require(type >= 0 && type < num_types(), "compress type ", type, " out of range [0, ", num_types(), ")");
  return seq(seq_id).phys[static_cast<size_t>(type)];
}
int64_t KvManager::num_computed(int64_t seq_id) const { return seq(seq_id).num_computed; }
int64_t KvManager::num_tokens(int64_t seq_id) const { return static_cast<int64_t>(seq(seq_id).tokens.size()); }

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

void KvManager::push_block(Sequence& s, int64_t id, int32_t swa_id) {
  s.dirty_lo = std::min<int64_t>(s.dirty_lo, static_cast<int64_t>(s.logical.size()));
  s.logical.push_back(static_cast<int32_t>(id));
  s.swa.push_back(swa_id);
  for (int64_t t = 0; t < num_types(); ++t)
    s.phys[static_cast<size_t>(t)].push_back(coord_ ? logical_.binding(t, id) : static_cast<int32_t>(id));
  s.swa_held += swa_id >= 0;
}

void KvManager::apply_deallocate(int64_t seq_id) {
  Sequence& s = seq(seq_id);
  for (auto i = static_cast<int64_t>(s.logical.size()) - 1; i >= 0; --i) {
    const int64_t id = s.logical[static_cast<size_t>(i)];
    if (logical_.release(id)) on_live_change(id, -1);
  }
  if (swa_)
    for (auto it = s.swa.rbegin(); it != s.swa.rend(); ++it)
      if (*it >= 0) swa_->release(*it);
  swa_reserved_ -= s.swa_quota;
  seqs_.erase(seq_id);
}

void KvManager::deallocate(const int64_t* seq_ids, int64_t n) {
  require_distinct_known(seq_ids, n, "deallocate");
  for (int64_t i = 0; i < n; ++i) apply_deallocate(seq_ids[i]);
}

void KvManager::clear_cache() {
  logical_.clear_cache(events_);
  if (swa_) swa_->clear_cache();
}

std::vector<KvEvent> KvManager::take_events() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

}  // namespace ukv
