// KvManager: what the KV tiers beyond HBM need from the manager (the tier
// layer itself is ukv_torch/tiers/; docs/design.md, "KV tiers").
//
// Loading: a request is admitted with a prefix the engine found in a tier
// beyond its HBM hit. The manager treats those positions like an imported
// sequence's (kv_manager_transfer.cpp): one chunk replayed at admission, with
// its blocks and the SWA pages of its trailing window, but it publishes none
// of them. They are published by the request's first commit_prefill, once
// the engine has written their rows before that chunk ran; a sequence that
// ends before then leaves nothing in the prefix cache that nobody filled.
//
// Saving: the engine reads a published block's rows where the manager has
// them now. The answer is only true once the row space's pending moves are
// applied, so locating is refused while any are pending. A tail object is
// saved where a block's trailing window was published, so the tier layer
// turns whole chunks on: every boundary inside a prompt gets one, not only
// those a chunk's last window covers.
#include <algorithm>

#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {

void KvManager::check_loaded(int64_t n, int64_t loaded) const {
  const int64_t bs = serve_.block_size;
  require(loaded >= 0 && loaded % bs == 0 && loaded < n, "allocate: loaded_tokens must be a multiple of block_size ",
          bs, " in [0, len(tokens)) (a prefill computes at least the last token), got ", loaded, " with ", n,
          " tokens");
  require(loaded == 0 || serve_.enable_prefix_caching, "allocate: loaded_tokens needs enable_prefix_caching (the "
          "loaded blocks are published like computed ones)");
  require(loaded == 0 || !serve_.full_retain, "allocate: loaded_tokens cannot be used with full_retain (SWA would "
          "hold whole chunks that no tier object carries)");
}

int64_t KvManager::can_allocate_loaded(const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt) const {
  check_loaded(n, loaded);
  const int64_t cached = can_allocate(tokens, n, salt);
  if (cached < 0) return cached;
  return std::max(cached, rows_ && loaded > 0 ? loadable(tokens, n, loaded, salt) : loaded);
}

int64_t KvManager::allocate_loaded(int64_t seq_id, const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt) {
  check_loaded(n, loaded);
  if (rows_ && loaded > 0) loaded = loadable(tokens, n, loaded, salt);
  const int64_t cached = allocate(seq_id, tokens, n, salt);
  if (cached < 0 || loaded <= cached) return cached;
  Sequence& s = seq(seq_id);
  const int64_t pending = rows_ ? rows_->pending_copies() : 0;
  apply_ensure(s, loaded - cached);
  if (rows_) load_moves_ += std::max<int64_t>(0, rows_->pending_copies() - pending);
  // The tier objects carry the SWA rows of the window - 1 positions before
  // `loaded` (what the next chunk reads), not the rest of their pages.
  s.write_lo = std::max(s.write_lo, transfer_swa_begin(loaded));
  if (swa_ && s.write_lo > s.num_computed) s.swa_written_lo = s.write_lo;
  s.num_computed = loaded;
  free_out_of_window(s, loaded);
  s.ensured = 0;
  return loaded;
}

// Row space: the most of `loaded` whose units the step's copy list has room
// to bind in its loads' share (each bind may move units), so admission never
// overflows it and the step's chunks keep their share; the rest stays prompt.
int64_t KvManager::loadable(const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt) const {
  const int64_t bs = serve_.block_size;
  const int64_t hit = admission(tokens, n, salt).cached_blocks * bs;
  const int64_t tail_units = swa_ ? ceil_div(serve_.window - 1, page_) + 1 : 0;
  const int64_t free_copies = rows_->max_copies() - decode_copy_share(serve_, pools_) - rows_->pending_copies();
  const int64_t room = std::min(prefill_copy_share(serve_, pools_) - load_moves_, free_copies);
  const int64_t room_units = room / moves_per_bind(pools_);
  const int64_t blocks = std::max<int64_t>(0, std::min((loaded - hit) / bs, room_units - tail_units));
  return blocks > 0 ? hit + blocks * bs : 0;
}

void KvManager::set_whole_chunks(bool on) {
  const int64_t more = std::max(on ? whole_chunk_pages_ : 0, extra_pages_) - chunk_reserve(extra_pages_);
  require<OutOfSlots>(more <= 0 || capacity_ok(more, 0), "set_whole_chunks: no room for the ", whole_chunk_pages_,
                      " SWA pages whole chunks keep apart (for a step of max_num_batched_tokens ",
                      serve_.max_num_batched_tokens, "): the live sequences' promises hold it (turn it on before "
                      "admitting, or once they have finished), or the pools are smaller; nothing changed");
  whole_chunks_ = on;
  swa_reserved_ += more;
}

void KvManager::require_no_pending_copies(const char* what) const {
  require<StateError>(!rows_ || rows_->pending_copies() == 0, what, ": the row space has ",
                      rows_ ? rows_->pending_copies() : 0,
                      " row copies not yet taken; take and apply the step's row copies first (the units they move "
                      "are not in their new rows yet)");
}

void KvManager::locate_blocks(const CacheKey* hashes, const int32_t* tokens, int64_t n, int32_t* out) const {
  require_no_pending_copies("locate_blocks");
  const int64_t tables = serve_.num_phys_tables(), bs = serve_.block_size;
  for (int64_t i = 0; i < n; ++i) {
    int32_t* row = out + i * (1 + tables);
    const int64_t id = logical_.lookup(hashes[i], tokens + i * bs);
    // A block whose content is not in rows yet (a reserved envelope) has no hash, so it is never found here.
    row[0] = static_cast<int32_t>(id);
    for (int64_t t = 0; t < tables; ++t) row[1 + t] = id < 0 ? -1 : phys_of(t, static_cast<int32_t>(id));
  }
}

void KvManager::locate_pages(const CacheKey* hashes, const int32_t* tokens, int64_t n, int32_t* out) const {
  require_no_pending_copies("locate_pages");
  for (int64_t i = 0; i < n; ++i)
    out[i] = swa_ ? unit_of(static_cast<int32_t>(swa_->lookup(hashes[i], tokens + i * page_))) : -1;
}

}  // namespace ukv
