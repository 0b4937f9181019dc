// KvManager: the per-step calls of prefill (ensure_for_tokens, commit_prefill)
// and decode (can_append, append, commit_decode), with the sliding window's
// frees and the publication of full blocks to the prefix cache.
#include <algorithm>

#include "core/manager/block_hash.h"
#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {

void KvManager::check_ensure(int64_t seq_id, int64_t num_new_tokens) const {
  const Sequence& s = seq(seq_id);
  require(!is_decoding(s), "ensure_for_tokens: sequence ", seq_id, " is decoding (its prompt is computed and sampled)");
  require(num_new_tokens >= 0, "ensure_for_tokens: counts must be >= 0, got ", num_new_tokens);
  // Compared as a difference: num_computed + a count near INT64_MAX would wrap and pass.
  require(num_new_tokens <= static_cast<int64_t>(s.tokens.size()) - s.num_computed, "ensure_for_tokens: ",
          num_new_tokens, " new tokens from ", s.num_computed, " exceed the ", s.tokens.size(),
          " known tokens of sequence ", seq_id);
  require(!serve_.full_retain || num_new_tokens <= serve_.max_num_batched_tokens, "ensure_for_tokens: a chunk of ",
          num_new_tokens, " tokens exceeds max_num_batched_tokens ", serve_.max_num_batched_tokens);
}

// SWA pages the chunk writes: the whole chunk (full retain) or its last window.
std::pair<int64_t, int64_t> KvManager::chunk_pages(const Sequence& s, int64_t num_new_tokens) const {
  const int64_t end_len = s.num_computed + num_new_tokens;
  const int64_t free_before = serve_.full_retain ? 0 : std::max<int64_t>(0, end_len - serve_.window) / page_;
  return {std::max(page_of(s.num_computed), free_before), page_of(end_len - 1)};
}

int64_t KvManager::missing_swa_pages(const Sequence& s, int64_t num_new_tokens) const {
  if (num_new_tokens == 0 || !swa_) return 0;
  const auto [first, last] = chunk_pages(s, num_new_tokens);
  int64_t missing = 0;
  for (int64_t j = first; j <= last; ++j) missing += s.swa[static_cast<size_t>(j)] < 0;
  return missing;
}

int64_t KvManager::prefill_copy_room() const {
  // The decode and load shares not yet used by this step's appends and loads
  // stay reserved; what they used is among the pending copies (a move a later
  // unbind cancelled may have been one of theirs, so each is capped by them).
  const int64_t pending = rows_->pending_copies();
  const int64_t decode_left =
      std::max<int64_t>(0, decode_copy_share(serve_, pools_) - std::min(step_decode_copies_, pending));
  const int64_t load_left = std::max<int64_t>(0, prefill_copy_share(serve_, pools_) - std::min(load_moves_, pending));
  return rows_->max_copies() - decode_left - load_left - pending;
}

int64_t KvManager::chunk_units(const Sequence& s, int64_t num_new_tokens) const {
  int64_t units = missing_swa_pages(s, num_new_tokens);
  for (int64_t b = s.num_computed / serve_.block_size; b < blocks_for(s.num_computed + num_new_tokens); ++b)
    units += !rows_->is_bound(UnitKind::Envelope, s.logical[static_cast<size_t>(b)]);
  return units;
}

void KvManager::bind_chunk_envelopes(Sequence& s, int64_t num_new_tokens) {
  const int64_t bs = serve_.block_size;
  for (int64_t b = s.num_computed / bs; b < blocks_for(s.num_computed + num_new_tokens); ++b) {
    const int64_t id = s.logical[static_cast<size_t>(b)];
    if (rows_->is_bound(UnitKind::Envelope, id)) continue;
    rows_->bind(UnitKind::Envelope, id);  // the promise: admission counted its rows
    --envelopes_reserved_;
    s.dirty_lo = std::min(s.dirty_lo, b);
  }
}

void KvManager::apply_ensure(Sequence& s, int64_t num_new_tokens) {
  s.ensured = num_new_tokens;
  s.write_lo = s.num_computed;
  if (rows_) bind_chunk_envelopes(s, num_new_tokens);
  if (num_new_tokens == 0 || !swa_) return;
  const auto [first, last] = chunk_pages(s, num_new_tokens);
  for (int64_t j = first; j <= last; ++j)
    if (s.swa[static_cast<size_t>(j)] < 0) alloc_page(s, j);
  s.write_lo = std::max(s.num_computed, first * page_);
}

void KvManager::set_extra_pages(Sequence& s, int64_t pages) {
  const int64_t before = chunk_reserve(extra_pages_);
  extra_pages_ += pages - s.extra_pages;
  s.extra_pages = pages;
  swa_reserved_ += chunk_reserve(extra_pages_) - before;
}

bool KvManager::ensure_whole_chunk(Sequence& s) {
  if (s.write_lo == s.num_computed) return false;  // the window covers the chunk
  const int64_t first = page_of(s.num_computed), last = page_of(s.write_lo);  // pages [first, last)
  int64_t missing = 0;
  for (int64_t j = first; j < last; ++j) missing += s.swa[static_cast<size_t>(j)] < 0;
  // Counted as reserved while held, so every promise stays kept: within the
  // whole-chunk reserve they were promised already; beyond it only where the
  // pools have room, and in the row space only from rows no unit holds
  // (placing them may still evict a cached unit or move a live one). Either
  // way only while the step's copy list has room for the moves.
  const int64_t more = chunk_reserve(extra_pages_ + missing) - chunk_reserve(extra_pages_);
  if (more > 0 && !capacity_ok(more, 0)) return false;
  if (rows_ && ((more > 0 && rows_->unheld_rows() < missing * pools_.swa_unit_rows) ||
                missing * moves_per_bind(pools_) > prefill_copy_room()))
    return false;
  for (int64_t j = first; j < last; ++j)
    if (s.swa[static_cast<size_t>(j)] < 0) alloc_page(s, j);
  set_extra_pages(s, s.extra_pages + missing);
  s.write_lo = s.num_computed;
  return true;
}

void KvManager::ensure_for_tokens(const int64_t* seq_ids, const int64_t* counts, int64_t n) {
  require_distinct_known(seq_ids, n, "ensure_for_tokens");
  int64_t missing = 0, units = 0;
  for (int64_t i = 0; i < n; ++i) {
    check_ensure(seq_ids[i], counts[i]);
    missing += missing_swa_pages(seq(seq_ids[i]), counts[i]);
    if (rows_) units += chunk_units(seq(seq_ids[i]), counts[i]);
  }
  // Admission reserved these pages; running out here would be a broken promise.
  require<OutOfSlots>(missing <= free_swa_slots(), "No free SWA slots available");
  // The copy list holds one step's moves; chunks that could overflow its
  // prefill share are refused before anything changes.
  // Chunks of one step within max_num_batched_tokens (at most max_num_seqs of
  // them) always fit the prefill share, whatever the step's appends moved.
  require(!rows_ || units * moves_per_bind(pools_) <= prefill_copy_room(), "ensure_for_tokens: the chunks bind ",
          units, " row-space units, more than the moves the step's copy list has room for (",
          rows_ ? prefill_copy_room() : 0, " copies): the step's chunks exceed max_num_batched_tokens, or no stage() "
          "ran since the previous step; nothing changed, a chunk within the budget proceeds");
  for (int64_t i = 0; i < n; ++i) apply_ensure(seq(seq_ids[i]), counts[i]);
  for (int64_t i = 0; i < n; ++i)
    if (ensure_whole_chunk(seq(seq_ids[i]))) ++stats_.whole_chunks;
}

bool KvManager::is_checkpoint(const Sequence& s, int64_t block) const {
  // The last `need` blocks of every retention segment, and the trailing
  // window before the prompt's end. Decode blocks (published here, unlike
  // upstream) are checkpoints only by the segment rule, so generation does
  // not pin every block it writes.
  const int64_t rb = retention_blocks_, need = ceil_div(tail_pages_, ppb_),
                prompt_blocks = s.num_prompt / serve_.block_size;
  return block % rb >= rb - need || (block >= prompt_blocks - need && block < prompt_blocks);
}

int64_t KvManager::hittable_blocks(const Sequence& s) const {
  const int64_t full = s.num_computed / serve_.block_size;
  if (!swa_) return full;
  // A hit ending at the boundary needs its SWA tail (bounded_hit): the pages
  // before it, all of them when the boundary is closer to the start.
  const int64_t tail_from = std::max<int64_t>(0, full * serve_.block_size - tail_pages_ * page_);
  return tail_from >= s.swa_written_lo ? full : static_cast<int64_t>(s.hashes.size());
}

void KvManager::publish_full_blocks(Sequence& s) {
  if (!serve_.enable_prefix_caching) return;
  const int64_t bs = serve_.block_size;
  const bool sparse = swa_ && swa_->checkpoint_capacity() > 0;
  for (auto i = static_cast<int64_t>(s.hashes.size()); i < hittable_blocks(s); ++i) {
    const int32_t* toks = s.tokens.data() + i * bs;
    const bool has_parent = i > 0;
    const CacheKey parent = has_parent ? s.hashes.back() : CacheKey{};
    const CacheKey h = block_key(toks, has_parent ? &parent : nullptr, s.salt);
    logical_.publish(s.logical[static_cast<size_t>(i)], h, toks, has_parent, parent, s.salt);
    s.hashes.push_back(h);
    for (int64_t j = i * ppb_; swa_ && j < (i + 1) * ppb_; ++j) {
      const int32_t page = s.swa[static_cast<size_t>(j)];
      // Only a fully written SWA page may serve a later hit: a partly written
      // one would show the hitting request positions nobody wrote.
      if (page < 0 || j * page_ < s.swa_written_lo) continue;
      swa_->publish(page, page_hash(h, j), s.tokens.data() + j * page_, h, s.salt);
      if (sparse && is_checkpoint(s, i)) swa_->pin(page);
    }
  }
}

void KvManager::free_out_of_window(Sequence& s, int64_t seq_len) {
  if (!swa_) return;
  const int64_t free_before =
      std::min<int64_t>(std::max<int64_t>(0, seq_len - serve_.window) / page_, static_cast<int64_t>(s.swa.size()));
  for (int64_t j = s.swa_freed_upto; j < free_before; ++j) {
    auto& entry = s.swa[static_cast<size_t>(j)];
    if (entry < 0) continue;
    swa_->release(entry);
    entry = -1;
    --s.swa_held;
    s.dirty_lo = std::min(s.dirty_lo, j / ppb_);
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
  // Committing what was not provisioned would leave KV with no SWA row: refused.
  require(num_tokens == 0 || num_tokens == s.ensured, "commit_prefill: sequence ", seq_id, " commits ", num_tokens,
          " tokens but ensure_for_tokens provisioned ", s.ensured,
          " for this chunk; call ensure_for_tokens with exactly the chunk before computing it");
}

void KvManager::apply_commit_prefill(Sequence& s, int64_t num_tokens, int32_t sampled) {
  const int64_t start = s.num_computed, end = start + num_tokens;
  // The model wrote the positions ensure_for_tokens gave pages: from write_lo.
  if (swa_ && num_tokens > 0 && s.write_lo > start) s.swa_written_lo = s.write_lo;
  s.num_computed = end;
  publish_full_blocks(s);
  free_out_of_window(s, end);  // the computed length, never the scheduled one: later chunks need the rest
  if (num_tokens > 0) {  // the pages below the window went with it
    set_extra_pages(s, 0);
    s.ensured = 0;
  }
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
int64_t KvManager::plan_append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n, FreshBlocks& fresh,
                               int64_t& extra_quota) const {
  require_distinct_known(seq_ids, n, "can_append");
  for (int64_t i = 0; i < n; ++i) {  // every entry is validated before any answer
    require(num_new_tokens[i] >= 1 && num_new_tokens[i] <= 1 + serve_.mtp_k,
            "num_new_tokens must be in [1, 1 + mtp_k = ", 1 + serve_.mtp_k, "], got ", num_new_tokens[i],
            " for sequence ", seq_ids[i]);
    const Sequence& s = seq(seq_ids[i]);
    require(is_decoding(s), "sequence ", seq_ids[i], " is not decoding (its prompt is not computed and sampled)");
    const int64_t need = blocks_for(s.num_computed + num_new_tokens[i]);
    require(need <= serve_.max_blocks_per_seq, "sequence ", seq_ids[i], " would need ", need,
            " blocks, more than max_blocks_per_seq ", serve_.max_blocks_per_seq);
  }
  static const std::vector<int64_t> no_skip;
  fresh = fresh_walk();
  extra_quota = 0;
  // While no cached block had to stand in, the prefix's blocks are the
  // longest-free ones and grow with the walk; after that each prefix chooses
  // afresh (that happens only with the compress pools full).
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& s = seq(seq_ids[i]);
    const int64_t need = blocks_for(s.num_computed + num_new_tokens[i]);
    const int64_t add = std::max<int64_t>(0, need - static_cast<int64_t>(s.logical.size()));
    const int64_t dq = swa_ ? quota_for(need, true) - s.swa_quota : 0;
    if (add == 0 && dq <= 0) continue;
    const auto count = static_cast<int64_t>(fresh.ids.size()) + add;
    if (count > logical_.free_count()) return i;
    const int64_t quota = extra_quota + std::max<int64_t>(0, dq);
    const auto fits = [&](const FreshBlocks& f) { return capacity_ok_with_reclaim(quota, f.demand, f.ids); };
    if (fresh.evicted == 0 && !rows_) {
      take_longest_free(fresh, add, no_skip);
      if (!settle_fresh(fresh, no_skip, fits)) return i;
    } else if (!choose_fresh(count, no_skip, fits, fresh)) {
      return i;
    }
    extra_quota = quota;
  }
  return n;
}

int64_t KvManager::can_append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n) const {
  FreshBlocks fresh;
  int64_t extra_quota = 0;
  return plan_append(seq_ids, num_new_tokens, n, fresh, extra_quota);
}

void KvManager::append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n) {
  FreshBlocks fresh;
  int64_t extra_quota = 0;
  const int64_t ok = plan_append(seq_ids, num_new_tokens, n, fresh, extra_quota);
  if (ok < n) {
    ++stats_.append_refusals;
    throw OutOfSlots(detail::concat("No free KV slots available: only ", ok, " of ", n,
                                    " sequences can be appended (call can_append and preempt first)"));
  }
  const int64_t copies_before = rows_ ? rows_->pending_copies() : 0;
  std::vector<int64_t> popped;  // every sequence's new blocks, in batch order
  for (int64_t id : fresh.ids) popped.push_back(take_block(id));
  stats_.compress_evictions += fresh.evicted;
  // As in allocate(): the new blocks are live before any reclaim.
  reclaim_until(extra_quota, fresh.demand);
  bind_popped(popped);
  auto next = popped.begin();
  for (int64_t i = 0; i < n; ++i) {
    Sequence& s = seq(seq_ids[i]);
    const int64_t need = blocks_for(s.num_computed + num_new_tokens[i]);
    if (swa_) {
      const int64_t quota = std::max(s.swa_quota, quota_for(need, true));
      swa_reserved_ += quota - s.swa_quota;
      s.swa_quota = quota;
    }
    while (static_cast<int64_t>(s.logical.size()) < need) push_block(s, *next++);
    for (int64_t j = page_of(s.num_computed); swa_ && j <= page_of(s.num_computed + num_new_tokens[i] - 1); ++j)
      if (s.swa[static_cast<size_t>(j)] < 0) alloc_page(s, j);
    free_out_of_window(s, s.num_computed + 1);
    s.scheduled = num_new_tokens[i];
  }
  if (rows_) step_decode_copies_ = std::max<int64_t>(0, step_decode_copies_ + rows_->pending_copies() - copies_before);
  ++stats_.appends;
}

void KvManager::check_commit_decode(int64_t seq_id, int64_t count) const {
  const Sequence& s = seq(seq_id);
  require(is_decoding(s), "commit_decode: sequence ", seq_id, " is not decoding");
  require(s.scheduled > 0, "commit_decode: sequence ", seq_id,
          " has no positions scheduled: call append() before the step's forward and commit_decode() after it");
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

}  // namespace ukv
