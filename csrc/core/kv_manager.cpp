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

KvManagerConfig validated(KvManagerConfig c) {
  require(c.block_size > 0, "block_size must be > 0, got ", c.block_size);
  require(c.window >= 0, "window must be >= 0, got ", c.window);
  require(c.mtp_k >= 0, "mtp_k must be >= 0, got ", c.mtp_k);
  require(c.max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ", c.max_num_batched_tokens);
  require(c.num_logical_blocks >= 0, "num_logical_blocks must be >= 0, got ", c.num_logical_blocks);
  require(c.num_swa_blocks >= 0, "num_swa_blocks must be >= 0, got ", c.num_swa_blocks);
  require((c.window > 0) == (c.num_swa_blocks > 0), "window (", c.window, ") and num_swa_blocks (", c.num_swa_blocks,
          ") must both be > 0 (a sliding-window model) or both be 0 (no SWA pool)");
  require(c.max_num_seqs > 0, "max_num_seqs must be > 0, got ", c.max_num_seqs);
  require(c.max_blocks_per_seq > 0, "max_blocks_per_seq must be > 0, got ", c.max_blocks_per_seq);
  require(c.retention_interval >= 0, "retention_interval must be >= 0, got ", c.retention_interval);
  require(c.checkpoint_frac >= 0.0 && c.checkpoint_frac <= 1.0, "checkpoint_frac must be in [0, 1], got ",
          c.checkpoint_frac);
  require(c.num_logical_blocks <= kMaxRows, "num_logical_blocks ", c.num_logical_blocks,
          " exceeds the int32 id limit ", kMaxRows);
  require(c.num_swa_blocks <= kMaxRows / c.block_size, "num_swa_blocks ", c.num_swa_blocks, " x block_size ",
          c.block_size, " exceeds the int32 row limit ", kMaxRows);
  for (int64_t k : c.compress_ks)
    require(k > 0 && k <= c.block_size && c.block_size % k == 0, "compress_ks: each k must divide block_size ",
            c.block_size, ", got ", k);
  if (!c.unified) {
    require(c.type_slots.empty(), "type_slots applies to the unified layout only (unified=false)");
    require(!c.borrow_unreleased_swa, "borrow_unreleased_swa applies to the unified layout only (unified=false)");
    for (int64_t k : c.compress_ks)  // the static layer tensors must stay addressable by int32 rows
      layer_rows(Layout::StaticSplit, c.block_size / k, c.num_swa_blocks, c.num_logical_blocks, c.block_size);
    return c;
  }
  if (c.type_slots.empty()) c.type_slots = slot_counts(c.num_swa_blocks, c.num_logical_blocks, c.compress_ks, c.block_size);
  require(c.type_slots.size() == c.compress_ks.size(), "type_slots has ", c.type_slots.size(),
          " entries, expected one per compress type (", c.compress_ks.size(), ")");
  for (size_t t = 0; t < c.type_slots.size(); ++t) {
    const int64_t capacity = c.type_slots[t] * (c.block_size / c.compress_ks[t]);
    require(c.num_logical_blocks <= capacity, "compress type ", t, " holds ", capacity,
            " blocks in ", c.type_slots[t], " slots, fewer than num_logical_blocks ", c.num_logical_blocks);
  }
  return c;
}

}  // namespace

KvManager::KvManager(KvManagerConfig config)
    : cfg_(validated(std::move(config))),
      logical_(cfg_.num_logical_blocks, cfg_.block_size, cfg_.unified ? num_types() : 0),
      reclaimable_(cfg_.unified ? cfg_.num_swa_blocks : 0),
      row_seq_(static_cast<size_t>(cfg_.max_num_seqs), -1), row_len_(static_cast<size_t>(cfg_.max_num_seqs), 0) {
  const int64_t bs = cfg_.block_size;
  if (cfg_.window > 0) {
    tail_blocks_ = std::max<int64_t>(1, ceil_div(cfg_.window + cfg_.mtp_k - 1, bs));
    const int64_t chunk_span = span_blocks(cfg_.full_retain ? cfg_.max_num_batched_tokens : cfg_.window, bs);
    // Prefill: the previous chunk's window (or the claimed hit tail) plus the
    // blocks this chunk writes. Decode: the window of the first query plus the
    // positions of this and the previous step's speculative tokens. After the
    // prompt, held blocks (one window) never exceed the decode bound.
    prefill_peak_ = std::max(tail_blocks_, span_blocks(cfg_.window, bs)) + chunk_span;
    decode_peak_ = span_blocks(cfg_.window + 2 * (1 + cfg_.mtp_k) - 1, bs);
  }
  retention_blocks_ = cfg_.retention_interval / bs;
  const bool sparse = cfg_.full_retain && retention_blocks_ > 0;
  const auto checkpoint_capacity =
      sparse ? static_cast<int64_t>(static_cast<double>(cfg_.num_swa_blocks) * cfg_.checkpoint_frac) : 0;
  if (cfg_.unified) {
    std::vector<CompressTypeSpec> types;
    for (int64_t t = 0; t < num_types(); ++t)
      types.push_back({cfg_.compress_ks[static_cast<size_t>(t)], cfg_.type_slots[static_cast<size_t>(t)]});
    coord_ = std::make_unique<Coordinator>(cfg_.num_swa_blocks, types, bs, cfg_.borrow_unreleased_swa);
    for (int64_t t = 0; t < num_types(); ++t)
      owner_of_phys_.emplace_back(static_cast<size_t>(coord_->pool(t).num_compress_ids()), -1);
    live_in_slot_.assign(static_cast<size_t>(cfg_.num_swa_blocks), 0);
  }
  if (cfg_.window > 0) swa_ = std::make_unique<SwaBlocks>(cfg_.num_swa_blocks, bs, coord_.get(), checkpoint_capacity);
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

// ---------------------------------------------------------------- capacity --

bool KvManager::capacity_ok(int64_t extra_quota, int64_t compress_demand, const std::vector<int64_t>& reclaim) const {
  const int64_t outstanding = std::max<int64_t>(0, swa_reserved_ + extra_quota - held_swa_slots());
  if (coord_) return coord_->can_allocate_jointly(outstanding, std::vector<int64_t>(static_cast<size_t>(num_types()), compress_demand), reclaim);
  return !swa_ || swa_->free_slots() >= outstanding;
}

bool KvManager::capacity_ok_with_reclaim(int64_t extra_quota, int64_t compress_demand,
                                         const std::vector<int64_t>& going_live) const {
  if (capacity_ok(extra_quota, compress_demand)) return true;
  if (!coord_ || reclaimable_.empty()) return false;
  // A slot holding a binding of a block about to go live stops being reclaimable.
  std::vector<int64_t> kept;
  for (int64_t id : going_live)
    for (int64_t t = 0; t < num_types(); ++t) {
      const int32_t phys = logical_.binding(t, id);
      const int64_t slot = phys < 0 ? -1 : shared_slot_of(t, phys);
      if (slot >= 0) kept.push_back(slot);
    }
  std::sort(kept.begin(), kept.end());
  std::vector<int64_t> reclaim;
  for (int64_t slot = reclaimable_.front(); slot >= 0; slot = reclaimable_.next(slot))
    if (!std::binary_search(kept.begin(), kept.end(), slot)) reclaim.push_back(slot);
  return !reclaim.empty() && capacity_ok(extra_quota, compress_demand, reclaim);
}

void KvManager::reclaim_until(int64_t extra_quota, int64_t compress_demand) {
  while (!capacity_ok(extra_quota, compress_demand)) {
    require<StateError>(!reclaimable_.empty(), "internal: reclaim ran out of reclaimable slots");
    reclaim_one_slot();
  }
}

void KvManager::reclaim_one_slot() {
  const int64_t slot = reclaimable_.front();
  for (int64_t t = 0; t < num_types(); ++t) {
    const TypePool& pool = coord_->pool(t);
    for (int64_t sub = 0; sub < pool.blocks_per_slot(); ++sub) {
      const int64_t phys = slot * pool.blocks_per_slot() + sub;
      if (!pool.compress_id_is_held(phys)) continue;
      unbind(owner_of_phys_[static_cast<size_t>(t)][static_cast<size_t>(phys)]);
      ++stats_.reclaimed_blocks;
    }
  }
  ++stats_.reclaimed_slots;
}

// ------------------------------------------------------------- bindings --

int64_t KvManager::shared_slot_of(int64_t type, int64_t phys) const {
  const int64_t slot = phys / coord_->pool(type).blocks_per_slot();
  return slot < cfg_.num_swa_blocks ? slot : -1;
}

void KvManager::update_reclaimable(int64_t slot) {
  const bool reclaimable = coord_->compress_busy(slot) && live_in_slot_[static_cast<size_t>(slot)] == 0;
  if (reclaimable && !reclaimable_.contains(slot)) reclaimable_.push_back(slot);
  if (!reclaimable && reclaimable_.contains(slot)) reclaimable_.erase(slot);
}

void KvManager::on_compress_freed(int64_t type, int64_t phys) {
  const int64_t slot = shared_slot_of(type, phys);
  if (slot >= 0) update_reclaimable(slot);
}

void KvManager::on_live_change(int64_t type, int64_t id, int delta) {
  const int32_t phys = logical_.binding(type, id);
  const int64_t slot = phys < 0 ? -1 : shared_slot_of(type, phys);
  if (slot < 0) return;
  live_in_slot_[static_cast<size_t>(slot)] += delta;
  update_reclaimable(slot);
}

void KvManager::on_live_change(int64_t id, int delta) {
  if (!coord_) return;
  for (int64_t t = 0; t < num_types(); ++t) on_live_change(t, id, delta);
}

void KvManager::alloc_binding(int64_t type, int64_t id) {
  const auto phys = static_cast<int32_t>(coord_->alloc_compress(type));
  logical_.set_binding(type, id, phys);
  owner_of_phys_[static_cast<size_t>(type)][static_cast<size_t>(phys)] = static_cast<int32_t>(id);
}

void KvManager::free_binding(int64_t type, int64_t id) {
  release_phys(type, logical_.binding(type, id));
  logical_.set_binding(type, id, -1);
}

void KvManager::release_phys(int64_t type, int32_t phys) {
  owner_of_phys_[static_cast<size_t>(type)][static_cast<size_t>(phys)] = -1;
  coord_->free_compress(type, phys);
  on_compress_freed(type, phys);
}

void KvManager::bind_popped(const std::vector<int64_t>& ids) {
  if (!coord_) return;
  std::vector<int64_t> retained;
  // Blocks without a binding first: admission counted exactly these as
  // compress demand, so they must find the room it saw.
  for (int64_t id : ids) {
    if (logical_.is_bound(id)) {
      retained.push_back(id);
      continue;
    }
    for (int64_t t = 0; t < num_types(); ++t) {
      alloc_binding(t, id);
      on_live_change(t, id, +1);
    }
  }
  // A retained binding moves on reuse (H3: free it, bind afresh), so borrowed
  // shared slots drift back to SWA, but only into room the pool already has:
  // a move that borrowed a fresh shared slot could take one SWA was promised.
  // The new block is taken before the old one is freed: freeing first could
  // close the very slot that was the room, and the allocation would borrow.
  for (int64_t id : retained)
    for (int64_t t = 0; t < num_types(); ++t) {
      if (coord_->pool(t).free_own_compress_blocks() == 0) continue;
      on_live_change(t, id, -1);
      const int32_t old = logical_.binding(t, id);
      alloc_binding(t, id);
      release_phys(t, old);
      on_live_change(t, id, +1);
    }
}

void KvManager::unbind(int64_t id) {
  for (int64_t t = 0; t < num_types(); ++t) free_binding(t, id);
  logical_.drop_hash(id, events_);  // its KV is gone: the cache must not hit it
}

// A true allocation's logical half: the block goes live with whatever
// binding it retains, so no reclaim can take that binding away before
// bind_popped() decides about it.
int64_t KvManager::take_block(int64_t id) {
  logical_.take(id, events_);
  on_live_change(id, +1);
  return id;
}

// ---------------------------------------------------------- fresh blocks --

void KvManager::take_longest_free(FreshBlocks& fresh, int64_t add, const std::vector<int64_t>& skip) const {
  for (; add > 0; fresh.cursor = logical_.free_list().next(fresh.cursor)) {
    require<StateError>(fresh.cursor >= 0, "internal: the logical free list ran out");  // callers count first
    if (std::binary_search(skip.begin(), skip.end(), fresh.cursor)) continue;
    fresh.ids.push_back(fresh.cursor);
    fresh.demand += coord_ && !logical_.is_bound(fresh.cursor);
    --add;
  }
}

// One never-bound block of the choice, the last, gives way to the next cached
// block that holds a binding (the coldest one left, in free-list order): the
// stand-in re-uses its own binding (net zero, H3) and its content is evicted.
// False, with nothing changed, when no such block is left.
bool KvManager::stand_in_cached(FreshBlocks& fresh, const std::vector<int64_t>& skip) const {
  if (fresh.demand == 0) return false;
  const SlotList& free = logical_.free_list();
  const auto unbound = [this](int64_t id) { return !logical_.is_bound(id); };
  int64_t id = fresh.cursor;
  while (id >= 0 && (std::binary_search(skip.begin(), skip.end(), id) || unbound(id))) id = free.next(id);
  if (id < 0) return false;
  fresh.ids.erase(std::find_if(fresh.ids.rbegin(), fresh.ids.rend(), unbound).base() - 1);
  fresh.ids.push_back(id);
  fresh.cursor = free.next(id);
  --fresh.demand;
  ++fresh.evicted;
  return true;
}

// Compress blocks every type can bind without opening a shared slot.
int64_t KvManager::room_without_borrowing() const {
  int64_t room = std::numeric_limits<int64_t>::max();
  for (int64_t t = 0; t < num_types(); ++t)
    if (coord_->pool(t).enabled()) room = std::min(room, coord_->pool(t).free_own_compress_blocks());
  return room;
}

// From the longest-free choice: cached blocks stand in before compress opens
// a shared slot (a live block there pins the slot, and SWA cannot have it
// back until its sequence ends, while a cached block gives its binding up at
// once), then one more at a time until the allocation fits, so the fewest
// are evicted.
bool KvManager::settle_fresh(FreshBlocks& fresh, const std::vector<int64_t>& skip, const FitsFn& fits) const {
  if (!coord_) return fits(fresh);
  const int64_t room = room_without_borrowing();
  while (fresh.demand > room && stand_in_cached(fresh, skip)) {
  }
  if (fits(fresh)) return true;
  while (stand_in_cached(fresh, skip))
    if (fits(fresh)) return true;
  return false;
}

bool KvManager::choose_fresh(int64_t count, const std::vector<int64_t>& skip, const FitsFn& fits,
                             FreshBlocks& fresh) const {
  fresh = fresh_walk();
  take_longest_free(fresh, count, skip);
  return settle_fresh(fresh, skip, fits);
}

// --------------------------------------------------------------- admission --

int64_t KvManager::bounded_hit(const int32_t* tokens, int64_t hit, const std::vector<uint64_t>& hashes) const {
  if (!swa_) return hit;
  int64_t contiguous = 0;
  for (int64_t i = hit - 1; i >= 0; --i) {
    const bool present = swa_->lookup(hashes[static_cast<size_t>(i)], tokens + i * cfg_.block_size) >= 0;
    contiguous = present ? contiguous + 1 : 0;
    if (contiguous == tail_blocks_) return i + contiguous;
  }
  return contiguous;  // the present run starting at block 0 (short prompts)
}

KvManager::Admission KvManager::admission(const int32_t* tokens, int64_t n) const {
  require(n > 0, "a request needs at least one token, got ", n);
  const int64_t nb = blocks_for(n);
  require(nb <= cfg_.max_blocks_per_seq, "a request of ", n, " tokens needs ", nb, " blocks, more than max_blocks_per_seq ",
          cfg_.max_blocks_per_seq);
  Admission a;
  if (cfg_.enable_prefix_caching) {
    // The last block is never a hit: prefill must forward at least one block.
    const int64_t candidates = std::min(nb - 1, n / cfg_.block_size);
    for (int64_t i = 0; i < candidates; ++i) {
      const int32_t* toks = tokens + i * cfg_.block_size;
      const uint64_t h = block_hash(toks, static_cast<size_t>(cfg_.block_size), i > 0, i > 0 ? a.hashes.back() : 0);
      const int64_t id = logical_.lookup(h, toks);
      if (id < 0) break;
      a.hashes.push_back(h);
      a.hit_ids.push_back(id);
    }
    a.compressed_hit = static_cast<int64_t>(a.hit_ids.size());
    a.cached_blocks = bounded_hit(tokens, a.compressed_hit, a.hashes);
    a.hashes.resize(static_cast<size_t>(a.cached_blocks));
    a.hit_ids.resize(static_cast<size_t>(a.cached_blocks));
  }
  int64_t used_hits = 0;
  std::vector<int64_t> free_hits;  // hits claimed from the free list
  for (int64_t id : a.hit_ids) {
    if (logical_.ref(id) > 0) ++used_hits; else free_hits.push_back(id);
  }
  if (logical_.free_count() < nb - used_hits) return a;
  std::sort(free_hits.begin(), free_hits.end());
  a.quota = swa_ ? quota_for(nb, false) : 0;
  // The free hits and the fresh blocks go live together; only fresh blocks
  // without a retained binding need new compress blocks.
  std::vector<int64_t> going_live;
  const auto fits = [&](const FreshBlocks& fresh) {
    going_live = free_hits;
    going_live.insert(going_live.end(), fresh.ids.begin(), fresh.ids.end());
    return capacity_ok_with_reclaim(a.quota, fresh.demand, going_live);
  };
  a.ok = choose_fresh(nb - a.cached_blocks, free_hits, fits, a.fresh);
  return a;
}

int64_t KvManager::can_allocate(const int32_t* tokens, int64_t n) const {
  const Admission a = admission(tokens, n);
  return a.ok ? a.cached_blocks : -1;
}

void KvManager::push_block(Sequence& s, int64_t id, int32_t swa_id) {
  s.dirty_lo = std::min<int64_t>(s.dirty_lo, static_cast<int64_t>(s.logical.size()));
  s.logical.push_back(static_cast<int32_t>(id));
  s.swa.push_back(swa_id);
  for (int64_t t = 0; t < num_types(); ++t)
    s.phys[static_cast<size_t>(t)].push_back(coord_ ? logical_.binding(t, id) : static_cast<int32_t>(id));
  s.swa_held += swa_id >= 0;
}

int64_t KvManager::allocate(int64_t seq_id, const int32_t* tokens, int64_t n) {
  require(!has_sequence(seq_id), "sequence id ", seq_id, " is already allocated");
  const Admission a = admission(tokens, n);
  if (!a.ok) {
    ++stats_.admission_refusals;
    return -1;
  }
  Sequence s;
  s.phys.resize(static_cast<size_t>(num_types()));
  const int64_t bs = cfg_.block_size, hits = a.cached_blocks;
  const int64_t swa_hit_start = std::max<int64_t>(0, hits - tail_blocks_);
  for (int64_t i = 0; i < hits; ++i) {
    const int64_t id = a.hit_ids[static_cast<size_t>(i)];
    const bool was_free = logical_.is_free(id);
    logical_.claim(id);
    if (was_free) on_live_change(id, +1);
    int32_t swa_id = -1;
    if (swa_ && i >= swa_hit_start) {
      swa_id = static_cast<int32_t>(swa_->lookup(a.hashes[static_cast<size_t>(i)], tokens + i * bs));
      swa_->claim(swa_id);
    }
    push_block(s, id, swa_id);
  }
  // Claim everything first: the hits and the popped blocks are then live, so
  // a reclaim cannot take their bindings (or the hits' cached KV) away.
  std::vector<int64_t> popped;
  for (int64_t id : a.fresh.ids) popped.push_back(take_block(id));
  stats_.compress_evictions += a.fresh.evicted;
  reclaim_until(a.quota, a.fresh.demand);
  bind_popped(popped);
  for (int64_t id : popped) push_block(s, id, -1);
  s.tokens.assign(tokens, tokens + n);
  s.hashes = a.hashes;
  s.num_prompt = n;
  s.num_computed = hits * bs;
  s.swa_written_lo = swa_hit_start * bs;
  s.swa_freed_upto = swa_hit_start;
  s.swa_quota = a.quota;
  swa_reserved_ += a.quota;
  seqs_.emplace(seq_id, std::move(s));
  ++stats_.admissions;
  stats_.prefix_query_blocks += blocks_for(n);
  stats_.compressed_hit_blocks += a.compressed_hit;
  stats_.prefix_hit_blocks += hits;
  return hits * bs;
}

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

void KvManager::check_ensure(int64_t seq_id, int64_t num_new_tokens) const {
  const Sequence& s = seq(seq_id);
  require(!is_decoding(s), "ensure_for_tokens: sequence ", seq_id, " is decoding (its prompt is computed and sampled)");
  require(num_new_tokens >= 0, "ensure_for_tokens: counts must be >= 0, got ", num_new_tokens);
  // Compared as a difference: num_computed + a count near INT64_MAX would wrap and pass.
  require(num_new_tokens <= static_cast<int64_t>(s.tokens.size()) - s.num_computed, "ensure_for_tokens: ",
          num_new_tokens, " new tokens from ", s.num_computed, " exceed the ", s.tokens.size(),
          " known tokens of sequence ", seq_id);
  require(!cfg_.full_retain || num_new_tokens <= cfg_.max_num_batched_tokens, "ensure_for_tokens: a chunk of ",
          num_new_tokens, " tokens exceeds max_num_batched_tokens ", cfg_.max_num_batched_tokens);
}

// SWA blocks the chunk writes: the whole chunk (full retain) or its last window.
int64_t KvManager::missing_swa_blocks(const Sequence& s, int64_t num_new_tokens) const {
  if (num_new_tokens == 0 || !swa_) return 0;
  const int64_t bs = cfg_.block_size, end_len = s.num_computed + num_new_tokens;
  const int64_t free_before = cfg_.full_retain ? 0 : std::max<int64_t>(0, end_len - cfg_.window) / bs;
  int64_t missing = 0;
  for (int64_t i = std::max(s.num_computed / bs, free_before); i <= (end_len - 1) / bs; ++i)
    missing += s.swa[static_cast<size_t>(i)] < 0;
  return missing;
}

void KvManager::apply_ensure(Sequence& s, int64_t num_new_tokens) {
  if (num_new_tokens == 0 || !swa_) return;
  const int64_t bs = cfg_.block_size, end_len = s.num_computed + num_new_tokens;
  const int64_t free_before = cfg_.full_retain ? 0 : std::max<int64_t>(0, end_len - cfg_.window) / bs;
  for (int64_t i = std::max(s.num_computed / bs, free_before); i <= (end_len - 1) / bs; ++i) {
    auto& entry = s.swa[static_cast<size_t>(i)];
    if (entry >= 0) continue;
    entry = static_cast<int32_t>(swa_->alloc());
    ++s.swa_held;
    s.dirty_lo = std::min(s.dirty_lo, i);
  }
}

void KvManager::ensure_for_tokens(const int64_t* seq_ids, const int64_t* counts, int64_t n) {
  require_distinct_known(seq_ids, n, "ensure_for_tokens");
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    check_ensure(seq_ids[i], counts[i]);
    missing += missing_swa_blocks(seq(seq_ids[i]), counts[i]);
  }
  // Admission reserved these blocks; running out here would be a broken promise.
  require<OutOfSlots>(missing <= free_swa_slots(), "No free SWA slots available");
  for (int64_t i = 0; i < n; ++i) apply_ensure(seq(seq_ids[i]), counts[i]);
}

bool KvManager::is_checkpoint(const Sequence& s, int64_t block) const {
  // The last `need` blocks of every retention segment, and the trailing
  // window before the prompt's end. Decode blocks (published here, unlike
  // upstream) are checkpoints only by the segment rule, so generation does
  // not pin every block it writes.
  const int64_t rb = retention_blocks_, need = tail_blocks_, prompt_blocks = s.num_prompt / cfg_.block_size;
  return block % rb >= rb - need || (block >= prompt_blocks - need && block < prompt_blocks);
}

void KvManager::publish_full_blocks(Sequence& s) {
  if (!cfg_.enable_prefix_caching) return;
  const int64_t bs = cfg_.block_size;
  const bool sparse = swa_ && swa_->checkpoint_capacity() > 0;
  for (auto i = static_cast<int64_t>(s.hashes.size()); i < s.num_computed / bs; ++i) {
    const int32_t* toks = s.tokens.data() + i * bs;
    const bool has_parent = i > 0;
    const uint64_t parent = has_parent ? s.hashes.back() : 0;
    const uint64_t h = block_hash(toks, static_cast<size_t>(bs), has_parent, parent);
    logical_.publish(s.logical[static_cast<size_t>(i)], h, toks, has_parent, parent, events_);
    s.hashes.push_back(h);
    const int32_t swa_id = swa_ ? s.swa[static_cast<size_t>(i)] : -1;
    // Only a fully written SWA block may serve a later hit (H7).
    if (swa_id < 0 || i * bs < s.swa_written_lo) continue;
    swa_->publish(swa_id, h, toks);
    if (sparse && is_checkpoint(s, i)) swa_->pin(swa_id);
  }
}

void KvManager::free_out_of_window(Sequence& s, int64_t seq_len) {
  if (!swa_) return;
  const int64_t free_before =
      std::min<int64_t>(std::max<int64_t>(0, seq_len - cfg_.window) / cfg_.block_size, static_cast<int64_t>(s.swa.size()));
  for (int64_t i = s.swa_freed_upto; i < free_before; ++i) {
    auto& entry = s.swa[static_cast<size_t>(i)];
    if (entry < 0) continue;
    swa_->release(entry);
    entry = -1;
    --s.swa_held;
    s.dirty_lo = std::min(s.dirty_lo, i);
  }
  s.swa_freed_upto = std::max(s.swa_freed_upto, free_before);
}

void KvManager::check_commit_prefill(int64_t seq_id, int64_t num_tokens, int32_t sampled) const {
  const Sequence& s = seq(seq_id);
  const auto known = static_cast<int64_t>(s.tokens.size());
  require(!is_decoding(s), "commit_prefill: sequence ", seq_id, " is decoding (its prompt is computed and sampled)");
  require(num_tokens >= 0, "commit_prefill: counts must be >= 0, got ", num_tokens);
  require(num_tokens <= known - s.num_computed, "commit_prefill: ", num_tokens, " tokens from ", s.num_computed,
          " exceed the ", known, " known tokens of sequence ", seq_id);  // a difference: a sum could wrap
  require(sampled >= -1, "commit_prefill: sampled must be a token id >= 0 or -1 (none), got ", sampled);
  require(sampled < 0 || num_tokens == known - s.num_computed,
          "commit_prefill: a sampled token can only follow the prompt's last chunk (sequence ", seq_id, ")");
}

void KvManager::apply_commit_prefill(Sequence& s, int64_t num_tokens, int32_t sampled) {
  const int64_t start = s.num_computed, end = start + num_tokens;
  if (swa_ && num_tokens > 0) {
    // The model writes whole chunks (full retain) or the chunk's last window.
    const int64_t written_from = cfg_.full_retain ? start : std::max(start, end - cfg_.window);
    if (written_from > start) s.swa_written_lo = written_from;
  }
  s.num_computed = end;
  publish_full_blocks(s);
  free_out_of_window(s, end);  // the computed length, never the scheduled one (H-j)
  if (sampled < 0 || !swa_) {
    if (sampled >= 0) s.tokens.push_back(sampled);
    return;
  }
  s.tokens.push_back(sampled);
  // Decoding from here on: the quota shrinks to the decode bound.
  const int64_t quota = quota_for(static_cast<int64_t>(s.logical.size()), true);
  swa_reserved_ += quota - s.swa_quota;
  s.swa_quota = quota;
}

void KvManager::commit_prefill(const int64_t* seq_ids, const int64_t* counts, const int32_t* sampled, int64_t n) {
  require_distinct_known(seq_ids, n, "commit_prefill");
  for (int64_t i = 0; i < n; ++i) check_commit_prefill(seq_ids[i], counts[i], sampled[i]);
  for (int64_t i = 0; i < n; ++i) apply_commit_prefill(seq(seq_ids[i]), counts[i], sampled[i]);
}

// ------------------------------------------------------------------ decode --

// How many of seq_ids (a prefix) one append() can serve jointly, with the
// free blocks it takes for them (batch order) and the SWA quota it adds.
int64_t KvManager::plan_append(const int64_t* seq_ids, int64_t n, int64_t num_new_tokens, FreshBlocks& fresh,
                               int64_t& extra_quota) const {
  require(num_new_tokens >= 1 && num_new_tokens <= 1 + cfg_.mtp_k, "num_new_tokens must be in [1, 1 + mtp_k = ",
          1 + cfg_.mtp_k, "], got ", num_new_tokens);
  require_distinct_known(seq_ids, n, "can_append");
  for (int64_t i = 0; i < n; ++i) {  // every entry is validated before any answer
    const Sequence& s = seq(seq_ids[i]);
    require(is_decoding(s), "sequence ", seq_ids[i], " is not decoding (its prompt is not computed and sampled)");
    const int64_t need = blocks_for(s.num_computed + num_new_tokens);
    require(need <= cfg_.max_blocks_per_seq, "sequence ", seq_ids[i], " would need ", need,
            " blocks, more than max_blocks_per_seq ", cfg_.max_blocks_per_seq);
  }
  static const std::vector<int64_t> no_skip;
  fresh = fresh_walk();
  extra_quota = 0;
  // While no cached block had to stand in, the prefix's blocks are the
  // longest-free ones and grow with the walk; after that each prefix chooses
  // afresh (that happens only with the compress pools full).
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = seq(seq_ids[i]);
    const int64_t need = blocks_for(s.num_computed + num_new_tokens);
    const int64_t add = std::max<int64_t>(0, need - static_cast<int64_t>(s.logical.size()));
    const int64_t dq = swa_ ? quota_for(need, true) - s.swa_quota : 0;
    if (add == 0 && dq <= 0) continue;
    const auto count = static_cast<int64_t>(fresh.ids.size()) + add;
    if (count > logical_.free_count()) return i;
    const int64_t quota = extra_quota + std::max<int64_t>(0, dq);
    const auto fits = [&](const FreshBlocks& f) { return capacity_ok_with_reclaim(quota, f.demand, f.ids); };
    if (fresh.evicted == 0) {
      take_longest_free(fresh, add, no_skip);
      if (!settle_fresh(fresh, no_skip, fits)) return i;
    } else if (!choose_fresh(count, no_skip, fits, fresh)) {
      return i;
    }
    extra_quota = quota;
  }
  return n;
}

int64_t KvManager::can_append(const int64_t* seq_ids, int64_t n, int64_t num_new_tokens) const {
  FreshBlocks fresh;
  int64_t extra_quota = 0;
  return plan_append(seq_ids, n, num_new_tokens, fresh, extra_quota);
}

void KvManager::append(const int64_t* seq_ids, int64_t n, int64_t num_new_tokens) {
  FreshBlocks fresh;
  int64_t extra_quota = 0;
  const int64_t ok = plan_append(seq_ids, n, num_new_tokens, fresh, extra_quota);
  if (ok < n) {
    ++stats_.append_refusals;
    throw OutOfSlots(detail::concat("No free KV slots available: only ", ok, " of ", n,
                                    " sequences can be appended (call can_append and preempt first)"));
  }
  std::vector<int64_t> popped;  // every sequence's new blocks, in batch order
  for (int64_t id : fresh.ids) popped.push_back(take_block(id));
  stats_.compress_evictions += fresh.evicted;
  // As in allocate(): the new blocks are live before any reclaim.
  reclaim_until(extra_quota, fresh.demand);
  bind_popped(popped);
  auto next = popped.begin();
  for (int64_t i = 0; i < n; ++i) {
    Sequence& s = seq(seq_ids[i]);
    const int64_t need = blocks_for(s.num_computed + num_new_tokens);
    if (swa_) {
      const int64_t quota = std::max(s.swa_quota, quota_for(need, true));
      swa_reserved_ += quota - s.swa_quota;
      s.swa_quota = quota;
    }
    while (static_cast<int64_t>(s.logical.size()) < need)
      push_block(s, *next++, swa_ ? static_cast<int32_t>(swa_->alloc()) : -1);
    free_out_of_window(s, s.num_computed + 1);
    s.scheduled = num_new_tokens;
  }
  ++stats_.appends;
}

void KvManager::check_commit_decode(int64_t seq_id, int64_t count) const {
  const Sequence& s = seq(seq_id);
  require(is_decoding(s), "commit_decode: sequence ", seq_id, " is not decoding");
  require(count >= 1 && count <= s.scheduled, "commit_decode: counts must be in [1, ", s.scheduled,
          "] (the positions append() scheduled for sequence ", seq_id, "), got ", count);
}

void KvManager::apply_commit_decode(Sequence& s, const int32_t* tokens, int64_t count) {
  s.num_computed += count;
  s.scheduled = 0;
  s.tokens.insert(s.tokens.end(), tokens, tokens + count);
  publish_full_blocks(s);  // a decode block is cacheable once full and committed
}

void KvManager::commit_decode(const int64_t* seq_ids, const int64_t* counts, const int32_t* tokens, int64_t n) {
  require_distinct_known(seq_ids, n, "commit_decode");
  for (int64_t i = 0; i < n; ++i) check_commit_decode(seq_ids[i], counts[i]);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    apply_commit_decode(seq(seq_ids[i]), tokens + offset, counts[i]);
    offset += counts[i];
  }
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

// ----------------------------------------------------------------- staging --

void KvManager::write_row(const Sequence& s, int64_t row, int64_t from, const StagingView& view) {
  const int64_t base = row * view.row_stride, len = static_cast<int64_t>(s.logical.size());
  for (int64_t i = from; i < len; ++i) {
    view.logical[base + i] = s.logical[static_cast<size_t>(i)];
    view.swa[base + i] = std::max<int32_t>(s.swa[static_cast<size_t>(i)], 0);  // -1 is never read; keep it in bounds
  }
  for (int64_t t = 0; t < num_types(); ++t) {
    const auto& table = s.phys[static_cast<size_t>(t)];
    std::memcpy(view.phys[static_cast<size_t>(t)] + base + from, table.data() + from,
                sizeof(int32_t) * static_cast<size_t>(len - from));
  }
  const int64_t old_len = row_len_[static_cast<size_t>(row)];
  for (int64_t i = len; i < old_len; ++i) {
    view.logical[base + i] = 0;
    view.swa[base + i] = 0;
    for (auto* p : view.phys) p[base + i] = 0;
  }
}

void KvManager::stage(const int64_t* seq_ids, int64_t n, const StagingView& view) {
  require(n >= 0 && n <= cfg_.max_num_seqs, "stage: batch of ", n, " sequences exceeds max_num_seqs ", cfg_.max_num_seqs);
  require(view.row_stride >= cfg_.max_blocks_per_seq, "stage: row_stride ", view.row_stride,
          " is smaller than max_blocks_per_seq ", cfg_.max_blocks_per_seq);
  require(static_cast<int64_t>(view.phys.size()) == num_types(), "stage: expected ", num_types(), " physical tables");
  require_distinct_known(seq_ids, n, "stage");  // every id known before any row changes
  for (int64_t r = 0; r < n; ++r) {
    Sequence& s = seq(seq_ids[r]);
    const bool same = row_seq_[static_cast<size_t>(r)] == seq_ids[r] && s.stage_row == r;
    write_row(s, r, same ? std::min(s.dirty_lo, static_cast<int64_t>(s.logical.size())) : 0, view);
    row_seq_[static_cast<size_t>(r)] = seq_ids[r];
    row_len_[static_cast<size_t>(r)] = static_cast<int64_t>(s.logical.size());
    s.stage_row = r;
    s.dirty_lo = static_cast<int64_t>(s.logical.size());
  }
}

void KvManager::invalidate_staging() {
  std::fill(row_seq_.begin(), row_seq_.end(), -1);
  std::fill(row_len_.begin(), row_len_.end(), cfg_.max_blocks_per_seq);  // zero whole rows on next write
}

}  // namespace ukv

// -------------------------------------------------------------- invariants --

namespace ukv {

void KvManager::check_invariants() const {
  if (coord_) coord_->check_invariants();
  logical_.check_invariants();
  if (swa_) swa_->check_invariants();
  std::vector<int64_t> logical_refs(static_cast<size_t>(cfg_.num_logical_blocks), 0);
  std::vector<int64_t> swa_refs(static_cast<size_t>(swa_ ? cfg_.num_swa_blocks : 0), 0);
  int64_t quotas = 0;
  for (const auto& [id, s] : seqs_) {
    const size_t len = s.logical.size();
    require<StateError>(s.swa.size() == len, "sequence ", id, ": SWA table not aligned with the logical table");
    require<StateError>(static_cast<int64_t>(len) <= cfg_.max_blocks_per_seq, "sequence ", id, " exceeds max_blocks_per_seq");
    require<StateError>(static_cast<int64_t>(len) * cfg_.block_size >= s.num_computed, "sequence ", id,
                        ": computed tokens not covered by blocks");
    require<StateError>(s.num_computed >= 0 && s.num_computed <= static_cast<int64_t>(s.tokens.size()), "sequence ",
                        id, ": computed outside [0, known]");
    int64_t held = 0;
    for (size_t i = 0; i < len; ++i) {
      const int32_t b = s.logical[i];
      ++logical_refs[static_cast<size_t>(b)];
      for (int64_t t = 0; t < num_types(); ++t) {
        const int32_t p = s.phys[static_cast<size_t>(t)][i];
        require<StateError>(p == (coord_ ? logical_.binding(t, b) : b), "sequence ", id, ": type ", t,
                            " table entry ", i, " disagrees with the block's binding");
      }
      if (s.swa[i] >= 0) {
        require<StateError>(swa_ != nullptr, "sequence ", id, " holds SWA blocks without an SWA pool");
        ++swa_refs[static_cast<size_t>(s.swa[i])];
        ++held;
        require<StateError>(static_cast<int64_t>(i) >= s.swa_freed_upto, "sequence ", id, ": SWA entry ", i,
                            " below the freed window");
      }
    }
    require<StateError>(held == s.swa_held, "sequence ", id, ": SWA held counter");
    require<StateError>(held <= s.swa_quota, "sequence ", id, " holds ", held, " SWA blocks, over its quota ",
                        s.swa_quota);
    require<StateError>(s.hashes.size() <= len, "sequence ", id, ": more hashes than blocks");
    quotas += s.swa_quota;
  }
  for (int64_t b = 0; b < cfg_.num_logical_blocks; ++b)
    require<StateError>(logical_refs[static_cast<size_t>(b)] == logical_.ref(b), "logical block ", b, " ref ",
                        logical_.ref(b), " != table occurrences ", logical_refs[static_cast<size_t>(b)]);
  for (int64_t b = 0; b < static_cast<int64_t>(swa_refs.size()); ++b)
    require<StateError>(swa_refs[static_cast<size_t>(b)] + swa_->is_pinned(b) == swa_->ref(b), "SWA block ", b,
                        " ref ", swa_->ref(b), " != table occurrences + pin");
  require<StateError>(swa_reserved_ == quotas + checkpoint_reserve(), "SWA reservation total");
  if (swa_)
    require<StateError>(swa_->free_slots() + swa_->held_slots() >= swa_reserved_, "SWA capacity ",
                        swa_->free_slots() + swa_->held_slots(), " below the promised ", swa_reserved_);
  if (!coord_) return;
  std::vector<int32_t> live(static_cast<size_t>(cfg_.num_swa_blocks), 0);
  for (int64_t b = 0; b < cfg_.num_logical_blocks; ++b) {
    for (int64_t t = 0; t < num_types(); ++t) {
      const int32_t p = logical_.binding(t, b);
      if (p < 0) continue;
      require<StateError>(owner_of_phys_[static_cast<size_t>(t)][static_cast<size_t>(p)] == b, "type ", t,
                          " phys ", p, " reverse map");
      require<StateError>(coord_->pool(t).compress_id_is_held(p), "type ", t, " phys ", p,
                          " bound to logical block ", b, " but not held in its pool");
      const int64_t slot = shared_slot_of(t, p);
      if (slot >= 0 && logical_.ref(b) > 0) ++live[static_cast<size_t>(slot)];
    }
  }
  for (int64_t t = 0; t < num_types(); ++t) {
    const TypePool& pool = coord_->pool(t);
    int64_t bound = 0;
    for (int32_t owner : owner_of_phys_[static_cast<size_t>(t)]) bound += owner >= 0;
    require<StateError>(bound == pool.num_compress_ids() - pool.free_compress_blocks() -
                                     pool.held_slots(SlotOwner::Reserved) * pool.blocks_per_slot(),
                        "type ", t, ": held compress blocks are not all bound (leak)");
  }
  for (int64_t slot = 0; slot < cfg_.num_swa_blocks; ++slot) {
    require<StateError>(live[static_cast<size_t>(slot)] == live_in_slot_[static_cast<size_t>(slot)], "shared slot ",
                        slot, " live-binding count");
    const bool reclaimable = coord_->compress_busy(slot) && live[static_cast<size_t>(slot)] == 0;
    require<StateError>(reclaimable == reclaimable_.contains(slot), "shared slot ", slot, " reclaimable membership");
  }
}

// ------------------------------------------------------------ serialization --

namespace {

void put_config(std::vector<int64_t>& st, const KvManagerConfig& c) {
  int64_t frac_bits;
  std::memcpy(&frac_bits, &c.checkpoint_frac, sizeof frac_bits);
  st.insert(st.end(), {c.block_size, c.window, c.mtp_k, c.max_num_batched_tokens, c.enable_prefix_caching, c.unified,
                       c.num_logical_blocks, c.num_swa_blocks, c.full_retain, c.retention_interval, frac_bits,
                       c.max_num_seqs, c.max_blocks_per_seq, c.borrow_unreleased_swa});
  for (const auto* v : {&c.compress_ks, &c.type_slots}) {
    st.push_back(static_cast<int64_t>(v->size()));
    st.insert(st.end(), v->begin(), v->end());
  }
}

class Reader {
 public:
  Reader(const std::vector<int64_t>& st, size_t& pos) : st_(st), pos_(pos) {}
  int64_t next() {
    require(pos_ < st_.size(), "KvManager state is truncated");
    return st_[pos_++];
  }
  int64_t count(int64_t limit, const char* what) {
    const int64_t n = next();
    require(n >= 0 && n <= limit, "KvManager state: bad ", what, " count ", n);
    return n;
  }
  template <typename T>
  std::vector<T> vec(int64_t limit, const char* what) {
    const int64_t n = count(limit, what);
    std::vector<T> v;
    v.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<T>(next()));
    return v;
  }
  std::vector<int64_t> block(const char* what) { return vec<int64_t>(static_cast<int64_t>(st_.size()), what); }

 private:
  const std::vector<int64_t>& st_;
  size_t& pos_;
};

KvManagerConfig get_config(Reader& r) {
  KvManagerConfig c;
  c.block_size = r.next();
  c.window = r.next();
  c.mtp_k = r.next();
  c.max_num_batched_tokens = r.next();
  c.enable_prefix_caching = r.next() != 0;
  c.unified = r.next() != 0;
  c.num_logical_blocks = r.next();
  c.num_swa_blocks = r.next();
  c.full_retain = r.next() != 0;
  c.retention_interval = r.next();
  const int64_t frac_bits = r.next();
  std::memcpy(&c.checkpoint_frac, &frac_bits, sizeof frac_bits);
  c.max_num_seqs = r.next();
  c.max_blocks_per_seq = r.next();
  c.borrow_unreleased_swa = r.next() != 0;
  c.compress_ks = r.vec<int64_t>(64, "compress type");
  c.type_slots = r.vec<int64_t>(64, "type slot");
  return c;
}

}  // namespace

std::vector<int64_t> KvManager::to_state() const {
  std::vector<int64_t> st;
  put_config(st, cfg_);
  if (coord_) {
    const auto cs = coord_->to_state();
    st.push_back(static_cast<int64_t>(cs.size()));
    st.insert(st.end(), cs.begin(), cs.end());
    const auto order = reclaimable_.to_vector();
    st.push_back(static_cast<int64_t>(order.size()));
    st.insert(st.end(), order.begin(), order.end());
  }
  logical_.append_state(st);
  if (swa_) swa_->append_state(st);
  std::vector<int64_t> ids;
  for (const auto& kv : seqs_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());  // canonical order
  st.push_back(static_cast<int64_t>(ids.size()));
  for (int64_t id : ids) {
    const Sequence& s = seqs_.at(id);
    st.push_back(id);
    st.push_back(static_cast<int64_t>(s.tokens.size()));
    st.insert(st.end(), s.tokens.begin(), s.tokens.end());
    st.insert(st.end(), {s.num_prompt, s.num_computed, s.swa_written_lo, s.swa_freed_upto, s.swa_quota, s.scheduled});
    st.push_back(static_cast<int64_t>(s.logical.size()));
    st.insert(st.end(), s.logical.begin(), s.logical.end());
    st.insert(st.end(), s.swa.begin(), s.swa.end());
    st.push_back(static_cast<int64_t>(s.hashes.size()));
    for (uint64_t h : s.hashes) st.push_back(static_cast<int64_t>(h));
  }
  st.push_back(static_cast<int64_t>(events_.size()));
  for (const auto& e : events_)
    st.insert(st.end(), {static_cast<int64_t>(e.kind), static_cast<int64_t>(e.block_hash),
                         static_cast<int64_t>(e.parent_hash), e.has_parent});
  st.insert(st.end(), {stats_.admissions, stats_.admission_refusals, stats_.appends, stats_.append_refusals,
                       stats_.prefix_query_blocks, stats_.compressed_hit_blocks, stats_.prefix_hit_blocks,
                       stats_.reclaimed_slots, stats_.reclaimed_blocks, stats_.compress_evictions});
  return st;
}

std::unique_ptr<KvManager> KvManager::from_state(const std::vector<int64_t>& st) {
  size_t pos = 0;
  Reader r(st, pos);
  auto m = std::make_unique<KvManager>(get_config(r));
  const auto& cfg = m->cfg_;
  if (m->coord_) {
    *m->coord_ = Coordinator::from_state(r.block("coordinator state"));
    require(m->coord_->borrow_unreleased_swa() == cfg.borrow_unreleased_swa,
            "KvManager state: the coordinator's borrow_unreleased_swa disagrees with the config");
    m->install_evict_listener();
    m->reclaimable_ = SlotList(cfg.num_swa_blocks);
    for (int64_t slot : r.vec<int64_t>(cfg.num_swa_blocks, "reclaimable slot")) {
      require(slot >= 0 && slot < cfg.num_swa_blocks && !m->reclaimable_.contains(slot), "KvManager state: bad reclaimable slot");
      m->reclaimable_.push_back(slot);
    }
  }
  m->logical_.load_state(st, pos);
  if (m->swa_) m->swa_->load_state(st, pos);
  const int64_t nseqs = r.count(int64_t{1} << 40, "sequence");
  for (int64_t k = 0; k < nseqs; ++k) {
    const int64_t id = r.next();
    require(!m->has_sequence(id), "KvManager state: sequence ", id, " appears twice");
    Sequence s;
    s.tokens = r.vec<int32_t>(cfg.max_blocks_per_seq * cfg.block_size + 1 + cfg.mtp_k, "token");
    s.num_prompt = r.next();
    s.num_computed = r.next();
    s.swa_written_lo = r.next();
    s.swa_freed_upto = r.next();
    s.swa_quota = r.next();
    s.scheduled = r.next();
    require(s.scheduled >= 0 && s.scheduled <= 1 + cfg.mtp_k, "KvManager state: bad scheduled count ", s.scheduled);
    const int64_t len = r.count(cfg.max_blocks_per_seq, "block");
    s.phys.resize(static_cast<size_t>(m->num_types()));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t b = r.next();
      require(b >= 0 && b < cfg.num_logical_blocks, "KvManager state: bad logical block ", b);
      s.logical.push_back(static_cast<int32_t>(b));
      for (int64_t t = 0; t < m->num_types(); ++t)
        s.phys[static_cast<size_t>(t)].push_back(m->coord_ ? m->logical_.binding(t, b) : static_cast<int32_t>(b));
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t w = r.next();
      require(w >= -1 && w < cfg.num_swa_blocks, "KvManager state: bad SWA block ", w);
      s.swa.push_back(static_cast<int32_t>(w));
      s.swa_held += w >= 0;
    }
    s.hashes = r.vec<uint64_t>(len, "hash");
    m->swa_reserved_ += s.swa_quota;
    m->seqs_.emplace(id, std::move(s));
  }
  const int64_t nevents = r.count(int64_t{1} << 40, "event");
  for (int64_t k = 0; k < nevents; ++k) {
    KvEvent e{static_cast<KvEventKind>(r.next())};
    e.block_hash = static_cast<uint64_t>(r.next());
    e.parent_hash = static_cast<uint64_t>(r.next());
    e.has_parent = r.next() != 0;
    m->events_.push_back(e);
  }
  auto& sx = m->stats_;
  for (int64_t* f : {&sx.admissions, &sx.admission_refusals, &sx.appends, &sx.append_refusals, &sx.prefix_query_blocks,
                     &sx.compressed_hit_blocks, &sx.prefix_hit_blocks, &sx.reclaimed_slots, &sx.reclaimed_blocks,
                     &sx.compress_evictions})
    *f = r.next();
  require(pos == st.size(), "KvManager state has ", st.size() - pos, " trailing values");
  if (m->coord_) {  // derived maps: reverse bindings and live counts per shared slot
    for (int64_t b = 0; b < cfg.num_logical_blocks; ++b)
      for (int64_t t = 0; t < m->num_types(); ++t) {
        const int32_t p = m->logical_.binding(t, b);
        if (p < 0) continue;
        require(p < m->coord_->pool(t).num_compress_ids(), "KvManager state: bad binding ", p);
        m->owner_of_phys_[static_cast<size_t>(t)][static_cast<size_t>(p)] = static_cast<int32_t>(b);
        const int64_t slot = m->shared_slot_of(t, p);
        if (slot >= 0 && m->logical_.ref(b) > 0) ++m->live_in_slot_[static_cast<size_t>(slot)];
      }
  }
  try {
    m->check_invariants();
  } catch (const StateError& e) {
    throw InvalidArgument(std::string("KvManager state is inconsistent: ") + e.what());
  }
  return m;
}

}  // namespace ukv
