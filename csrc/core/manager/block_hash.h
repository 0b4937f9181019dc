// Content hashes of KV blocks for the prefix cache (keys: core/hashing/cache_key.h).
//
// Every hash chains over the same bytes: h_i = H(prefix_bytes ++
// token_bytes(block i)), where token_bytes are the block's token ids as
// 8-byte little-endian integers and prefix_bytes is the parent's key (its
// key_bytes: 8 for XXH64, 16 otherwise) for a chained block.
//
// XXH64 (the default) is the upstream engine's chain (xxh64, seed 0, over a
// numpy int64 array), so block hashes in KV events match what
// upstream-compatible cache routers compute. A request's salt (cache
// isolation between tenants or adapters; 0 = none) seeds block 0's XXH64.
//
// SHA-256 and BLAKE2b keys are the first 16 bytes of SHA-256, and BLAKE2b
// with a 16-byte digest, over the same bytes; a salt is the prefix_bytes of
// block 0 (8 bytes little-endian), as they take no seed.
//
// Either way every later block inherits the salt through its parent, so
// salted chains share no block with other salts; and block 0 hashes 8*n (or
// 8*n + 8 salted) bytes while a chained block hashes more, so no salt can be
// chosen to make block 0 collide with a block further down some chain.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hashing/cache_key.h"

namespace ukv {

// The key of one block given its parent's (nullptr for block 0, which the
// salt seeds; a chained block ignores the salt).
CacheKey block_hash(PrefixHash kind, const int32_t* tokens, size_t n, const CacheKey* parent, uint64_t salt = 0);

// The SWA prefix cache's key for page `page_in_block` of a block whose key is
// block_hash, when a block holds pages_per_block SWA pages: the block's key
// itself with one page per block (the block key already covers the whole
// prefix up to the block's end), else the page's index mixed in: XXH64 keys
// by a 64-bit finaliser, the others by hashing the block key's 16 bytes
// followed by the index as 8 bytes little-endian.
CacheKey swa_page_hash(PrefixHash kind, const CacheKey& block_hash, int64_t page_in_block, int64_t pages_per_block);

}  // namespace ukv
