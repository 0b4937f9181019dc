#include "core/manager/logical_blocks.h"

#include "core/common/errors.h"

namespace ukv {

LogicalBlocks::LogicalBlocks(int64_t num_blocks, int64_t block_size, int64_t num_types, KvEventLog* events)
    : ref_(static_cast<size_t>(num_blocks), 0), contents_(num_blocks, block_size, KvRole::Compress, events),
      binding_(static_cast<size_t>(num_types), std::vector<int32_t>(static_cast<size_t>(num_blocks), -1)),
      free_(num_blocks) {
  for (int64_t b = 0; b < num_blocks; ++b) free_.push_back(b);
}

void LogicalBlocks::claim(int64_t id) {
  if (free_.contains(id)) free_.erase(id);
  ++ref_[static_cast<size_t>(id)];
}

void LogicalBlocks::take(int64_t id) {
  require<StateError>(free_.contains(id), "internal: logical block ", id, " taken while not free");
  free_.erase(id);
  contents_.forget(id);
  ref_[static_cast<size_t>(id)] = 1;
}

bool LogicalBlocks::release(int64_t id) {
  auto& r = ref_[static_cast<size_t>(id)];
  require<StateError>(r > 0, "logical block ", id, " released with ref 0");
  if (--r > 0) return false;
  free_.push_back(id);
  return true;
}

void LogicalBlocks::clear_cache() {
  contents_.clear([this](int64_t id) { return ref_[static_cast<size_t>(id)] == 0; });
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
  contents_.check_invariants("logical");
}

void LogicalBlocks::write_state(StateWriter& w) const {
  w.put(num_blocks());
  for (int64_t id = 0; id < num_blocks(); ++id) {
    w.put(ref_[static_cast<size_t>(id)]);
    for (const auto& b : binding_) w.put(b[static_cast<size_t>(id)]);
    contents_.write_block(w, id);
  }
  w.put_vec(free_.to_vector());
  contents_.write_map(w);
}

void LogicalBlocks::read_state(StateReader& r) {
  r.check(r.next() == num_blocks(), "the logical block count differs from the configuration");
  for (int64_t id = 0; id < num_blocks(); ++id) {
    ref_[static_cast<size_t>(id)] = static_cast<int32_t>(r.in_range(0, INT32_MAX, "logical block ref"));
    for (auto& b : binding_) b[static_cast<size_t>(id)] = static_cast<int32_t>(r.in_range(-1, INT32_MAX, "binding"));
    contents_.read_block(r, id);
  }
  free_ = SlotList(num_blocks());
  for (int64_t id : r.vec<int64_t>(num_blocks(), "free logical block")) {
    r.check(id >= 0 && id < num_blocks() && !free_.contains(id), "bad free block ", id);
    free_.push_back(id);
  }
  contents_.read_map(r, "logical");
}

}  // namespace ukv
