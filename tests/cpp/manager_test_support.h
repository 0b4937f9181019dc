// What the KvManager tests of sequences moving in and out of a manager (tier
// loads, transfers) share: a small configuration and deterministic tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/serve_config.h"

namespace ukv::testing_support {

constexpr int64_t kBs = 128;

// Blocks of 128 tokens, a 128-token window, 8 sequences of up to 16 blocks.
inline ServeConfig small_config(KvLayout layout) {
  ServeConfig c;
  c.block_size = kBs;
  c.window = 128;
  c.layout = layout;
  c.max_num_seqs = 8;
  c.max_blocks_per_seq = 16;
  return c;
}

// n tokens that differ from seed to seed and position to position.
inline std::vector<int32_t> tokens(int64_t n, int32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(seed * 100003 + i);
  return t;
}

}  // namespace ukv::testing_support
