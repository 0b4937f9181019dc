// hca_decode_indices (built on the host upstream): the head of each decode
// token's HCA slice [committed HCA | SWA] holds the rows of the sequence's
// committed HCA entries 0 .. n_committed - 1. As upstream, the count is per
// sequence, not capped per token; see hca_decode_count for the caps.
//
// One group of kGroup threads per (token, part of its entries): at small
// batches a token's entries are split into `parts` so a long context still
// spreads over the machine; at large batches a group is a whole token and a
// block serves several tokens.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/store_run.cuh"
#include "kernels/thread_groups.cuh"

namespace ukv::kernels {

template <int kThreads, int kGroup>
__global__ void hca_decode_indices_kernel(HcaDecodeParams p, int32_t parts) {
  gpu::after_prior_kernels();
  const ThreadGroup g = thread_group<kThreads, kGroup>();
  const int32_t t = g.item / parts;
  const int32_t part = g.item % parts;
  if (t >= p.num_tokens) return;
  const int32_t bid = p.batch_id[t];
  const SliceBounds bounds = slice_bounds(p.out, t);
  const int64_t begin = p.out.indptr[t];
  if (!is_real_token(bid, p.table.rows)) return;
  const int32_t n = hca_decode_count(p, t, bid);
  const int32_t part_len = (n + parts - 1) / parts;
  const int32_t lo = min_i32(part * part_len, n);
  const int32_t hi = min_i32(lo + part_len, n);
  const auto row_of_entry = [&](int32_t i) {
    return compress_row(p.table, bid, lo + i, p.rows_per_block, p.block_stride, p.compress_base);
  };
  store_run(p.out, bounds, begin + lo, hi - lo, row_of_entry, g.lane, kGroup);
}

}  // namespace ukv::kernels
