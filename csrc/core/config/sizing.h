// Sizing of the unified KV pool: the single source of truth shared by the
// allocator (slot counts of every TypePool) and by the tensors (rows of every
// per-layer unified_kv). If the two disagreed, the allocator would hand out
// rows the tensors do not have.
#pragma once

#include <cstdint>
#include <vector>

namespace ukv {

// Row indices handed to the attention kernels are int32; no tensor may have
// more rows than an int32 can address.
constexpr int64_t kMaxRows = 2147483647;

enum class Layout : int64_t {
  StaticSplit = 0,  // upstream flag off: [SWA region | k*NB compress rows]
  Unified = 1,      // shared slots, base-0 compress addressing
};

// Compressed rows per block for a layer with this compress ratio: block_size /
// ratio (CSA ratio 4 -> 32, HCA ratio 128 -> 1 at block 128); 0 for a dense
// (ratio 0) layer. Throws unless ratio divides block_size.
int64_t rows_per_compress_block(int64_t compress_ratio, int64_t block_size);

// Slots (block_size rows each) of one compress type's tensor in the unified
// layout: the shared SWA slots followed by an own region that holds
// num_compress_blocks blocks of k rows, rounded up to whole slots.
int64_t unified_type_slots(int64_t num_swa_blocks, int64_t num_compress_blocks, int64_t k,
                           int64_t block_size);

// unified_type_slots for each k in ks (upstream unified_slot_counts is
// slot_counts(num_swa, NB, {32, 1}, 128)).
std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks,
                                 const std::vector<int64_t>& ks, int64_t block_size);

// Rows of a layer's unified_kv tensor. Unified: (slots of its type) * block_size,
// dense layers num_swa_blocks * block_size. StaticSplit: swa rows + k*NB.
int64_t layer_rows(Layout layout, int64_t compress_ratio, int64_t num_swa_blocks,
                   int64_t num_compress_blocks, int64_t block_size);

// Rows of a layer's tensor when its type's slot count is given explicitly (the
// elastic plans of the KV manager); dense layers take num_swa_blocks slots.
int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size);

// First row of the compress region: 0 in the unified layout (base-0 ids),
// num_swa_blocks * block_size in the static split.
int64_t compress_base_row(Layout layout, int64_t num_swa_blocks, int64_t block_size);

}  // namespace ukv
