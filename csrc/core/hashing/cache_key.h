// The prefix cache's key: a block's (or SWA page's) hash, up to 128 bits.
//
// Which hash makes the keys is ServeConfig.prefix_hash: XXH64 (64 bits, the
// default, what upstream-compatible routers compute) or a cryptographic one,
// SHA-256 or BLAKE2b, truncated to 128 bits (so that no one can make two
// prefixes collide on purpose). A key keeps its digest's bytes as two
// little-endian words: bytes [0, 8) in lo, [8, 16) in hi. An XXH64 key is
// its value in lo, with hi 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config/state_io.h"

namespace ukv {

enum class PrefixHash : int64_t { Xxh64 = 0, Sha256 = 1, Blake2b = 2 };

struct CacheKey {
  uint64_t lo = 0, hi = 0;

  friend bool operator==(const CacheKey& a, const CacheKey& b) { return a.lo == b.lo && a.hi == b.hi; }
  friend bool operator!=(const CacheKey& a, const CacheKey& b) { return !(a == b); }
  friend bool operator<(const CacheKey& a, const CacheKey& b) { return a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi; }
};

// "xxh64", "sha256" or "blake2b": ServeConfig.prefix_hash's values.
const char* prefix_hash_name(PrefixHash kind);
// The hash of that name; InvalidArgument naming `arg` for any other.
PrefixHash parse_prefix_hash(const std::string& name, const char* arg);

// Bytes of a key of this hash: 8 (XXH64) or 16.
inline size_t key_bytes(PrefixHash kind) { return kind == PrefixHash::Xxh64 ? 8 : 16; }
// 64-bit words of a key of this hash, as the ops and the torch class carry it: 1 or 2.
inline size_t key_words(PrefixHash kind) { return key_bytes(kind) / 8; }

// Keys as the ops and the torch class carry them: key_words(kind) int64 words
// each (the unsigned bits), lo first. A word count that is not a multiple of
// key_words(kind) is an InvalidArgument naming `arg`.
std::vector<int64_t> keys_to_words(const CacheKey* keys, size_t n, PrefixHash kind);
std::vector<CacheKey> keys_from_words(const int64_t* words, size_t count, PrefixHash kind, const char* arg);

// For unordered maps: the words are hash output already, so mixing them is enough.
struct CacheKeyHasher {
  size_t operator()(const CacheKey& k) const { return std::hash<uint64_t>()(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ULL)); }
};

// A key in a state: its two words.
inline void write_key(StateWriter& w, const CacheKey& k) {
  w.put(static_cast<int64_t>(k.lo));
  w.put(static_cast<int64_t>(k.hi));
}
inline CacheKey read_key(StateReader& r) {
  CacheKey k;
  k.lo = static_cast<uint64_t>(r.next());
  k.hi = static_cast<uint64_t>(r.next());
  return k;
}

}  // namespace ukv
