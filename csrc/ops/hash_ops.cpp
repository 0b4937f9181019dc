#include "ops/hash_ops.h"

#include <limits>

#include "core/manager/block_hash.h"
#include "ops/core_errors.h"

namespace ukv::ops {

std::vector<int64_t> block_hashes(std::vector<int64_t> tokens, int64_t block_size, int64_t salt,
                                  const std::string& prefix_hash) {
  return translate_core_errors([&] {
    const PrefixHash kind = parse_prefix_hash(prefix_hash, "prefix_hash");
    require(block_size > 0, "block_size must be > 0, got ", block_size);
    std::vector<int32_t> toks;
    toks.reserve(tokens.size());
    for (int64_t t : tokens) {
      require(t >= 0 && t <= std::numeric_limits<int32_t>::max(), "tokens values must be in [0, 2^31 - 1], got ", t);
      toks.push_back(static_cast<int32_t>(t));
    }
    std::vector<CacheKey> keys;
    for (size_t i = 0; (i + 1) * static_cast<size_t>(block_size) <= toks.size(); ++i)
      keys.push_back(block_hash(kind, toks.data() + i * static_cast<size_t>(block_size),
                                static_cast<size_t>(block_size), i > 0 ? &keys.back() : nullptr,
                                static_cast<uint64_t>(salt)));
    return keys_to_words(keys.data(), keys.size(), kind);
  });
}

std::vector<int64_t> swa_page_hashes(std::vector<int64_t> block_hashes, int64_t pages_per_block,
                                     const std::string& prefix_hash) {
  return translate_core_errors([&] {
    const PrefixHash kind = parse_prefix_hash(prefix_hash, "prefix_hash");
    require(pages_per_block > 0, "pages_per_block must be > 0, got ", pages_per_block);
    std::vector<CacheKey> pages;
    for (const CacheKey& h : keys_from_words(block_hashes.data(), block_hashes.size(), kind, "block_hashes"))
      for (int64_t j = 0; j < pages_per_block; ++j) pages.push_back(swa_page_hash(kind, h, j, pages_per_block));
    return keys_to_words(pages.data(), pages.size(), kind);
  });
}

}  // namespace ukv::ops
