// Content hashes of KV blocks for the prefix cache.
//
// h_i = XXH64(prefix_bytes(h_{i-1}) ++ token_bytes(block i), seed 0), where
// prefix_bytes is h_{i-1} as 8 little-endian bytes (absent for block 0) and
// token_bytes are the block's token ids as 8-byte little-endian integers. This
// is the upstream engine's chain (xxh64 over a numpy int64 array), so block
// hashes in KV events match what upstream-compatible cache routers compute.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukv {

// XXH64 of a byte string (the public xxHash 64-bit algorithm).
uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0);

// Hash of one block given its parent's hash (has_parent = false for block 0).
uint64_t block_hash(const int32_t* tokens, size_t n, bool has_parent, uint64_t parent);

}  // namespace ukv
