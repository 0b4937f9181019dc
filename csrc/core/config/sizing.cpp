#include "core/config/sizing.h"

#include "core/common/ceil_div.h"
#include "core/common/errors.h"

namespace ukv {
namespace {

void require_non_negative(int64_t v, const char* name) {
  require(v >= 0, name, " must be >= 0, got ", v);
}

void require_block_size(int64_t block_size) {
  require(block_size > 0, "block_size must be > 0, got ", block_size);
}

int64_t checked_rows(int64_t rows, const char* what) {
  require(rows <= kMaxRows, what, " needs ", rows, " rows, more than the int32 row limit ", kMaxRows,
          "; use fewer blocks");
  return rows;
}

// a * b, refusing anything past the int32 row limit before it can overflow.
int64_t rows_product(int64_t a, int64_t b, const char* what) {
  require(b == 0 || a <= kMaxRows / b, what, " overflows the int32 row limit (", a, " x ", b, ")");
  return a * b;
}

}  // namespace

int64_t rows_per_compress_block(int64_t compress_ratio, int64_t block_size) {
  require_block_size(block_size);
  require_non_negative(compress_ratio, "compress_ratio");
  if (compress_ratio == 0) return 0;
  require(block_size % compress_ratio == 0, "compress_ratio ", compress_ratio,
          " must divide block_size ", block_size);
  return block_size / compress_ratio;
}

int64_t unified_type_slots(int64_t num_swa_blocks, int64_t num_compress_blocks, int64_t k,
                           int64_t block_size) {
  require_block_size(block_size);
  require_non_negative(num_swa_blocks, "num_swa_blocks");
  require_non_negative(num_compress_blocks, "num_compress_blocks");
  require(k > 0 && k <= block_size && block_size % k == 0, "k (rows per compress block) must divide block_size ",
          block_size, ", got ", k);
  const int64_t blocks_per_slot = block_size / k;
  const int64_t own = ceil_div(num_compress_blocks, blocks_per_slot);
  // Each part within the row limit first, so their sum cannot overflow int64.
  rows_product(num_swa_blocks, block_size, "SWA region");
  rows_product(own, block_size, "unified type tensor");
  const int64_t slots = num_swa_blocks + own;
  rows_product(slots, block_size, "unified type tensor");
  return slots;
}

std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks,
                                 const std::vector<int64_t>& ks, int64_t block_size) {
  std::vector<int64_t> out;
  out.reserve(ks.size());
  for (int64_t k : ks) out.push_back(unified_type_slots(num_swa_blocks, num_compress_blocks, k, block_size));
  return out;
}

int64_t layer_rows(Layout layout, int64_t compress_ratio, int64_t num_swa_blocks, int64_t num_compress_blocks,
                   int64_t block_size) {
  const int64_t k = rows_per_compress_block(compress_ratio, block_size);
  require_non_negative(num_swa_blocks, "num_swa_blocks");
  require_non_negative(num_compress_blocks, "num_compress_blocks");
  const int64_t swa_rows = rows_product(num_swa_blocks, block_size, "SWA region");
  if (k == 0) return swa_rows;
  if (layout == Layout::Unified)
    return unified_type_slots(num_swa_blocks, num_compress_blocks, k, block_size) * block_size;
  require(layout == Layout::StaticSplit, "unknown layout ", static_cast<int64_t>(layout));
  return checked_rows(swa_rows + rows_product(num_compress_blocks, k, "compress region"), "static-split layer tensor");
}

int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size) {
  const int64_t k = rows_per_compress_block(compress_ratio, block_size);
  require_non_negative(num_swa_blocks, "num_swa_blocks");
  require(type_slots >= num_swa_blocks, "type_slots (", type_slots, ") must cover the ", num_swa_blocks,
          " shared SWA slots");
  return rows_product(k == 0 ? num_swa_blocks : type_slots, block_size, "layer tensor");
}

int64_t compress_base_row(Layout layout, int64_t num_swa_blocks, int64_t block_size) {
  require_block_size(block_size);
  require_non_negative(num_swa_blocks, "num_swa_blocks");
  return layout == Layout::Unified ? 0 : rows_product(num_swa_blocks, block_size, "SWA region");
}

}  // namespace ukv
