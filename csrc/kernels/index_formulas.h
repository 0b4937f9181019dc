// Per-token formulas of upstream's index builders, written once
// for the CPU loops and the GPU kernels. Everything here is total: any input
// value gives an in-bounds read (table columns and compressed entries are
// clamped, negative counts become 0), so a bad value can produce wrong row
// numbers but never a wild memory access.
#pragma once

#include <cstdint>

#include "core/common/ceil_div.h"
#include "kernels/compat.h"
#include "kernels/index_params.h"

namespace ukv::kernels {

UKV_HOST_DEVICE int32_t min_i32(int32_t a, int32_t b) { return a < b ? a : b; }
UKV_HOST_DEVICE int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
UKV_HOST_DEVICE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
UKV_HOST_DEVICE int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

UKV_HOST_DEVICE bool is_real_token(int32_t batch_id, int32_t num_seqs) {
  return batch_id >= 0 && batch_id < num_seqs;
}

// A token's position as loaded, before position_value widens and clamps it:
// one predicated load for either dtype and no use of its value, so a kernel
// can issue it beside its other loads and use it after them. (A position
// widened or clamped at once, where the load sits under a branch, holds back
// every load the branch is followed by: a whole extra round trip.)
struct LoadedPosition {
  int64_t i64;
  int32_t i32;
};

UKV_HOST_DEVICE LoadedPosition load_position_raw(const Positions& positions, int32_t t) {
  return {positions.i64 ? positions.i64[t] : 0, positions.i64 ? 0 : positions.i32[t]};
}

// Positions are read as int32: a position below 0 behaves like "no token yet"
// (-1) and one past the int32 range is held where pos + 1 cannot overflow.
UKV_HOST_DEVICE int32_t clamp_position(int64_t p) {
  return static_cast<int32_t>(min_i64(max_i64(p, -1), INT32_MAX - 1));
}

UKV_HOST_DEVICE int32_t position_value(const LoadedPosition& loaded, const Positions& positions) {
  return clamp_position(positions.i64 ? loaded.i64 : loaded.i32);
}

UKV_HOST_DEVICE int32_t load_position(const Positions& positions, int32_t t) {
  return position_value(load_position_raw(positions, t), positions);
}

// x / d and x % d for 0 <= x < 2^31 (see Divisor). A negative x gives some
// value, which the callers' clamps keep in bounds either way.
// (x * multiplier) >> (31 + l) is taken as the high word of 2x * multiplier
// (2x fits 32 bits) shifted by l: a 32-bit multiply-high, where the 64-bit
// product would keep every later use of the quotient in 64-bit arithmetic.
UKV_HOST_DEVICE int32_t quotient(int32_t x, const Divisor& d) {
  const uint64_t twice_x = static_cast<uint32_t>(x) << 1;
  const uint32_t high = static_cast<uint32_t>((twice_x * d.multiplier) >> 32);
  return static_cast<int32_t>(high >> (d.shift - 31));
}
UKV_HOST_DEVICE int32_t remainder(int32_t x, const Divisor& d) {
  return static_cast<int32_t>(static_cast<uint32_t>(x) -
                              static_cast<uint32_t>(quotient(x, d)) * static_cast<uint32_t>(d.value));
}

// One sequence's row of a block table. A kernel takes the row once per token
// and then looks up many columns in it. A compact table (rows of contiguous
// columns, every cell within 2^31 cells of the start: how every engine lays
// its tables out, see is_compact) is addressed with a 32-bit cell offset from
// the table's start: one add and one multiply-add per lookup. A 64-bit offset
// costs four, because the compiler folds the row's offset into each lookup's
// address rather than keeping a row pointer.
struct TableRow {
  const int32_t* table;  // the table's first cell
  int64_t first;         // offset of the row's first cell
  int64_t col_stride;
  int32_t cols;
};

UKV_HOST_DEVICE TableRow table_row(const Table& table, int32_t row) {
  return {table.data, row * table.row_stride, table.col_stride, table.cols};
}

UKV_HOST_DEVICE const int32_t* row_start(const TableRow& row) { return row.table + row.first; }

// Whether every cell of the table lies within 2^31 - 1 cells of its start
// and its columns are contiguous (id_at<true> may be used).
UKV_HOST_DEVICE bool is_compact(const Table& table) {
  return table.col_stride == 1 && table.row_stride >= 0 &&
         (static_cast<int64_t>(table.rows) - 1) * table.row_stride + table.cols <= INT32_MAX;
}

// Whether csa_translate_pack may read every top-k tile of tile_cells lanes
// with 16-byte loads (load_topk_tile<kVectorRows>): contiguous rows, 16-byte
// aligned, whole groups of 4; and every lane's offset from the start, the
// masked lanes of a row's last tile included, fits int32, so that a group's
// address is one 32-bit multiply-add from the start with no overflow.
inline bool topk_rows_vectorizable(const CsaTranslatePackParams& p, int32_t tile_cells) {
  const int64_t lanes_per_row = ceil_div(p.topk_width, tile_cells) * tile_cells;
  return p.topk_col_stride == 1 && p.topk_row_stride >= 0 && p.topk_row_stride % 4 == 0 && p.topk_width % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(p.topk) & 15) == 0 &&
         (static_cast<int64_t>(p.num_tokens) - 1) * p.topk_row_stride + lanes_per_row <= INT32_MAX;
}

// The id in column col of the row, col in [0, cols) (the callers clamp it).
template <bool kCompact = false>
UKV_HOST_DEVICE int32_t id_at(const TableRow& row, int32_t col) {
  if (kCompact) return row.table[static_cast<uint32_t>(row.first) + static_cast<uint32_t>(col)];
  return row.table[row.first + col * row.col_stride];
}

// Rows of the sliding window visible to the token at pos: min(pos + 1, window).
UKV_HOST_DEVICE int32_t swa_window_count(int32_t pos, int32_t window) {
  return max_i32(min_i32(pos + 1, window), 0);
}

// CSA entries a token may attend to: its causal share (pos + 1) / ratio, capped
// by what the sequence has committed and by index_topk (the strict valid_k).
UKV_HOST_DEVICE int32_t csa_valid_count(int32_t pos, int32_t n_committed, int32_t index_topk,
                                        int32_t csa_ratio) {
  return max_i32(min_i32(min_i32((pos + 1) / csa_ratio, n_committed), index_topk), 0);
}

// HCA entries a prefill token may attend to: the per-token causal cap, so no
// token reads an entry covering later positions.
UKV_HOST_DEVICE int32_t hca_causal_count(int32_t pos, int32_t n_committed, int32_t hca_ratio) {
  return max_i32(min_i32((pos + 1) / hca_ratio, n_committed), 0);
}

// How a kernel computes SWA rows (SwaRows), chosen once per launch:
// kPlain, the slot layouts: unit * page + q, one row for every output;
// kPow2, the row space with a power-of-two page and groups (every
//   swa_page_tokens and compress ratio in practice): shifts and masks;
// kGeneral, any constants: multiply-shift divisions (Divisor).
// In the row space each output has its own rows, and the divisions were most
// of a cell's instructions (paged decode at T=4096 ran 1.43x the slot form).
enum class SwaForm { kPlain, kPow2, kGeneral };

UKV_HOST_DEVICE bool is_pow2(const Divisor& d) { return (d.value & (d.value - 1)) == 0; }

// x / d for 0 <= x < 2^31, by a shift where the form guarantees a power of two.
template <SwaForm kForm>
UKV_HOST_DEVICE int32_t quotient_in(int32_t x, const Divisor& d) {
  if (kForm == SwaForm::kPow2) return static_cast<int32_t>(static_cast<uint32_t>(x) >> (d.shift - 31));
  return quotient(x, d);
}

// Where SWA position a lies: its page's column in the table and its place q
// in that page.
struct PagePlace {
  int32_t col;
  int32_t q;
};

template <SwaForm kForm>
UKV_HOST_DEVICE PagePlace page_place(int32_t a, const Divisor& page) {
  const int32_t col = quotient_in<kForm>(a, page);
  return {col, static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(col) * page.value)};
}

// The unit of a page column of a sequence's table row (a page the sequence
// does not hold is -1 there, read as 0, so a position read by mistake still
// names a row inside the tensor).
UKV_HOST_DEVICE int32_t swa_unit_at(const TableRow& row, int32_t col, int32_t cols) {
  return max_i32(id_at(row, min_i32(max_i32(col, 0), cols - 1)), 0);
}

// Where place q of a unit lies in it (SwaRows): offset + (q / group) *
// group_stride + q % group, or q in the plain form.
template <SwaForm kForm>
UKV_HOST_DEVICE uint32_t place_offset(int32_t q, const SwaRows& r) {
  const uint32_t uq = static_cast<uint32_t>(q);
  if (kForm == SwaForm::kPlain) return uq;
  const uint32_t g = static_cast<uint32_t>(quotient_in<kForm>(q, r.group));
  return static_cast<uint32_t>(r.offset) + g * static_cast<uint32_t>(r.group_stride) +
         (uq - g * static_cast<uint32_t>(r.group.value));
}

// The first row of a unit (unit * unit_rows, or unit * page in the plain form).
template <SwaForm kForm>
UKV_HOST_DEVICE uint32_t unit_first_row(int32_t unit, const SwaRows& r) {
  return static_cast<uint32_t>(unit) * static_cast<uint32_t>(kForm == SwaForm::kPlain ? r.page.value : r.unit_rows);
}

// The row of place q of a unit, modulo 2^32 like the int32 it is stored as.
template <SwaForm kForm>
UKV_HOST_DEVICE int32_t swa_row_at(int32_t unit, int32_t q, const SwaRows& r) {
  return static_cast<int32_t>(unit_first_row<kForm>(unit, r) + place_offset<kForm>(q, r));
}

// The rows of one SWA position in each output of an index op (its class's
// SwaRows; one page and unit size among them). A thread visits positions
// kGroup apart; where the page divides kGroup (pages of 32 and 64) they all
// have the same place in their page, so the places' offsets are computed once
// per token and a cell costs one multiply-add per output, as in the plain form.
// (The plain form has one row for every output and keeps nothing.)
template <SwaForm kForm, int kOutputs>
struct SwaRowsOfPlace {
  const SwaRows* rows;
  int32_t q = -1;
  uint32_t offset[kOutputs] = {};

  UKV_HOST_DEVICE void at(int32_t place) {
    if (kForm == SwaForm::kPlain) {  // one row for all outputs, and nothing worth keeping
      offset[0] = static_cast<uint32_t>(place);
      return;
    }
    if (place == q) return;
    q = place;
    for (int k = 0; k < kOutputs; ++k) offset[k] = place_offset<kForm>(place, rows[k]);
  }
  UKV_HOST_DEVICE int32_t row(int k, uint32_t first_row) const { return static_cast<int32_t>(first_row + offset[k]); }
};

// unified_kv row of SWA position a of a sequence (relative to the layer's base row).
UKV_HOST_DEVICE int32_t swa_row(const Table& swa_table, int32_t seq, int32_t a, const SwaRows& r) {
  const PagePlace at = page_place<SwaForm::kGeneral>(a, r.page);
  return swa_row_at<SwaForm::kGeneral>(swa_unit_at(table_row(swa_table, seq), at.col, swa_table.cols), at.q, r);
}

// unified_kv row of a sequence's compressed entry e (k entries per block):
// base + id(e / k) * stride + e % k, modulo 2^32 like the int32 it is stored
// as. The stride is k in the slot layouts and the envelope in the row space.
// Entries outside the row are clamped onto it, which keeps the read in bounds
// for lanes past valid_k whose top-k cells hold garbage; those lanes are
// never stored.
template <bool kCompact = false>
UKV_HOST_DEVICE int32_t compress_row(const TableRow& row, int32_t entry, const Divisor& rows_per_block,
                                     int32_t block_stride, int32_t compress_base) {
  const int32_t last = row.cols * rows_per_block.value - 1;  // >= 0: a table has a column
  const int32_t e = max_i32(min_i32(entry, last), 0);
  const int32_t q = quotient(e, rows_per_block);
  const uint32_t id = static_cast<uint32_t>(id_at<kCompact>(row, q));
  // id * stride + (base + e - q * k): everything but one multiply-add is
  // computed while the lookup is in flight.
  const uint32_t rest = static_cast<uint32_t>(compress_base) + static_cast<uint32_t>(e) -
                        static_cast<uint32_t>(q) * static_cast<uint32_t>(rows_per_block.value);
  return static_cast<int32_t>(id * static_cast<uint32_t>(block_stride) + rest);
}

UKV_HOST_DEVICE int32_t compress_row(const Table& table, int32_t seq, int32_t entry, const Divisor& rows_per_block,
                                     int32_t block_stride, int32_t compress_base) {
  return compress_row(table_row(table, seq), entry, rows_per_block, block_stride, compress_base);
}

// The part of an output a token may write: its slice, clipped to the output.
struct SliceBounds {
  int64_t lo;
  int64_t hi;
};

UKV_HOST_DEVICE SliceBounds slice_bounds(const SlicedOutput& out, int32_t t) {
  return {max_i64(out.indptr[t], 0), min_i64(out.indptr[t + 1], out.size)};
}

UKV_HOST_DEVICE void store_in_slice(const SlicedOutput& out, const SliceBounds& b, int64_t cell, int32_t value) {
  if (cell >= b.lo && cell < b.hi) out.data[cell] = value;
}

// HCA entries at the head of a decode token's slice: the sequence's committed
// count (per sequence in decode, as upstream), capped by the slice length and
// the table width so that a stale count neither writes past the slice nor
// reads past the table row.
UKV_HOST_DEVICE int32_t hca_decode_count(const HcaDecodeParams& p, int32_t t, int32_t bid) {
  const int64_t slice = static_cast<int64_t>(p.out.indptr[t + 1]) - p.out.indptr[t];
  const int64_t capacity = static_cast<int64_t>(p.table.cols) * p.rows_per_block.value;
  return static_cast<int32_t>(max_i64(min_i64(min_i64(p.n_committed[bid], slice), capacity), 0));
}

// Prefill window split: of the min(pos + 1, window) window rows,
// extend_count come from this chunk (the forward's own kv) and prefix_swa_count
// = max(chunk_start - swa_low, 0) from earlier chunks or the cached prefix
// (unified_kv via the SWA table). For a valid token (chunk_start <= pos) that is
// below window; the cap at window only bounds the work a bad chunk_start causes.
struct PrefillWindow {
  int32_t pos_in_chunk;
  int32_t swa_low;
  int32_t extend_count;
  int32_t prefix_swa_count;
};

UKV_HOST_DEVICE PrefillWindow prefill_window(int32_t pos, int32_t chunk_start, int32_t window) {
  PrefillWindow w;
  w.pos_in_chunk = pos - chunk_start;
  w.swa_low = max_i32(pos - window + 1, 0);
  w.extend_count = max_i32(min_i32(w.pos_in_chunk + 1, window), 0);
  w.prefix_swa_count = min_i32(max_i32(chunk_start - w.swa_low, 0), window);
  return w;
}

// HCA entries in a prefill token's slice tail: the causal cap, held inside
// the table width so the read stays in the row.
UKV_HOST_DEVICE int32_t prefill_hca_count(const PagedPrefillParams& p, int32_t pos, int32_t bid) {
  const int32_t causal = hca_causal_count(pos, p.n_committed_hca[bid], p.hca_ratio);
  return static_cast<int32_t>(min_i64(causal, static_cast<int64_t>(p.hca_table.cols) * p.hca_rows_per_block.value));
}

// Slice lengths of one decode token: SWA, CSA = [top-k | SWA] and
// HCA = [committed | SWA]. Padding tokens get empty slices.
struct DecodeTokenCounts {
  int32_t swa;
  int32_t csa;
  int32_t hca;
};

UKV_HOST_DEVICE DecodeTokenCounts decode_token_counts(const DecodeMetadataParams& p, int32_t t) {
  const int32_t bid = p.batch_id[t];
  if (!is_real_token(bid, p.num_seqs)) return {0, 0, 0};
  const int32_t pos = load_position(p.positions, t);
  const int32_t n_swa = swa_window_count(pos, p.window);
  const int32_t valid_k = csa_valid_count(pos, p.n_committed_csa[bid], p.index_topk, p.csa_ratio);
  const int32_t n_hca = max_i32(p.n_committed_hca[bid], 0);
  return {n_swa, n_swa + valid_k, n_swa + n_hca};
}

// Slice lengths of one prefill token: extend, dense SWA prefix,
// CSA = [top-k | SWA prefix], HCA = [SWA prefix | causal HCA], and the SWA
// prefix count csa_translate_pack skips.
struct PrefillTokenCounts {
  int32_t extend;
  int32_t swa;
  int32_t csa;
  int32_t hca;
  int32_t prefix_swa;
};

UKV_HOST_DEVICE PrefillTokenCounts prefill_token_counts(const PrefillMetadataParams& p, int32_t t) {
  const int32_t bid = p.batch_id[t];
  if (!is_real_token(bid, p.num_seqs)) return {0, 0, 0, 0, 0};
  const int32_t pos = load_position(p.positions, t);
  const PrefillWindow w = prefill_window(pos, p.chunk_start[bid], p.window);
  const int32_t valid_k = csa_valid_count(pos, p.n_committed_csa[bid], p.index_topk, p.csa_ratio);
  const int32_t n_hca = hca_causal_count(pos, p.n_committed_hca[bid], p.hca_ratio);
  const int32_t prefix = w.prefix_swa_count;
  return {w.extend_count, prefix, prefix + valid_k, prefix + n_hca, prefix};
}

// The SWA row a new token at its position is written at: -1 for padding and
// for a position whose page the sequence does not hold (swa_slot_mapping):
// an entry below 0, or a page past the table's columns. Unlike a read, a
// write is not clamped onto the last column: that would name the row of
// another position of that page.
UKV_HOST_DEVICE int32_t swa_slot_of(const SwaSlotMappingParams& p, int32_t t) {
  const int32_t bid = p.batch_id[t];
  const int32_t pos = load_position(p.positions, t);
  if (!is_real_token(bid, p.swa_table.rows) || pos < 0) return -1;
  const PagePlace at = page_place<SwaForm::kGeneral>(pos, p.swa_rows.page);
  if (at.col >= p.swa_table.cols) return -1;
  const int32_t unit = id_at(table_row(p.swa_table, bid), at.col);
  return unit < 0 ? -1 : swa_row_at<SwaForm::kGeneral>(unit, at.q, p.swa_rows);
}

// Row copies (apply_row_copies): the entries of one phase, [first, first +
// count) of the copy list, clamped to the list.
struct PhaseSpan {
  int32_t first;
  int32_t count;
};

UKV_HOST_DEVICE PhaseSpan phase_span(const RowCopyParams& p, int32_t phase) {
  int64_t first = 0;
  for (int32_t q = 0; q < phase; ++q) first += p.counts[q] > 0 ? p.counts[q] : 0;
  first = first < p.max_copies ? first : p.max_copies;
  int64_t count = p.counts[phase] > 0 ? p.counts[phase] : 0;
  count = count < p.max_copies - first ? count : p.max_copies - first;
  return {static_cast<int32_t>(first), static_cast<int32_t>(count)};
}

// Row transfers (gather_rows, scatter_rows): how many runs the list holds,
// and a run's place, or a run of 0 rows when any part of it lies outside its
// tensor or the buffer (such a run is skipped).
UKV_HOST_DEVICE int32_t run_count(const RowTransferParams& p) {
  const int32_t n = p.count[0];
  return n < 0 ? 0 : (n < p.max_runs ? n : p.max_runs);
}

struct RowRun {
  int32_t tensor;
  int64_t first_row;
  int64_t rows;
  int64_t offset;
};

// Run i, its packed bytes `shift` bytes further into the buffer (a layer's
// offset, 0 <= shift <= buffer_bytes), or no rows where it falls outside.
UKV_HOST_DEVICE RowRun row_run(const RowTransferParams& p, int32_t i, int64_t shift = 0) {
  const int64_t* r = p.runs + 4 * static_cast<int64_t>(i);
  const int64_t tensor = r[0], first = r[1], rows = r[2], offset = r[3];
  if (tensor < 0 || tensor >= p.num_tensors || rows <= 0 || first < 0 || offset < 0) return {0, 0, 0, 0};
  const int32_t t = static_cast<int32_t>(tensor);
  // Compared as differences: a sum of hostile values could wrap. Once the
  // rows lie in the tensor, their bytes (at most the tensor's) cannot.
  if (first > p.tensor_rows[t] - rows || offset > p.buffer_bytes - shift - rows * p.row_bytes[t])
    return {0, 0, 0, 0};
  return {t, first, rows, offset + shift};
}

// An entry is applied only if both ranges lie in the planes and do not
// overlap each other (the manager never makes such a copy; skipping one keeps
// the CPU's and the GPU's results the same, as a parallel copy of overlapping
// ranges has no defined order).
UKV_HOST_DEVICE bool copy_in_bounds(const RowCopyParams& p, int32_t src, int32_t dst, int32_t rows) {
  const bool apart = static_cast<int64_t>(src) + rows <= dst || static_cast<int64_t>(dst) + rows <= src;
  return rows > 0 && src >= 0 && dst >= 0 && src <= p.plane_rows - rows && dst <= p.plane_rows - rows && apart;
}

}  // namespace ukv::kernels
