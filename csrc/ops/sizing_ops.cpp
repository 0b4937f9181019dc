#include "ops/sizing_ops.h"

#include "core/config/sizing.h"
#include "ops/core_errors.h"

namespace ukv::ops {
namespace {
Layout layout_of(bool unified) { return unified ? Layout::Unified : Layout::StaticSplit; }
}  // namespace

std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks,
                                 std::vector<int64_t> compress_ratios, int64_t block_size) {
  return translate_core_errors([&] {
    std::vector<int64_t> ks;
    for (int64_t r : compress_ratios) {
      require(r > 0, "compress_ratios must be > 0, got ", r);
      ks.push_back(rows_per_compress_block(r, block_size));
    }
    return ukv::slot_counts(num_swa_blocks, num_compress_blocks, ks, block_size);
  });
}

int64_t layer_rows(int64_t compress_ratio, int64_t num_swa_blocks, int64_t num_compress_blocks, int64_t block_size,
                   bool unified) {
  return translate_core_errors([&] {
    return ukv::layer_rows(layout_of(unified), compress_ratio, num_swa_blocks, num_compress_blocks, block_size);
  });
}

int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size) {
  return translate_core_errors(
      [&] { return ukv::layer_rows_for_slots(compress_ratio, type_slots, num_swa_blocks, block_size); });
}

int64_t compress_base_row(bool unified, int64_t num_swa_blocks, int64_t block_size) {
  return translate_core_errors([&] { return ukv::compress_base_row(layout_of(unified), num_swa_blocks, block_size); });
}

}  // namespace ukv::ops

