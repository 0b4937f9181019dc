// paged_prefill_indices: the four prefill index buffers of each
// token, from its position, its chunk start and the SWA and HCA block tables:
// - extend: rows of the forward's own kv for the in-chunk part of the window;
// - dense SWA prefix: the window rows from earlier chunks (whole slice);
// - CSA prefix [top-k | SWA prefix]: the SWA prefix at the slice tail, clear
//   of the head, which is csa_translate_pack's (skip = prefix_swa_count);
// - HCA prefix [SWA prefix | HCA]: the SWA prefix at the head, then the rows of
//   the first min((pos + 1) / hca_ratio, n_committed) HCA entries, so no token
//   reads an entry covering later positions. This is the opposite order of
//   the HCA decode slice, as upstream's attention expects.
//
// One group of kGroup threads per token, several tokens per block (a token's
// cells are too few to keep a whole block busy). The HCA run, up to a whole
// context / hca_ratio per token, is the bulk of the bytes; it and the extend
// run go through vector stores, and with k = 1 (V4's HCA) the HCA run's table
// reads are 16-byte loads too (unit_k_group).
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/store_run.cuh"
#include "kernels/swa_window_rows.cuh"
#include "kernels/thread_groups.cuh"

namespace ukv::kernels {

// Nine blocks a multiprocessor: the HCA run's loads want every warp that fits,
// and the slot form's 50 registers give nine; the row-space forms would take
// 60 and fit eight.
template <int kThreads, int kGroup, SwaForm kForm>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, 9) paged_prefill_indices_kernel(PagedPrefillParams p) {
  gpu::after_prior_kernels();
  const ThreadGroup g = thread_group<kThreads, kGroup>();
  const int32_t t = g.item;
  if (t >= p.num_tokens) return;
  // The token's own loads first, all at once; the sequence's follow its batch id.
  const int32_t bid = p.batch_id[t];
  const int32_t pos = load_position(p.positions, t);
  const SliceBounds extend_bounds = slice_bounds(p.extend, t);
  const SliceBounds swa_bounds = slice_bounds(p.swa, t);
  const SliceBounds csa_bounds = slice_bounds(p.csa, t);
  const SliceBounds hca_bounds = slice_bounds(p.hca, t);
  const int64_t extend_begin = p.extend.indptr[t];
  const int64_t swa_begin = p.swa.indptr[t];
  const int64_t csa_end = p.csa.indptr[t + 1];
  const int64_t hca_begin = p.hca.indptr[t];
  if (!is_real_token(bid, p.swa_table.rows)) return;
  const PrefillWindow w = prefill_window(pos, p.chunk_start[bid], p.window);
  const int32_t n_hca = prefill_hca_count(p, pos, bid);
  const int32_t first_extend_row = p.query_start[bid] + w.pos_in_chunk - w.extend_count + 1;

  store_run(p.extend, extend_bounds, extend_begin, w.extend_count, [&](int32_t i) { return first_extend_row + i; },
            g.lane, kGroup);

  const int64_t csa_tail = csa_end - w.prefix_swa_count;
  const TableRow units = table_row(p.swa_table, bid);
  store_swa_window<kGroup, kForm>(units, p.swa_table.cols, p.swa_rows, w.swa_low, w.prefix_swa_count, g.lane,
                                  [&](int32_t i, int32_t swa_row, int32_t csa_row, int32_t hca_row) {
                                    store_in_slice(p.swa, swa_bounds, swa_begin + i, swa_row);
                                    store_in_slice(p.csa, csa_bounds, csa_tail + i, csa_row);
                                    store_in_slice(p.hca, hca_bounds, hca_begin + i, hca_row);
                                  });

  const TableRow hca_row = table_row(p.hca_table, bid);
  const auto row_of_entry = [&](int32_t e) {
    return compress_row(hca_row, e, p.hca_rows_per_block, p.hca_block_stride, p.compress_base);
  };
  const int64_t hca_start = hca_begin + w.prefix_swa_count;
  if (p.hca_rows_per_block.value == 1 && hca_row.col_stride == 1) {
    // n_hca <= cols (prefill_hca_count), so every group lies inside the row.
    const auto group_at = [&](int32_t e) { return unit_k_group(hca_row, e, p.hca_block_stride, p.compress_base); };
    store_run(p.hca, hca_bounds, hca_start, n_hca, row_of_entry, group_at, g.lane, kGroup);
  } else {
    store_run(p.hca, hca_bounds, hca_start, n_hca, row_of_entry, g.lane, kGroup);
  }
}

}  // namespace ukv::kernels
