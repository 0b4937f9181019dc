// Sizing as dispatcher ops (no tensors): the same C++ functions size the
// allocator's pools and the per-layer tensors (ukv_torch.allocate_unified_kv).
#pragma once

#include <cstdint>
#include <vector>

namespace ukv::ops {

std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks,
                                 std::vector<int64_t> compress_ratios, int64_t block_size);
int64_t layer_rows(int64_t compress_ratio, int64_t num_swa_blocks, int64_t num_compress_blocks,
                   int64_t block_size, bool unified);
int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size);
int64_t compress_base_row(bool unified, int64_t num_swa_blocks, int64_t block_size);

}  // namespace ukv::ops

