#include "core/config/serve_config.h"

#include <algorithm>

#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {

std::vector<int64_t> ServeConfig::compress_ks() const {
  std::vector<int64_t> ks;
  for (int64_t r : compress_ratios) ks.push_back(block_size / r);
  return ks;
}

int64_t ServeConfig::type_of_ratio(int64_t ratio) const {
  const auto it = std::find(compress_ratios.begin(), compress_ratios.end(), ratio);
  return it == compress_ratios.end() ? -1 : it - compress_ratios.begin();
}

void validate(const ServeConfig& c) {
  require(c.block_size > 0, "ServeConfig.block_size must be > 0, got ", c.block_size);
  require(c.block_size <= kMaxRows, "ServeConfig.block_size must be <= ", kMaxRows, ", got ", c.block_size);
  require(c.swa_page_tokens >= 0, "ServeConfig.swa_page_tokens must be >= 0 (0 = block_size), got ", c.swa_page_tokens);
  require(c.block_size % c.swa_page() == 0, "ServeConfig.swa_page_tokens ", c.swa_page_tokens,
          " must divide block_size ", c.block_size);
  require(c.row_space() || c.swa_page() == c.block_size, "ServeConfig.swa_page_tokens ", c.swa_page_tokens,
          " differs from block_size ", c.block_size, ": pages smaller than a block need layout='row_space'");
  require(c.window >= 0, "ServeConfig.window must be >= 0, got ", c.window);
  require(c.mtp_k >= 0, "ServeConfig.mtp_k must be >= 0, got ", c.mtp_k);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int64_t r = c.compress_ratios[i];
    require(r > 0 && c.block_size % r == 0, "ServeConfig.compress_ratios: each ratio must be > 0 and divide block_size ",
            c.block_size, ", got ", r);
    require(i == 0 || c.compress_ratios[i - 1] < r, "ServeConfig.compress_ratios must be ascending and distinct, got ",
            c.compress_ratios[i - 1], " before ", r);
    require(c.swa_page() % (c.block_size / r) == 0, "ServeConfig.swa_page_tokens ", c.swa_page(),
            " must be a multiple of every compress type's rows per block; ratio ", r, " has ", c.block_size / r);
  }
  require(c.max_num_seqs > 0, "ServeConfig.max_num_seqs must be > 0, got ", c.max_num_seqs);
  require(c.max_blocks_per_seq > 0, "ServeConfig.max_blocks_per_seq must be > 0, got ", c.max_blocks_per_seq);
  require(c.max_blocks_per_seq <= kMaxRows / c.block_size, "ServeConfig.max_blocks_per_seq ", c.max_blocks_per_seq,
          " x block_size ", c.block_size, " exceeds the int32 position range");
  require(c.max_num_batched_tokens > 0, "ServeConfig.max_num_batched_tokens must be > 0, got ",
          c.max_num_batched_tokens);
  require(c.retention_interval >= 0, "ServeConfig.retention_interval must be >= 0, got ", c.retention_interval);
  require(c.checkpoint_frac >= 0.0 && c.checkpoint_frac <= 1.0, "ServeConfig.checkpoint_frac must be in [0, 1], got ",
          c.checkpoint_frac);
  require(c.swa_budget_frac > 0.0 && c.swa_budget_frac < 1.0, "ServeConfig.swa_budget_frac must be in (0, 1), got ",
          c.swa_budget_frac);
}

}  // namespace ukv
