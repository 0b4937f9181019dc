// csa_translate_pack (SPEC §2.5): the indexer's sequence-local top-k entries
// become absolute unified_kv rows, packed at the head of each token's CSA slice
// [top-k (valid_k) | SWA (skip)]. valid_k is read back from the slice length,
// indptr[t+1] - indptr[t] - skip, and is the only barrier against the garbage
// the top-k kernel leaves past it (H-f).
//
// One block per (token, tile of kTile top-k lanes). The tile's top-k cells are
// staged in shared memory with coalesced loads, then written with aligned
// vector stores (store_run): loads follow the top-k row, stores follow the
// output's 16-byte grid, and the two need not line up.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/store_run.cuh"

namespace ukv::kernels {

// kLoadBeforeCount: small batches are latency-bound, so the top-k tile is read
// while the slice bounds are still in flight (one dependent memory round trip
// less); large batches read only the lanes below valid_k, saving bandwidth.
template <int kThreads, int kCellsPerThread, bool kLoadBeforeCount>
__global__ void csa_translate_pack_kernel(CsaTranslatePackParams p) {
  constexpr int32_t kTile = kThreads * kCellsPerThread;
  __shared__ int32_t staged[kTile];
  const int32_t t = blockIdx.x;
  const int32_t tile_start = blockIdx.y * kTile;
  const int32_t tile_lanes = min_i32(kTile, p.topk_width - tile_start);
  const int32_t* row = p.topk + t * p.topk_row_stride + tile_start * p.topk_col_stride;

  int32_t loaded[kCellsPerThread] = {};
  if (kLoadBeforeCount) {
#pragma unroll
    for (int j = 0; j < kCellsPerThread; ++j) {
      const int32_t i = threadIdx.x + j * kThreads;
      if (i < tile_lanes) loaded[j] = row[i * p.topk_col_stride];
    }
  }

  const int32_t bid = p.batch_id[t];
  if (!is_real_token(bid, p.table.rows)) return;
  const int32_t skip = p.skip ? p.skip[t] : swa_window_count(load_position(p.positions, t), p.window);
  const int64_t begin = p.out.indptr[t];
  const int64_t valid_k = min_i64(max_i64(p.out.indptr[t + 1] - begin - skip, 0), p.topk_width);
  const int32_t count = static_cast<int32_t>(min_i64(valid_k - tile_start, tile_lanes));
  if (count <= 0) return;

#pragma unroll
  for (int j = 0; j < kCellsPerThread; ++j) {
    const int32_t i = threadIdx.x + j * kThreads;
    if (i < count) staged[i] = kLoadBeforeCount ? loaded[j] : row[i * p.topk_col_stride];
  }
  __syncthreads();

  const SliceBounds bounds = slice_bounds(p.out, t);
  const auto row_of_lane = [&](int32_t i) {
    return compress_row(p.table, bid, staged[i], p.rows_per_block, p.compress_base);
  };
  store_run(p.out, bounds, begin + tile_start, count, row_of_lane, threadIdx.x, kThreads);
}

}  // namespace ukv::kernels
