// The one serialised form of every core object (pickles of the torch classes,
// the encoded configuration and plan records): a flat int64 vector.
//
// A top-level state starts with a header {kStateMagic, kind, kStateVersion},
// so a state of another kind, of another format version, or from a build
// that wrote no header is refused with a message saying which, instead of
// being misread. Components write into the same vector without headers of
// their own, in a fixed order; StateReader checks every count against a
// limit before it sizes anything from it, and finish() refuses leftovers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/common/errors.h"

namespace ukv {

// "UKVS" in the high half: no state written before the header existed
// starts with a value this large (they start with a size or a flag).
constexpr int64_t kStateMagic = int64_t{0x554B5653} << 32;
// Bumped whenever any component's layout changes.
constexpr int64_t kStateVersion = 5;

enum class StateKind : int64_t { TypePool = 1, Coordinator = 2, KvManager = 3, ServeConfig = 4, PoolSizes = 5,
                                 ModelKvSpec = 6, KvPlan = 7 };

const char* state_kind_name(StateKind kind);

class StateWriter {
 public:
  explicit StateWriter(std::vector<int64_t>& out) : out_(out) {}

  void put(int64_t v) { out_.push_back(v); }
  void put_real(double v) {
    int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    out_.push_back(bits);
  }
  // A length, then the values.
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    out_.push_back(static_cast<int64_t>(v.size()));
    for (const T& x : v) out_.push_back(static_cast<int64_t>(x));
  }

 private:
  std::vector<int64_t>& out_;
};

class StateReader {
 public:
  // `what` names the object in every error ("KvManager state: ...").
  StateReader(const std::vector<int64_t>& state, std::string what) : st_(state), what_(std::move(what)) {}

  int64_t next() {
    require(pos_ < st_.size(), what_, " is truncated");
    return st_[pos_++];
  }
  double real() {
    const int64_t bits = next();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  bool flag(const char* name) {
    const int64_t v = next();
    check(v == 0 || v == 1, "bad ", name, " flag ", v);
    return v != 0;
  }
  // A value in [lo, hi].
  int64_t in_range(int64_t lo, int64_t hi, const char* name) {
    const int64_t v = next();
    check(v >= lo && v <= hi, "bad ", name, " ", v);
    return v;
  }
  // A count in [0, limit] of items that each take at least one value: read
  // before anything is sized from it, so no count can make a huge allocation.
  int64_t count(int64_t limit, const char* name) {
    const int64_t n = next();
    check(n >= 0 && n <= limit && static_cast<uint64_t>(n) <= st_.size() - pos_, "bad ", name, " count ", n);
    return n;
  }
  template <typename T>
  std::vector<T> vec(int64_t limit, const char* name) {
    const int64_t n = count(limit, name);
    std::vector<T> v;
    v.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<T>(next()));
    return v;
  }
  // Fails with "<what>: <message>" unless ok.
  template <typename... Args>
  void check(bool ok, Args&&... args) const {
    require(ok, what_, ": ", std::forward<Args>(args)...);
  }
  void finish() const { require(pos_ == st_.size(), what_, " has ", st_.size() - pos_, " trailing values"); }
  const std::string& what() const { return what_; }

 private:
  const std::vector<int64_t>& st_;
  std::string what_;
  size_t pos_ = 0;
};

// Writes the header of a top-level state of this kind.
void begin_state(StateWriter& w, StateKind kind);
// A reader positioned after the header; refuses a missing or foreign header
// and other format versions, naming what was found.
StateReader open_state(const std::vector<int64_t>& state, StateKind kind);

}  // namespace ukv
