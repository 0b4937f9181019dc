// An intrusive FIFO of slot ids over a fixed id range [0, capacity): O(1)
// push_back, pop_front, removal of an arbitrary member and membership test.
// The pools use it instead of upstream's deque + set with stale entries, so
// every operation is O(1), the order is deterministic, and there is no stale
// entry to skip (upstream's let a just-released slot jump the queue).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ukv {

class SlotList {
 public:
  explicit SlotList(int64_t capacity = 0)
      : prev_(static_cast<size_t>(capacity), kNone), next_(static_cast<size_t>(capacity), kNone),
        member_(static_cast<size_t>(capacity), 0) {}

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(int64_t id) const { return member_[static_cast<size_t>(id)] != 0; }
  int64_t front() const { return head_; }
  int64_t back() const { return tail_; }
  // Successor of a member, -1 after the last (front-to-back walks).
  int64_t next(int64_t id) const { return next_[static_cast<size_t>(id)]; }

  void push_back(int64_t id) {
    const auto i = static_cast<size_t>(id);
    member_[i] = 1;
    prev_[i] = static_cast<int32_t>(tail_);
    next_[i] = kNone;
    if (tail_ == kNone) head_ = id; else next_[static_cast<size_t>(tail_)] = static_cast<int32_t>(id);
    tail_ = id;
    ++size_;
  }

  int64_t pop_front() {
    const int64_t id = head_;
    erase(id);
    return id;
  }

  void erase(int64_t id) {
    const auto i = static_cast<size_t>(id);
    const int32_t p = prev_[i], n = next_[i];
    if (p == kNone) head_ = n; else next_[static_cast<size_t>(p)] = n;
    if (n == kNone) tail_ = p; else prev_[static_cast<size_t>(n)] = p;
    member_[i] = 0;
    --size_;
  }

  // Members front to back (serialization, tests).
  std::vector<int64_t> to_vector() const {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(size_));
    for (int64_t id = head_; id != kNone; id = next_[static_cast<size_t>(id)]) out.push_back(id);
    return out;
  }

 private:
  static constexpr int32_t kNone = -1;
  // int32 links: slot counts are bounded by the int32 row limit (sizing.h).
  std::vector<int32_t> prev_, next_;
  std::vector<uint8_t> member_;
  int64_t head_ = kNone, tail_ = kNone, size_ = 0;
};

}  // namespace ukv
