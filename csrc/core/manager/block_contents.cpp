#include "core/manager/block_contents.h"

#include <algorithm>
#include <cstring>

#include "core/common/errors.h"

namespace ukv {

BlockContents::BlockContents(int64_t num_blocks, int64_t block_size, KvRole role, KvEventLog* events)
    : num_blocks_(num_blocks), block_size_(block_size), role_(role), events_(events), has_hash_(static_cast<size_t>(num_blocks), 0),
      hash_(static_cast<size_t>(num_blocks)), tokens_(static_cast<size_t>(num_blocks * block_size), 0) {}

int64_t BlockContents::lookup(const CacheKey& hash, const int32_t* tokens) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int64_t id = it->second;
  // A hash collision must never alias content: compare the tokens.
  return std::memcmp(this->tokens(id), tokens, sizeof(int32_t) * static_cast<size_t>(block_size_)) == 0 ? id : -1;
}

void BlockContents::publish(int64_t id, const CacheKey& hash, const int32_t* tokens, bool has_parent,
                            const CacheKey& parent, uint64_t salt) {
  const auto i = static_cast<size_t>(id);
  std::memcpy(&tokens_[i * static_cast<size_t>(block_size_)], tokens,
              sizeof(int32_t) * static_cast<size_t>(block_size_));
  has_hash_[i] = 1;
  hash_[i] = hash;
  by_hash_[hash] = static_cast<int32_t>(id);
  events_->stored(role_, hash, has_parent, parent, tokens, block_size_, salt);
}

void BlockContents::forget(int64_t id) {
  auto& flag = has_hash_[static_cast<size_t>(id)];
  if (!flag) return;
  flag = 0;
  const CacheKey hash = hash_[static_cast<size_t>(id)];
  const auto it = by_hash_.find(hash);
  // The map may serve another block with this content now: the cache lost nothing.
  if (it == by_hash_.end() || it->second != id) return;
  by_hash_.erase(it);
  events_->removed(role_, hash);
}

void BlockContents::clear(const std::function<bool(int64_t)>& is_free) {
  by_hash_.clear();
  for (int64_t id = 0; id < num_blocks_; ++id)
    if (is_free(id)) has_hash_[static_cast<size_t>(id)] = 0;
}

void BlockContents::check_invariants(const char* what) const {
  for (const auto& [h, id] : by_hash_)
    require<StateError>(has_hash_[static_cast<size_t>(id)] && hash_[static_cast<size_t>(id)] == h, what,
                        " hash map entry for block ", id, " is stale");
}

void BlockContents::write_block(StateWriter& w, int64_t id) const {
  const auto i = static_cast<size_t>(id);
  w.put(has_hash_[i]);
  write_key(w, hash_[i]);
  if (!has_hash_[i]) return;
  for (int64_t t = 0; t < block_size_; ++t) w.put(tokens_[i * static_cast<size_t>(block_size_) + static_cast<size_t>(t)]);
}

void BlockContents::read_block(StateReader& r, int64_t id) {
  const auto i = static_cast<size_t>(id);
  has_hash_[i] = static_cast<uint8_t>(r.flag("has_hash"));
  hash_[i] = read_key(r);
  if (!has_hash_[i]) return;
  for (int64_t t = 0; t < block_size_; ++t)
    tokens_[i * static_cast<size_t>(block_size_) + static_cast<size_t>(t)] = static_cast<int32_t>(r.next());
}

void BlockContents::write_map(StateWriter& w) const {
  std::vector<std::pair<CacheKey, int32_t>> entries(by_hash_.begin(), by_hash_.end());
  std::sort(entries.begin(), entries.end());  // a canonical order: equal states serialise equally
  w.put(static_cast<int64_t>(entries.size()));
  for (const auto& [h, id] : entries) {
    write_key(w, h);
    w.put(id);
  }
}

void BlockContents::read_map(StateReader& r, const char* what) {
  by_hash_.clear();
  const int64_t n = r.count(num_blocks_, "hash-map entry");
  for (int64_t j = 0; j < n; ++j) {
    const CacheKey h = read_key(r);
    const int64_t id = r.next();
    r.check(id >= 0 && id < num_blocks_, "bad ", what, " hash-map block ", id);
    by_hash_[h] = static_cast<int32_t>(id);
  }
}

}  // namespace ukv
