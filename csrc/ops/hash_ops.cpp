#include "ops/hash_ops.h"

#include <limits>

#include "core/manager/block_hash.h"
#include "ops/core_errors.h"

namespace ukv::ops {

std::vector<int64_t> block_hashes(std::vector<int64_t> tokens, int64_t block_size, int64_t salt) {
  return translate_core_errors([&] {
    require(block_size > 0, "block_size must be > 0, got ", block_size);
    std::vector<int32_t> toks;
    toks.reserve(tokens.size());
    for (int64_t t : tokens) {
      require(t >= 0 && t <= std::numeric_limits<int32_t>::max(), "tokens values must be in [0, 2^31 - 1], got ", t);
      toks.push_back(static_cast<int32_t>(t));
    }
    std::vector<int64_t> out;
    uint64_t parent = 0;
    for (size_t i = 0; (i + 1) * static_cast<size_t>(block_size) <= toks.size(); ++i) {
      parent = block_hash(toks.data() + i * static_cast<size_t>(block_size), static_cast<size_t>(block_size), i > 0,
                          parent, static_cast<uint64_t>(salt));
      out.push_back(static_cast<int64_t>(parent));
    }
    return out;
  });
}

std::vector<int64_t> swa_page_hashes(std::vector<int64_t> block_hashes, int64_t pages_per_block) {
  return translate_core_errors([&] {
    require(pages_per_block > 0, "pages_per_block must be > 0, got ", pages_per_block);
    std::vector<int64_t> out;
    out.reserve(block_hashes.size() * static_cast<size_t>(pages_per_block));
    for (int64_t h : block_hashes)
      for (int64_t j = 0; j < pages_per_block; ++j)
        out.push_back(static_cast<int64_t>(swa_page_hash(static_cast<uint64_t>(h), j, pages_per_block)));
    return out;
  });
}

}  // namespace ukv::ops
