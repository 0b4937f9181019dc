// hca_decode_indices (SPEC §2.4, done on the host in numpy upstream): the head
// of each decode token's HCA slice [committed HCA | SWA] holds the rows of the
// sequence's committed HCA entries 0 .. n_committed - 1. The count is per
// sequence in decode (H8); see hca_decode_count for the caps.
//
// Grid (token, part): at small batches a token's entries are split over
// gridDim.y blocks so a long context still spreads over the machine.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/store_run.cuh"

namespace ukv::kernels {

template <int kThreads>
__global__ void hca_decode_indices_kernel(HcaDecodeParams p) {
  const int32_t t = blockIdx.x;
  const int32_t bid = p.batch_id[t];
  if (!is_real_token(bid, p.table.rows)) return;
  const int32_t n = hca_decode_count(p, t, bid);
  const int32_t part_len = (n + gridDim.y - 1) / gridDim.y;
  const int32_t lo = min_i32(blockIdx.y * part_len, n);
  const int32_t hi = min_i32(lo + part_len, n);
  const auto row_of_entry = [&](int32_t i) {
    return compress_row(p.table, bid, lo + i, p.rows_per_block, p.compress_base);
  };
  store_run(p.out, slice_bounds(p.out, t), static_cast<int64_t>(p.out.indptr[t]) + lo, hi - lo, row_of_entry,
            threadIdx.x, kThreads);
}

}  // namespace ukv::kernels
