// BlockContents: what a content-addressed block pool knows about each block's
// content — its hash, its tokens (the collision guard), and the map from hash
// to the block the cache serves for it. Shared by the logical (compress) blocks
// and the SWA blocks; reference counts and free lists stay with each pool.
//
// A block may keep its hash after the map moved on to another block with the
// same content (lazy eviction): forget() reports whether the map still pointed
// at it, i.e. whether the cache just lost an entry. Every change of the map
// is recorded in the manager's KV event log (Stored / Removed with this
// pool's role); clear() records nothing, the manager records one AllCleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "core/config/state_io.h"
#include "core/hashing/cache_key.h"
#include "core/manager/kv_events.h"

namespace ukv {

class BlockContents {
 public:
  BlockContents(int64_t num_blocks, int64_t block_size, KvRole role, KvEventLog* events);

  bool has_hash(int64_t id) const { return has_hash_[static_cast<size_t>(id)] != 0; }
  const CacheKey& hash(int64_t id) const { return hash_[static_cast<size_t>(id)]; }
  const int32_t* tokens(int64_t id) const { return &tokens_[static_cast<size_t>(id * block_size_)]; }

  // The block the cache serves for this hash, if it holds exactly these tokens; else -1.
  int64_t lookup(const CacheKey& hash, const int32_t* tokens) const;
  // parent: the event's parent hash (has_parent false for a chain's block 0);
  // salt: the publishing request's salt, for the event.
  void publish(int64_t id, const CacheKey& hash, const int32_t* tokens, bool has_parent, const CacheKey& parent,
               uint64_t salt);
  // Drops the block's content (a Removed event when the cache map pointed at it).
  void forget(int64_t id);
  // Drops the whole map, and the content of every block with is_free(id).
  void clear(const std::function<bool(int64_t)>& is_free);

  // Throws StateError naming `what` when a map entry is stale.
  void check_invariants(const char* what) const;
  // Per block: has_hash, hash and (when hashed) the tokens; then the map, sorted.
  void write_block(StateWriter& w, int64_t id) const;
  void read_block(StateReader& r, int64_t id);
  void write_map(StateWriter& w) const;
  void read_map(StateReader& r, const char* what);

 private:
  int64_t num_blocks_, block_size_;
  KvRole role_;
  KvEventLog* events_;
  std::vector<uint8_t> has_hash_;
  std::vector<CacheKey> hash_;
  std::vector<int32_t> tokens_;  // block_size tokens per block, valid while hashed
  std::unordered_map<CacheKey, int32_t, CacheKeyHasher> by_hash_;
};

}  // namespace ukv
