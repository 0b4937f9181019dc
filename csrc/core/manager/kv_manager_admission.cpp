// KvManager: admission (the joint SWA + compress capacity check and its
// promise), the choice of fresh logical blocks, compress bindings and the
// reclaim of shared slots that hold only cached blocks.
#include <algorithm>
#include <limits>

#include "core/manager/block_hash.h"
#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {

// ---------------------------------------------------------------- capacity --

bool KvManager::capacity_ok(int64_t extra_quota, int64_t compress_demand, const std::vector<int64_t>& reclaim) const {
  if (rows_) {
    // Row space: an envelope for every block of a live sequence (bound or
    // reserved) and for the blocks going live, and an SWA unit for every
    // reserved page, fit the rows; cached units give way on demand.
    const int64_t envelopes = rows_->live_units(UnitKind::Envelope) + envelopes_reserved_ + compress_demand;
    const int64_t units = std::max(swa_reserved_ + extra_quota, rows_->live_units(UnitKind::Swa));
    return envelopes * pools_.envelope_rows + units * pools_.swa_unit_rows <= pools_.total_rows;
  }
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
  return slot < pools_.num_swa_blocks ? slot : -1;
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
  if (rows_) return bind_envelopes(ids);
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
  // A retained binding moves on reuse (free it, bind afresh), so borrowed
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

// Row space: cached blocks go live on their own envelopes first, so no
// envelope bound next can evict them; the others get envelopes (the row
// space makes room: admission counted every one of them).
void KvManager::bind_envelopes(const std::vector<int64_t>& ids) {
  for (int64_t id : ids)
    if (rows_->is_bound(UnitKind::Envelope, id)) rows_->set_cached(UnitKind::Envelope, id, false);
  for (int64_t id : ids) {
    if (rows_->is_bound(UnitKind::Envelope, id)) continue;
    unbound_free_.erase(id);
    rows_->bind(UnitKind::Envelope, id);
  }
}

void KvManager::reserve_envelopes(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    if (rows_->is_bound(UnitKind::Envelope, id)) {
      rows_->set_cached(UnitKind::Envelope, id, false);
      continue;
    }
    unbound_free_.erase(id);
    ++envelopes_reserved_;
  }
}

void KvManager::unbind(int64_t id) {
  for (int64_t t = 0; t < num_types(); ++t) free_binding(t, id);
  logical_.drop_hash(id);  // its KV is gone: the cache must not hit it
}

// A true allocation's logical half: the block goes live with whatever
// binding it retains, so no reclaim can take that binding away before
// bind_popped() decides about it.
int64_t KvManager::take_block(int64_t id) {
  logical_.take(id);
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
// stand-in re-uses its own binding (net zero) and its content is evicted.
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
  if (rows_) {
    fresh = choose_row_space_fresh(count, skip);
    return fits(fresh);
  }
  fresh = fresh_walk();
  take_longest_free(fresh, count, skip);
  return settle_fresh(fresh, skip, fits);
}

// Row space: blocks without an envelope while the row space has unheld rows
// for them (nothing is evicted), then the coldest cached blocks (their
// envelopes are reused and their content evicted), then blocks without an
// envelope again (the row space evicts or moves to make room). Every chosen
// block goes live, so each counts as demand.
KvManager::FreshBlocks KvManager::choose_row_space_fresh(int64_t count, const std::vector<int64_t>& skip) const {
  FreshBlocks fresh;
  const auto skipped = [&](int64_t id) { return std::binary_search(skip.begin(), skip.end(), id); };
  int64_t room = rows_->unheld_rows() / pools_.envelope_rows;
  int64_t unbound = unbound_free_.front();
  for (; count > 0 && room > 0 && unbound >= 0; unbound = unbound_free_.next(unbound), --count, --room)
    fresh.ids.push_back(unbound);
  const SlotList& cached = rows_->cached(UnitKind::Envelope);
  for (int64_t id = cached.front(); count > 0 && id >= 0; id = cached.next(id))
    if (!skipped(id)) fresh.ids.push_back(id), --count, ++fresh.evicted;
  for (; count > 0 && unbound >= 0; unbound = unbound_free_.next(unbound), --count) fresh.ids.push_back(unbound);
  require<StateError>(count == 0, "internal: the logical free list ran out");  // callers count first
  fresh.demand = static_cast<int64_t>(fresh.ids.size());
  return fresh;
}

// --------------------------------------------------------------- admission --

int64_t KvManager::lookup_page(const int32_t* tokens, int64_t page, const std::vector<CacheKey>& hashes) const {
  return swa_->lookup(page_hash(hashes[static_cast<size_t>(page / ppb_)], page), tokens + page * page_);
}

// The hit stops at the highest block boundary whose trailing tail_pages pages
// (all of them, for a boundary closer to the start) are cached: pages are
// scanned from the top, and a run of present pages [j, end) serves the
// highest boundary at or below `end` once it reaches tail_pages below it.
int64_t KvManager::bounded_hit(const int32_t* tokens, int64_t hit, const std::vector<CacheKey>& hashes) const {
  if (!swa_) return hit;
  int64_t end = hit * ppb_;
  for (int64_t j = hit * ppb_ - 1; j >= 0; --j) {
    if (lookup_page(tokens, j, hashes) < 0) {
      end = j;
      continue;
    }
    const int64_t boundary = end / ppb_ * ppb_;
    if (boundary - j >= tail_pages_ || (j == 0 && boundary > 0)) return boundary / ppb_;
  }
  return 0;
}

KvManager::Admission KvManager::admission(const int32_t* tokens, int64_t n, uint64_t salt) const {
  require(n > 0, "a request needs at least one token, got ", n);
  const int64_t nb = blocks_for(n);
  require(nb <= serve_.max_blocks_per_seq, "a request of ", n, " tokens needs ", nb, " blocks, more than max_blocks_per_seq ",
          serve_.max_blocks_per_seq);
  Admission a;
  // max_num_seqs bounds the live sequences: a batch of them must fit the staged tables.
  if (num_sequences() >= serve_.max_num_seqs) return a;
  if (serve_.enable_prefix_caching) {
    // The last block is never a hit: prefill must forward at least one block.
    const int64_t candidates = std::min(nb - 1, n / serve_.block_size);
    for (int64_t i = 0; i < candidates; ++i) {
      const int32_t* toks = tokens + i * serve_.block_size;
      const CacheKey h = block_key(toks, i > 0 ? &a.hashes.back() : nullptr, salt);
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
  // In the row space a cached envelope holds no live rows: the free hits
  // going live are demand too.
  const int64_t hit_demand = rows_ ? static_cast<int64_t>(free_hits.size()) : 0;
  std::vector<int64_t> going_live;
  const auto fits = [&](const FreshBlocks& fresh) {
    going_live = free_hits;
    going_live.insert(going_live.end(), fresh.ids.begin(), fresh.ids.end());
    return capacity_ok_with_reclaim(a.quota, fresh.demand + hit_demand, going_live);
  };
  a.ok = choose_fresh(nb - a.cached_blocks, free_hits, fits, a.fresh);
  return a;
}

// Whether the request would fit with no sequence live: everything it needs
// (its blocks, and its SWA quota with the checkpoint and whole-chunk
// reserves) within what the pools hold in all. Asked only of a refused request.
bool KvManager::fits_empty_pools(int64_t blocks, int64_t quota) const {
  if (blocks > pools_.num_logical_blocks) return false;
  const int64_t pages = quota + checkpoint_reserve() + chunk_reserve(0);
  if (rows_)
    return blocks * pools_.envelope_rows + pages * pools_.swa_unit_rows <= pools_.total_rows;
  if (!coord_) return !swa_ || pages <= pools_.num_swa_blocks;
  std::vector<CompressTypeSpec> types;
  for (int64_t t = 0; t < num_types(); ++t)
    types.push_back({ks_[static_cast<size_t>(t)], pools_.type_slots[static_cast<size_t>(t)]});
  // Every SWA slot counts as released: a coordinator that does not lend
  // never-used slots reaches that state once SWA has used and freed them all,
  // so a request that fits it is only "not now".
  const Coordinator empty(pools_.num_swa_blocks, types, serve_.block_size, /*borrow_unreleased_swa=*/true);
  return empty.can_allocate_jointly(pages, std::vector<int64_t>(static_cast<size_t>(num_types()), blocks));
}

int64_t KvManager::refusal(int64_t n) const {
  const int64_t blocks = blocks_for(n);
  return fits_empty_pools(blocks, swa_ ? quota_for(blocks, false) : 0) ? kNotNow : kNeverFits;
}

int64_t KvManager::can_allocate(const int32_t* tokens, int64_t n, uint64_t salt) const {
  const Admission a = admission(tokens, n, salt);
  return a.ok ? a.cached_blocks * serve_.block_size : refusal(n);
}

void KvManager::require_new_id(int64_t seq_id) const {
  require(seq_id >= 0, "sequence ids must be >= 0 (-1 is the padding sentinel of the index ops), got ", seq_id);
  require(!has_sequence(seq_id), "sequence id ", seq_id, " is already allocated");
}

int64_t KvManager::allocate(int64_t seq_id, const int32_t* tokens, int64_t n, uint64_t salt) {
  require_new_id(seq_id);
  const Admission a = admission(tokens, n, salt);
  if (!a.ok) {
    ++stats_.admission_refusals;
    return refusal(n);
  }
  Sequence s;
  const int64_t bs = serve_.block_size, hits = a.cached_blocks;
  const int64_t first_hit_page = std::max<int64_t>(0, hits * ppb_ - tail_pages_);
  for (int64_t i = 0; i < hits; ++i) {
    const int64_t id = a.hit_ids[static_cast<size_t>(i)];
    const bool was_free = logical_.is_free(id);
    logical_.claim(id);
    if (was_free) on_block_claimed(id);
    push_block(s, id);
  }
  for (int64_t j = first_hit_page; swa_ && j < hits * ppb_; ++j) {  // the hit's trailing window
    const auto page = static_cast<int32_t>(lookup_page(tokens, j, a.hashes));
    swa_->claim(page);
    s.swa[static_cast<size_t>(j)] = page;
    ++s.swa_held;
  }
  // Claim everything first: the hits and the popped blocks are then live, so
  // a reclaim cannot take their bindings (or the hits' cached KV) away.
  std::vector<int64_t> popped;
  for (int64_t id : a.fresh.ids) popped.push_back(take_block(id));
  stats_.compress_evictions += a.fresh.evicted;
  reclaim_until(a.quota, a.fresh.demand);
  if (rows_) reserve_envelopes(popped);
  else bind_popped(popped);
  for (int64_t id : popped) push_block(s, id);
  s.tokens.assign(tokens, tokens + n);
  s.hashes = a.hashes;
  s.salt = salt;
  s.num_prompt = n;
  s.num_computed = hits * bs;
  s.swa_written_lo = first_hit_page * page_;
  s.swa_freed_upto = first_hit_page;
  s.swa_quota = a.quota;
  swa_reserved_ += a.quota;
  s.cached = hits * bs;
  s.generation = ++stats_.admissions;
  seqs_.emplace(seq_id, std::move(s));
  stats_.prefix_query_blocks += blocks_for(n);
  stats_.compressed_hit_blocks += a.compressed_hit;
  stats_.prefix_hit_blocks += hits;
  return hits * bs;
}

}  // namespace ukv
