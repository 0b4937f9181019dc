#include "core/logical_blocks.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"

namespace ukv {

LogicalBlocks::LogicalBlocks(int64_t num_blocks, int64_t block_size, int64_t num_types)
    : block_size_(block_size), ref_(static_cast<size_t>(num_blocks), 0),
      has_hash_(static_cast<size_t>(num_blocks), 0), hash_(static_cast<size_t>(num_blocks), 0),
      tokens_(static_cast<size_t>(num_blocks * block_size), 0),
      binding_(static_cast<size_t>(num_types), std::vector<int32_t>(static_cast<size_t>(num_blocks), -1)),
      free_(num_blocks) {
  for (int64_t b = 0; b < num_blocks; ++b) free_.push_back(b);
}

int64_t LogicalBlocks::lookup(uint64_t hash, const int32_t* tokens) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int64_t id = it->second;
  // A hash collision must never alias content: compare the tokens.
  return std::memcmp(this->tokens(id), tokens, sizeof(int32_t) * static_cast<size_t>(block_size_)) == 0 ? id : -1;
}

void LogicalBlocks::claim(int64_t id) {
  if (free_.contains(id)) free_.erase(id);
  ++ref_[static_cast<size_t>(id)];
}

void LogicalBlocks::forget(int64_t id, std::vector<KvEvent>& events) {
  auto& flag = has_hash_[static_cast<size_t>(id)];
  if (!flag) return;
  const auto it = by_hash_.find(hash_[static_cast<size_t>(id)]);
  if (it != by_hash_.end() && it->second == id) {
    by_hash_.erase(it);
    events.push_back({KvEventKind::Removed, hash_[static_cast<size_t>(id)]});
  }
  flag = 0;
}

int64_t LogicalBlocks::pop(std::vector<KvEvent>& events) {
  require<StateError>(!free_.empty(), "No free blocks available");
  const int64_t id = free_.pop_front();
  forget(id, events);
  ref_[static_cast<size_t>(id)] = 1;
  return id;
}

bool LogicalBlocks::release(int64_t id) {
  auto& r = ref_[static_cast<size_t>(id)];
  require<StateError>(r > 0, "logical block ", id, " released with ref 0");
  if (--r > 0) return false;
  free_.push_back(id);
  return true;
}

void LogicalBlocks::publish(int64_t id, uint64_t hash, const int32_t* tokens, bool has_parent, uint64_t parent,
                            std::vector<KvEvent>& events) {
  const auto i = static_cast<size_t>(id);
  std::memcpy(&tokens_[i * static_cast<size_t>(block_size_)], tokens, sizeof(int32_t) * static_cast<size_t>(block_size_));
  has_hash_[i] = 1;
  hash_[i] = hash;
  by_hash_[hash] = static_cast<int32_t>(id);
  events.push_back({KvEventKind::Stored, hash, parent, has_parent});
}

void LogicalBlocks::drop_hash(int64_t id, std::vector<KvEvent>& events) { forget(id, events); }

void LogicalBlocks::clear_cache(std::vector<KvEvent>& events) {
  by_hash_.clear();
  for (int64_t id = 0; id < num_blocks(); ++id)
    if (ref_[static_cast<size_t>(id)] == 0) has_hash_[static_cast<size_t>(id)] = 0;
  events.push_back({KvEventKind::AllCleared});
}

void LogicalBlocks::check_invariants() const {
  for (int64_t id = 0; id < num_blocks(); ++id) {
    const auto i = static_cast<size_t>(id);
    require<StateError>(ref_[i] >= 0, "logical block ", id, " has negative ref");
    require<StateError>((ref_[i] == 0) == free_.contains(id), "logical block ", id, " free-list membership");
    if (!binding_.empty()) {
      const bool bound = binding_[0][i] >= 0;
      for (const auto& b : binding_)
        require<StateError>((b[i] >= 0) == bound, "logical block ", id, " is bound in some types only");
      require<StateError>(bound || ref_[i] == 0, "live logical block ", id, " has no physical binding");
    }
  }
  for (const auto& [h, id] : by_hash_)
    require<StateError>(has_hash_[static_cast<size_t>(id)] && hash_[static_cast<size_t>(id)] == h,
                        "hash map entry for block ", id, " is stale");
}

void LogicalBlocks::append_state(std::vector<int64_t>& st) const {
  st.push_back(num_blocks());
  for (int64_t id = 0; id < num_blocks(); ++id) {
    const auto i = static_cast<size_t>(id);
    st.insert(st.end(), {ref_[i], has_hash_[i], static_cast<int64_t>(hash_[i])});
    for (const auto& b : binding_) st.push_back(b[i]);
    if (has_hash_[i])
      st.insert(st.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(block_size_)),
                tokens_.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<size_t>(block_size_)));
  }
  const auto order = free_.to_vector();
  st.push_back(static_cast<int64_t>(order.size()));
  st.insert(st.end(), order.begin(), order.end());
  std::vector<std::pair<uint64_t, int32_t>> entries(by_hash_.begin(), by_hash_.end());
  std::sort(entries.begin(), entries.end());  // a canonical order: equal states serialise equally
  st.push_back(static_cast<int64_t>(entries.size()));
  for (const auto& [h, id] : entries) st.insert(st.end(), {static_cast<int64_t>(h), id});
}

void LogicalBlocks::load_state(const std::vector<int64_t>& st, size_t& pos) {
  auto next = [&]() -> int64_t {
    require(pos < st.size(), "KvManager state is truncated (logical blocks)");
    return st[pos++];
  };
  require(next() == num_blocks(), "KvManager state: logical block count differs from the configuration");
  for (int64_t id = 0; id < num_blocks(); ++id) {
    const auto i = static_cast<size_t>(id);
    ref_[i] = static_cast<int32_t>(next());
    has_hash_[i] = static_cast<uint8_t>(next() != 0);
    hash_[i] = static_cast<uint64_t>(next());
    for (auto& b : binding_) b[i] = static_cast<int32_t>(next());
    if (has_hash_[i])
      for (int64_t t = 0; t < block_size_; ++t) tokens_[i * static_cast<size_t>(block_size_) + static_cast<size_t>(t)] = static_cast<int32_t>(next());
  }
  free_ = SlotList(num_blocks());
  const int64_t nfree = next();
  for (int64_t j = 0; j < nfree; ++j) {
    const int64_t id = next();
    require(id >= 0 && id < num_blocks() && !free_.contains(id), "KvManager state: bad free block ", id);
    free_.push_back(id);
  }
  by_hash_.clear();
  const int64_t nmap = next();
  for (int64_t j = 0; j < nmap; ++j) {
    const auto h = static_cast<uint64_t>(next());
    const int64_t id = next();
    require(id >= 0 && id < num_blocks(), "KvManager state: bad hash-map block ", id);
    by_hash_[h] = static_cast<int32_t>(id);
  }
}

}  // namespace ukv
