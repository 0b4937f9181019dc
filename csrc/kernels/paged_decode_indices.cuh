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
// output's layer class has its own rows in the unit; store_swa_window).
// Consecutive threads write consecutive cells.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/swa_window_rows.cuh"
#include "kernels/thread_groups.cuh"

namespace ukv::kernels {

// Every per-token load is issued before any is used (a padding token is not
// an early return but a window of 0), so the only wait before the table
// lookups is one memory round trip.
// kMinBlocks: the blocks a multiprocessor must fit (nvcc caps the registers
// to fit them); 0 caps nothing.
template <int kThreads, int kGroup, SwaForm kForm, int kMinBlocks>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kMinBlocks) paged_decode_indices_kernel(PagedDecodeParams p) {
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
  store_swa_window<kGroup, kForm>(units, p.swa_table.cols, p.swa_rows, first, n, g.lane,
                                  [&](int32_t i, int32_t swa_row, int32_t csa_row, int32_t hca_row) {
                                    store_in_slice(p.swa, swa_bounds, swa_end - n + i, swa_row);
                                    if (with_csa) store_in_slice(p.csa, csa_bounds, csa_end - n + i, csa_row);
                                    if (with_hca) store_in_slice(p.hca, hca_bounds, hca_end - n + i, hca_row);
                                  });
}

}  // namespace ukv::kernels
