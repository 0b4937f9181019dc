// Content hashes of KV blocks for the prefix cache.
//
// h_i = XXH64(prefix_bytes(h_{i-1}) ++ token_bytes(block i), seed 0), where
// prefix_bytes is h_{i-1} as 8 little-endian bytes (absent for block 0) and
// token_bytes are the block's token ids as 8-byte little-endian integers. This
// is the upstream engine's chain (xxh64 over a numpy int64 array), so block
// hashes in KV events match what upstream-compatible cache routers compute.
//
// A request's salt (cache isolation between tenants or adapters; 0 = none)
// seeds block 0's XXH64 instead of 0, and every later block inherits it
// through its parent, so salted chains share no block with other salts. A
// salted block 0 hashes 8*n bytes and a chained block 8*(n+1), so no salt can
// be chosen to make block 0 collide with a block further down some chain.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukv {

// XXH64 of a byte string (the public xxHash 64-bit algorithm).
uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0);

// Hash of one block given its parent's hash (has_parent = false for block 0,
// whose hash the salt seeds; a chained block ignores it).
uint64_t block_hash(const int32_t* tokens, size_t n, bool has_parent, uint64_t parent, uint64_t salt = 0);

// The SWA prefix cache's key for page `page_in_block` of a block whose hash is
// block_hash, when a block holds pages_per_block SWA pages: the block hash
// itself with one page per block, else the block hash with the page's index
// mixed in by a 64-bit finaliser (the block hash already covers the whole
// prefix up to the block's end).
uint64_t swa_page_hash(uint64_t block_hash, int64_t page_in_block, int64_t pages_per_block);

}  // namespace ukv
