// paged_decode_indices: each decode token's sliding window,
// positions [pos - n + 1, pos] with n = min(pos + 1, window), as unified_kv rows
// through the SWA block table, written at the tail of its SWA slice and, when
// requested, of its CSA and HCA slices (whose heads belong to
// csa_translate_pack and hca_decode_indices). The SWA slice is exactly the
// window, so its tail is the whole slice.
//
// One group of kGroup threads per token, several tokens per block (a window
// is 128 cells: half a block's worth of work would idle); a window position's
// unit is looked up once and its row stored into every requested buffer
// (SwaForm::kPlain: the same row in all, the slot layouts; else each
// output's layer class has its own rows in the unit). Consecutive threads write consecutive
// cells.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/thread_groups.cuh"

namespace ukv::kernels {

// Every per-token load is issued before any is used (a padding token is not
// an early return but a window of 0), so the only wait before the table
// lookups is one memory round trip.
template <int kThreads, int kGroup, SwaForm kForm>
__global__ void paged_decode_indices_kernel(PagedDecodeParams p) {
  gpu::after_prior_kernels();
  const ThreadGroup g = thread_group<kThreads, kGroup>();
  const int32_t t = g.item;
  if (t >= p.num_tokens) return;
  const int32_t bid = p.batch_id[t];
  const int32_t pos = load_position(p.positions, t);
  const bool with_csa = p.csa.data != nullptr;
  const bool with_hca = p.hca.data != nullptr;
  const SliceBounds swa_bounds = slice_bounds(p.swa, t);
  const SliceBounds csa_bounds = with_csa ? slice_bounds(p.csa, t) : SliceBounds{0, 0};
  const SliceBounds hca_bounds = with_hca ? slice_bounds(p.hca, t) : SliceBounds{0, 0};
  const int64_t swa_end = p.swa.indptr[t + 1];
  const int64_t csa_end = with_csa ? p.csa.indptr[t + 1] : 0;
  const int64_t hca_end = with_hca ? p.hca.indptr[t + 1] : 0;

  const bool real = is_real_token(bid, p.swa_table.rows);
  const int32_t n = real ? swa_window_count(pos, p.window) : 0;
  const int32_t first = pos - n + 1;
  const TableRow units = table_row(p.swa_table, real ? bid : 0);
  constexpr bool kPlain = kForm == SwaForm::kPlain;
  SwaRowsOfPlace<kForm, 3> place{p.swa_rows};
  // Two cells a thread in flight in the plain form; the row-space forms keep
  // three rows a cell, and unrolling would cost them a third of their
  // occupancy (72 registers a thread against 48 in paged decode).
  constexpr int kUnroll = kPlain ? 2 : 1;
#pragma unroll kUnroll
  for (int32_t i = g.lane; i < n; i += kGroup) {
    const PagePlace at = page_place<kForm>(first + i, p.swa_rows[0].page);
    const uint32_t unit_row = unit_first_row<kForm>(swa_unit_at(units, at.col, p.swa_table.cols), p.swa_rows[0]);
    place.at(at.q);
    const int32_t row = place.row(0, unit_row);
    store_in_slice(p.swa, swa_bounds, swa_end - n + i, row);
    if (with_csa) store_in_slice(p.csa, csa_bounds, csa_end - n + i, kPlain ? row : place.row(1, unit_row));
    if (with_hca) store_in_slice(p.hca, hca_bounds, hca_end - n + i, kPlain ? row : place.row(2, unit_row));
  }
}

}  // namespace ukv::kernels
