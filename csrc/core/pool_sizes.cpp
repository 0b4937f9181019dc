#include "core/pool_sizes.h"

#include "core/errors.h"
#include "core/sizing.h"

namespace ukv {

void validate(const PoolSizes& p) {
  require(p.num_logical_blocks >= 0, "PoolSizes.num_logical_blocks must be >= 0, got ", p.num_logical_blocks);
  require(p.num_logical_blocks <= kMaxRows, "PoolSizes.num_logical_blocks ", p.num_logical_blocks,
          " exceeds the int32 id limit ", kMaxRows);
  require(p.num_swa_blocks >= 0, "PoolSizes.num_swa_blocks must be >= 0, got ", p.num_swa_blocks);
  for (int64_t s : p.type_slots) require(s >= 0, "PoolSizes.type_slots must be >= 0, got ", s);
}

std::vector<int64_t> resolved_type_slots(const ServeConfig& c, const PoolSizes& p) {
  if (!c.unified() || !p.type_slots.empty()) return p.type_slots;
  return slot_counts(p.num_swa_blocks, p.num_logical_blocks, c.compress_ks(), c.block_size);
}

void validate(const ServeConfig& c, const PoolSizes& p) {
  validate(c);
  validate(p);
  require((c.window > 0) == (p.num_swa_blocks > 0), "ServeConfig.window (", c.window, ") and PoolSizes.num_swa_blocks (",
          p.num_swa_blocks, ") must both be > 0 (a sliding-window model) or both be 0 (no SWA pool)");
  require(p.num_swa_blocks <= kMaxRows / c.block_size, "PoolSizes.num_swa_blocks ", p.num_swa_blocks, " x block_size ",
          c.block_size, " exceeds the int32 row limit ", kMaxRows);
  const auto ks = c.compress_ks();
  if (!c.unified()) {
    require(p.type_slots.empty(), "PoolSizes.type_slots applies to the unified layouts only (layout='static')");
    for (int64_t r : c.compress_ratios)  // the static layer tensors must stay addressable by int32 rows
      layer_rows(Layout::StaticSplit, r, p.num_swa_blocks, p.num_logical_blocks, c.block_size);
    return;
  }
  const auto slots = resolved_type_slots(c, p);
  require(slots.size() == ks.size(), "PoolSizes.type_slots has ", slots.size(),
          " entries, expected one per compress type (", ks.size(), ")");
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t capacity = slots[t] * (c.block_size / ks[t]);
    require(p.num_logical_blocks <= capacity, "compress type ", t, " (ratio ", c.compress_ratios[t], ") holds ",
            capacity, " blocks in ", slots[t], " slots, fewer than PoolSizes.num_logical_blocks ", p.num_logical_blocks);
  }
}

}  // namespace ukv
