// The prefix cache's keys as dispatcher ops (no tensors), so that a cache
// router computes from token ids exactly the hashes the manager's KV events
// carry (core/manager/block_hash.h defines them). A key crosses as its
// int64 words: one for xxh64, two (lo, hi) for sha256 and blake2b
// (core/hashing/cache_key.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ukv::ops {

// The chained keys of the full blocks of `tokens` (a partial last block has
// none), block 0 seeded by the salt.
std::vector<int64_t> block_hashes(std::vector<int64_t> tokens, int64_t block_size, int64_t salt,
                                  const std::string& prefix_hash);
// The SWA page keys of those blocks: pages_per_block per block, in order.
std::vector<int64_t> swa_page_hashes(std::vector<int64_t> block_hashes, int64_t pages_per_block,
                                     const std::string& prefix_hash);

}  // namespace ukv::ops
