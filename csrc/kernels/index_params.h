// Raw-pointer arguments of the index-building kernels. The ATen glue fills one
// of these per call from validated tensors (csrc/ops/index_checks.cpp); the CPU
// implementation and the GPU launchers both consume it, so the two paths see the
// same sizes, strides and scalars. Torch-free and CUDA-free.
//
// Conventions shared by every op:
// - T tokens, B sequences. A token whose batch id is outside [0, B) is padding
//   (-1 is the graph-padding sentinel) and writes nothing.
// - Per-token and per-sequence vectors are contiguous int32 (positions may be
//   int64); 2-D tables and the top-k matrix carry their strides.
// - Every output is a contiguous int32 vector addressed through an indptr: a
//   token writes only inside its own slice [indptr[t], indptr[t+1]) of that
//   output, clipped to the output's length, whatever the input values are.
#pragma once

#include <cstdint>

namespace ukv::kernels {

// A positive divisor of per-cell index arithmetic (block_size, k), with its
// reciprocal precomputed. The index kernels divide once per output cell, and a
// GPU has no integer divide instruction: a division is a long sequence, and a
// branch between it and a shift (for powers of two) splits a thread's table
// lookups into separate basic blocks, so their loads are issued one after the
// other instead of together. x / d for 0 <= x < 2^31 is instead
// (x * multiplier) >> shift with multiplier = ceil(2^(31 + l) / d) and
// l = ceil(log2 d) (Granlund and Montgomery): the multiplier is below 2^32, the
// product below 2^63, and the rounding error below 2^-l <= 1/d, too small to
// reach the next multiple of d. One wide multiply and a shift, no branch, for
// every d.
struct Divisor {
  int32_t value;
  uint32_t multiplier;
  int32_t shift;  // 31 + l
};

// value >= 1: the op checks refuse anything else before a Divisor is made.
inline Divisor make_divisor(int32_t value) {
  int32_t l = 0;
  while ((int64_t{1} << l) < value) ++l;
  const uint64_t d = static_cast<uint64_t>(value);
  const uint64_t multiplier = ((uint64_t{1} << (31 + l)) + d - 1) / d;
  return {value, static_cast<uint32_t>(multiplier), 31 + l};
}

// Where a sequence's SWA position a lives (one layer class; ServeConfig and
// KvPlan.layer_swa_rows): with id = table[a / page] and q = a % page,
//   row = id * unit_rows + offset + (q / group) * group_stride + q % group.
// The slot layouts are "plain": page = unit_rows = group = group_stride =
// block_size and offset 0, i.e. row = id * block_size + a % block_size.
struct SwaRows {
  Divisor page;
  int32_t unit_rows;
  int32_t offset;
  Divisor group;
  int32_t group_stride;
};

inline bool is_plain(const SwaRows& r) {
  return r.unit_rows == r.page.value && r.offset == 0 && r.group.value == r.page.value &&
         r.group_stride == r.page.value;
}

// A [rows, cols] int32 matrix read as data[r * row_stride + c * col_stride].
struct Table {
  const int32_t* data;
  int32_t rows;
  int32_t cols;
  int64_t row_stride;
  int64_t col_stride;
};

// Token positions, int32 or int64 (exactly one pointer is set).
struct Positions {
  const int32_t* i32;
  const int64_t* i64;
};

// An output vector and the indptr that gives each token its slice.
struct SlicedOutput {
  const int32_t* indptr;  // [T + 1]
  int32_t* data;
  int64_t size;
};

struct CsaTranslatePackParams {
  const int32_t* topk;  // [T, topk_width], sequence-local compressed entries
  int64_t topk_row_stride;
  int64_t topk_col_stride;
  int32_t topk_width;
  Table table;  // [B, cols] compress block ids (physical, or logical in the static split)
  Positions positions;
  const int32_t* batch_id;
  const int32_t* skip;  // [T] SWA rows at the slice tail (prefill); null: min(pos+1, window)
  SlicedOutput out;
  int32_t num_tokens;
  int32_t window;
  Divisor rows_per_block;  // k = block_size / compress_ratio
  int32_t block_stride;    // rows between consecutive blocks: k, or the envelope in the row space
  int32_t compress_base;
};

struct PagedDecodeParams {
  Table swa_table;  // [B, cols] SWA page ids
  Positions positions;
  const int32_t* batch_id;
  SlicedOutput swa;
  SlicedOutput csa;  // data == nullptr when not requested
  SlicedOutput hca;  // data == nullptr when not requested
  int32_t num_tokens;
  int32_t window;
  SwaRows swa_rows[3];  // of the SWA, CSA and HCA outputs (one page and unit size among those written)
};

struct HcaDecodeParams {
  Table table;  // [B, cols] HCA block ids
  const int32_t* batch_id;
  const int32_t* n_committed;  // [B] committed HCA entries per sequence
  SlicedOutput out;
  int32_t num_tokens;
  Divisor rows_per_block;
  int32_t block_stride;
  int32_t compress_base;
};

struct PagedPrefillParams {
  Positions positions;
  const int32_t* batch_id;
  const int32_t* chunk_start;  // [B] position of each sequence's first token in this forward
  const int32_t* query_start;  // [B] row of each sequence's first token in the forward's kv
  const int32_t* n_committed_hca;  // [B]
  Table swa_table;
  Table hca_table;
  SlicedOutput extend;
  SlicedOutput swa;
  SlicedOutput csa;
  SlicedOutput hca;
  int32_t num_tokens;
  int32_t window;
  SwaRows swa_rows[3];  // of the SWA, CSA and HCA outputs' SWA prefix
  int32_t hca_ratio;
  Divisor hca_rows_per_block;
  int32_t hca_block_stride;
  int32_t compress_base;
};

// The SWA row each new token is written at (-1 for padding and for positions
// whose page the table does not hold: an entry below 0 or past its columns).
struct SwaSlotMappingParams {
  Table swa_table;
  Positions positions;
  const int32_t* batch_id;
  int32_t* out;  // [T]
  int32_t num_tokens;
  SwaRows swa_rows;
};

// Row copies of the row-space layout: entries [first, first + count[phase])
// of copies ([*, 3]: src_row, dst_row, rows) for each phase in turn, in each
// plane (rows of row_bytes bytes).
constexpr int32_t kMaxPlanes = 4;
struct RowCopyParams {
  const int32_t* copies;
  const int32_t* counts;  // [num_phases], on the device
  int32_t max_copies;
  int32_t num_phases;
  int32_t num_planes;
  uint8_t* planes[kMaxPlanes];
  int64_t row_bytes[kMaxPlanes];
  int64_t plane_rows;     // every plane's rows (copies outside them are skipped)
};

// Row runs between 2-D tensors and one byte buffer (gather_rows,
// scatter_rows): entries [0, count[0]) of runs ([*, 4] int64: tensor, first
// row, rows, buffer byte offset), each run's rows packed at its offset.
// Tensor rows are row_bytes bytes, row_stride bytes apart.
struct RowTransferParams {
  const int64_t* runs;
  const int32_t* count;  // [1], on the device
  int32_t max_runs;
  int32_t num_tensors;
  uint8_t* tensors[kMaxPlanes];
  int64_t row_bytes[kMaxPlanes];
  int64_t row_stride[kMaxPlanes];
  int64_t tensor_rows[kMaxPlanes];
  uint8_t* buffer;
  int64_t buffer_bytes;
  bool to_buffer;  // gather (tensor rows -> buffer) or scatter (buffer -> tensor rows)
};

// The same runs over several layers (gather_rows / scatter_rows with
// layer_offsets): layer l's tensor t is tensors[l][t], with the row bytes and
// row stride of `rows`' tensor t (the layers of one compress ratio), whose
// tensor_rows are the fewest of any layer's, and its runs land
// layer_offset[l] bytes further into the buffer. One launch copies every
// layer's rows: a launch per layer cost more host time than the copy of a
// few blocks takes on the GPU.
constexpr int32_t kMaxLayers = 64;
struct LayerRowTransferParams {
  RowTransferParams rows;  // the runs, the buffer, the tensors' shapes, layer 0's tensors
  int32_t num_layers;      // 1: `rows` alone, its buffer starting at the layer's offset
  uint8_t* tensors[kMaxLayers][kMaxPlanes];
  int64_t layer_offset[kMaxLayers];
};

struct DecodeMetadataParams {
  Positions positions;
  const int32_t* batch_id;
  const int32_t* n_committed_csa;  // [B]
  const int32_t* n_committed_hca;  // [B]
  int32_t num_seqs;
  int32_t* swa_indptr;  // [T + 1] each
  int32_t* csa_indptr;
  int32_t* hca_indptr;
  int32_t num_tokens;
  int32_t window;
  int32_t index_topk;
  int32_t csa_ratio;
};

struct PrefillMetadataParams {
  Positions positions;
  const int32_t* batch_id;
  const int32_t* chunk_start;      // [B]
  const int32_t* n_committed_csa;  // [B]
  const int32_t* n_committed_hca;  // [B]
  int32_t num_seqs;
  int32_t* extend_indptr;  // [T + 1] each
  int32_t* swa_indptr;
  int32_t* csa_indptr;
  int32_t* hca_indptr;
  int32_t* prefix_swa_count;  // [T]
  int32_t num_tokens;
  int32_t window;
  int32_t index_topk;
  int32_t csa_ratio;
  int32_t hca_ratio;
};

}  // namespace ukv::kernels
