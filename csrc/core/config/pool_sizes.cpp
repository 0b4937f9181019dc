#include "core/config/pool_sizes.h"

#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {

void validate(const PoolSizes& p) {
  require(p.num_logical_blocks >= 0, "PoolSizes.num_logical_blocks must be >= 0, got ", p.num_logical_blocks);
  require(p.num_logical_blocks <= kMaxRows, "PoolSizes.num_logical_blocks ", p.num_logical_blocks,
          " exceeds the int32 id limit ", kMaxRows);
  require(p.num_swa_blocks >= 0, "PoolSizes.num_swa_blocks must be >= 0, got ", p.num_swa_blocks);
  for (int64_t s : p.type_slots) require(s >= 0, "PoolSizes.type_slots must be >= 0, got ", s);
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"total_rows", p.total_rows},
                                {"envelope_rows", p.envelope_rows}, {"swa_unit_rows", p.swa_unit_rows}})
    require(v >= 0 && v <= kMaxRows, "PoolSizes.", name, " must be in [0, ", kMaxRows, "] (int32 rows), got ", v);
}

PoolSizes resolved(const ServeConfig& c, const PoolSizes& p) {
  PoolSizes r = p;
  if (c.row_space()) {
    if (r.num_logical_blocks == 0 && r.envelope_rows > 0) r.num_logical_blocks = r.total_rows / r.envelope_rows;
    if (r.num_swa_blocks == 0 && r.swa_unit_rows > 0 && c.window > 0) r.num_swa_blocks = r.total_rows / r.swa_unit_rows;
  } else if (c.unified() && r.type_slots.empty()) {
    r.type_slots = slot_counts(p.num_swa_blocks, p.num_logical_blocks, c.compress_ks(), c.block_size);
  }
  return r;
}

namespace {

void validate_row_space(const ServeConfig& c, const PoolSizes& p) {
  require(p.type_slots.empty(), "PoolSizes.type_slots applies to the unified slot layouts, not to 'row_space'");
  require(p.total_rows > 0 && p.envelope_rows > 0 && p.swa_unit_rows > 0,
          "layout 'row_space' needs PoolSizes.total_rows, envelope_rows and swa_unit_rows > 0, got ", p.total_rows,
          ", ", p.envelope_rows, ", ", p.swa_unit_rows);
  require(p.envelope_rows <= p.total_rows && p.swa_unit_rows <= p.total_rows, "PoolSizes.total_rows ",
          p.total_rows, " holds no envelope (", p.envelope_rows, " rows) or no SWA unit (", p.swa_unit_rows, " rows)");
  require(p.num_logical_blocks == p.total_rows / p.envelope_rows, "PoolSizes.num_logical_blocks ",
          p.num_logical_blocks, " must be the envelopes the row space holds, ", p.total_rows / p.envelope_rows);
  const int64_t pages = c.window > 0 ? p.total_rows / p.swa_unit_rows : 0;
  require(p.num_swa_blocks == pages, "PoolSizes.num_swa_blocks ", p.num_swa_blocks,
          " must be the SWA units the row space holds, ", pages, c.window > 0 ? "" : " (window 0: no SWA pages)");
}

}  // namespace

void validate(const ServeConfig& c, const PoolSizes& given) {
  validate(c);
  validate(given);
  // The slot layouts' SWA blocks are block_size rows of every layer tensor.
  require(c.row_space() || given.num_swa_blocks <= kMaxRows / c.block_size, "PoolSizes.num_swa_blocks ",
          given.num_swa_blocks, " x block_size ", c.block_size, " exceeds the int32 row limit ", kMaxRows);
  const PoolSizes p = resolved(c, given);
  if (c.row_space()) return validate_row_space(c, p);
  require(p.total_rows == 0 && p.envelope_rows == 0 && p.swa_unit_rows == 0,
          "PoolSizes.total_rows, envelope_rows and swa_unit_rows apply to layout 'row_space' only");
  require((c.window > 0) == (p.num_swa_blocks > 0), "ServeConfig.window (", c.window, ") and PoolSizes.num_swa_blocks (",
          p.num_swa_blocks, ") must both be > 0 (a sliding-window model) or both be 0 (no SWA pool)");
  const auto ks = c.compress_ks();
  if (!c.unified()) {
    require(p.type_slots.empty(), "PoolSizes.type_slots applies to the unified layouts only (layout='static')");
    for (int64_t r : c.compress_ratios)  // the static layer tensors must stay addressable by int32 rows
      layer_rows(Layout::StaticSplit, r, p.num_swa_blocks, p.num_logical_blocks, c.block_size);
    return;
  }
  const auto& slots = p.type_slots;
  require(slots.size() == ks.size(), "PoolSizes.type_slots has ", slots.size(),
          " entries, expected one per compress type (", ks.size(), ")");
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t capacity = slots[t] * (c.block_size / ks[t]);
    require(p.num_logical_blocks <= capacity, "compress type ", t, " (ratio ", c.compress_ratios[t], ") holds ",
            capacity, " blocks in ", slots[t], " slots, fewer than PoolSizes.num_logical_blocks ", p.num_logical_blocks);
  }
}

}  // namespace ukv
