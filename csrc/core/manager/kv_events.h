// KV cache events for external cache routers (prefix-aware load balancers):
// a block's content became reusable (Stored), stopped being reusable
// (Removed), or the whole prefix cache was dropped (AllCleared).
//
// Events are recorded only where the manager's cache map changes, i.e. for
// exactly the blocks a later request's lookup can hit, so replaying them in
// order reproduces what the cache serves. Each event has a sequence number
// that grows by one per event for the manager's whole life (it survives
// serialisation), so a router can tell a gap or a replay. Stored events keep
// the block's tokens in one flat buffer, so draining a step's events copies
// two arrays rather than a list per event.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/state_io.h"
#include "core/hashing/cache_key.h"

namespace ukv {

enum class KvEventKind : int64_t { Stored = 0, Removed = 1, AllCleared = 2 };

// Which cache the block belongs to: a compress (logical) block, shared by
// every CSA/HCA layer, or a sliding-window page. A hit needs both: the
// compress chain and the SWA pages of its trailing window.
enum class KvRole : int64_t { Compress = 0, Swa = 1 };

struct KvEvent {
  KvEventKind kind = KvEventKind::AllCleared;
  KvRole role = KvRole::Compress;  // Stored / Removed
  int64_t seq_no = 0;
  CacheKey hash;                   // Stored / Removed: the cache key
  // Stored: a compress block's parent in the chain (has_parent false for
  // block 0); an SWA page's containing block (always present).
  CacheKey parent_hash;
  bool has_parent = false;
  uint64_t salt = 0;               // Stored: the request's salt (0: none)
  int64_t token_begin = 0;         // Stored: [token_begin, +num_tokens) of the batch's token buffer
  int64_t num_tokens = 0;
};

struct KvEventBatch {
  std::vector<KvEvent> events;
  std::vector<int32_t> tokens;
};

class KvEventLog {
 public:
  void stored(KvRole role, const CacheKey& hash, bool has_parent, const CacheKey& parent, const int32_t* tokens,
              int64_t n, uint64_t salt);
  void removed(KvRole role, const CacheKey& hash);
  void all_cleared();
  // The events since the last call, in order; the sequence numbers go on.
  KvEventBatch take();
  int64_t next_seq_no() const { return next_seq_no_; }

  void write_state(StateWriter& w) const;
  void read_state(StateReader& r);

 private:
  KvEvent& push(KvEventKind kind, KvRole role);

  KvEventBatch pending_;
  int64_t next_seq_no_ = 0;
};

}  // namespace ukv
