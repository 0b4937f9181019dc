#include "core/manager/block_hash.h"

#include <algorithm>
#include <vector>

#include "core/hashing/blake2b.h"
#include "core/hashing/byte_order.h"
#include "core/hashing/sha256.h"
#include "core/hashing/xxh64.h"

namespace ukv {
namespace {

// Appends a key's key_bytes(kind) bytes.
unsigned char* put_key(unsigned char* p, const CacheKey& k, PrefixHash kind) {
  store64_le(p, k.lo);
  if (kind == PrefixHash::Xxh64) return p + 8;
  store64_le(p + 8, k.hi);
  return p + 16;
}

// The key of a strong hash over these bytes: its first 16 bytes.
CacheKey strong_key(PrefixHash kind, const unsigned char* data, size_t len) {
  unsigned char d[16];
  if (kind == PrefixHash::Sha256) {
    const auto full = sha256(data, len);
    std::copy(full.begin(), full.begin() + 16, d);
  } else {
    blake2b(data, len, d, sizeof d);
  }
  return {load64_le(d), load64_le(d + 8)};
}

}  // namespace

CacheKey block_hash(PrefixHash kind, const int32_t* tokens, size_t n, const CacheKey* parent, uint64_t salt) {
  // Serialise to the documented byte layout; thread_local keeps it allocation-free.
  thread_local std::vector<unsigned char> buf;
  buf.resize(8 * n + 16);
  unsigned char* p = buf.data();
  const bool xxh = kind == PrefixHash::Xxh64;
  if (parent != nullptr) {
    p = put_key(p, *parent, kind);
  } else if (!xxh && salt != 0) {
    store64_le(p, salt);
    p += 8;
  }
  for (size_t i = 0; i < n; ++i, p += 8) store64_le(p, static_cast<uint64_t>(int64_t{tokens[i]}));
  const auto len = static_cast<size_t>(p - buf.data());
  if (xxh) return {xxh64(buf.data(), len, parent != nullptr ? 0 : salt), 0};
  return strong_key(kind, buf.data(), len);
}

CacheKey swa_page_hash(PrefixHash kind, const CacheKey& block_hash, int64_t page_in_block, int64_t pages_per_block) {
  if (pages_per_block == 1) return block_hash;
  if (kind != PrefixHash::Xxh64) {
    unsigned char buf[24];
    store64_le(put_key(buf, block_hash, kind), static_cast<uint64_t>(page_in_block));
    return strong_key(kind, buf, sizeof buf);
  }
  uint64_t h = block_hash.lo ^ (static_cast<uint64_t>(page_in_block + 1) * 0x9E3779B97F4A7C15ull);
  h = (h ^ (h >> 33)) * 0xFF51AFD7ED558CCDull;
  h = (h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return {h ^ (h >> 33), 0};
}

}  // namespace ukv
