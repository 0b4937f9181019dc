// Shared validation for the all-or-nothing batch frees of the pools.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/common/errors.h"

namespace ukv {

// Throws StateError when an id occurs twice in ids[0, n): freeing it twice in
// one batch would be a double free.
inline void require_distinct(const int64_t* ids, size_t n, const char* what) {
  std::vector<int64_t> sorted(ids, ids + n);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  require<StateError>(dup == sorted.end(), what, ": id ", dup == sorted.end() ? 0 : *dup,
                      " appears twice in the batch (double free)");
}

inline void require_batch_size(int64_t n, const char* what) {
  require(n >= 0, what, ": n must be >= 0, got ", n);
}

}  // namespace ukv
