// Sizing as dispatcher ops (no tensors): the same C++ functions size the
// allocator's pools and the per-layer tensors (ukv_torch.allocate_unified_kv).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ukv::ops {

std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks,
                                 std::vector<int64_t> ks, int64_t block_size);
int64_t layer_rows(int64_t compress_ratio, int64_t num_swa_blocks, int64_t num_compress_blocks,
                   int64_t block_size, bool unified);
int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size);
int64_t compress_base_row(bool unified, int64_t num_swa_blocks, int64_t block_size);

}  // namespace ukv::ops

namespace ukv::ops {

// plan_kv_layout as an op: returns (summary, compress_ks, type_slots, layer_rows)
// with summary = [num_swa_blocks, num_logical_blocks, kv_bytes, rope_bytes,
// indexer_bytes, total_bytes, swa_block_bytes, compressed_block_bytes].
std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>> plan_kv_layout(
    int64_t budget_bytes, std::vector<int64_t> compress_ratios, int64_t head_dim, int64_t kv_elem_bytes,
    int64_t rope_head_dim, int64_t rope_elem_bytes, int64_t indexer_bytes_per_block, int64_t block_size,
    int64_t window, int64_t mtp_k, int64_t max_num_seqs, std::optional<int64_t> max_num_batched_tokens,
    bool full_retain, double swa_budget_frac, std::string mode);

}  // namespace ukv::ops
