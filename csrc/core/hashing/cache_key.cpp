#include "core/hashing/cache_key.h"

#include "core/common/errors.h"

namespace ukv {

const char* prefix_hash_name(PrefixHash kind) {
  switch (kind) {
    case PrefixHash::Xxh64: return "xxh64";
    case PrefixHash::Sha256: return "sha256";
    case PrefixHash::Blake2b: return "blake2b";
  }
  return "unknown";
}

PrefixHash parse_prefix_hash(const std::string& name, const char* arg) {
  for (PrefixHash kind : {PrefixHash::Xxh64, PrefixHash::Sha256, PrefixHash::Blake2b})
    if (name == prefix_hash_name(kind)) return kind;
  throw InvalidArgument(std::string(arg) + " must be one of xxh64, sha256, blake2b, got '" + name + "'");
}

std::vector<int64_t> keys_to_words(const CacheKey* keys, size_t n, PrefixHash kind) {
  std::vector<int64_t> out;
  out.reserve(n * key_words(kind));
  for (size_t i = 0; i < n; ++i) {
    out.push_back(static_cast<int64_t>(keys[i].lo));
    if (key_words(kind) == 2) out.push_back(static_cast<int64_t>(keys[i].hi));
  }
  return out;
}

std::vector<CacheKey> keys_from_words(const int64_t* words, size_t count, PrefixHash kind, const char* arg) {
  const size_t w = key_words(kind);
  require(count % w == 0, arg, " must hold ", w, " int64 words per ", prefix_hash_name(kind), " key, got ", count,
          " words");
  std::vector<CacheKey> out(count / w);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].lo = static_cast<uint64_t>(words[i * w]);
    if (w == 2) out[i].hi = static_cast<uint64_t>(words[i * w + 1]);
  }
  return out;
}

}  // namespace ukv
