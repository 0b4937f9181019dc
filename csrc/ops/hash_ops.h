// The prefix cache's keys as dispatcher ops (no tensors), so that a cache
// router computes from token ids exactly the hashes the manager's KV events
// carry (core/manager/block_hash.h defines them).
#pragma once

#include <cstdint>
#include <vector>

namespace ukv::ops {

// The chained hashes of the full blocks of `tokens` (a partial last block has
// none), block 0 seeded by the salt.
std::vector<int64_t> block_hashes(std::vector<int64_t> tokens, int64_t block_size, int64_t salt);
// The SWA page keys of those blocks: pages_per_block per block, in order.
std::vector<int64_t> swa_page_hashes(std::vector<int64_t> block_hashes, int64_t pages_per_block);

}  // namespace ukv::ops
