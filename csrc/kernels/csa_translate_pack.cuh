// csa_translate_pack: the indexer's sequence-local top-k entries
// become absolute unified_kv rows, packed at the head of each token's CSA slice
// [top-k (valid_k) | SWA (skip)]. valid_k is read back from the slice length,
// indptr[t+1] - indptr[t] - skip, and is the only barrier against the garbage
// the top-k kernel leaves past it (it writes only the valid lanes).
//
// One block per (token, tile of kTile top-k lanes). Every load a token needs
// (the tile's top-k cells, with 16-byte loads when the row allows, then its
// batch id, skip or position and slice bounds) is issued before any of them is
// used, so a block waits for one memory round trip before the table lookups.
// The order in the source is what makes that hold in the SASS: the compiler
// does not move a load above a branch or an early return, nor a use of a loaded
// value out of the branch region it was loaded in, so the top-k loads (which,
// unless the launcher found every row 16-byte loadable, branch between vector
// and scalar loads) come first, the skip input is converted only after every
// load, and a padding token returns only once all of them are out. Past that
// one round trip, the time goes to the instructions on the path from a
// token's loads to its lookups (every block is resident at once, and each
// scheduler's warps reach each instruction together): what the launcher can
// decide (table layout, top-k layout, where skip comes from) is a template
// argument rather than a test in that path.
//
// When the tile's first output cell is 16-byte aligned (every token's slice in
// a decode batch of full windows, most prefill tokens) each thread translates
// and stores the groups it loaded. Otherwise the cells below
// valid_k are staged in shared memory and written with aligned vector stores
// (store_run): loads follow the top-k row, stores the output's 16-byte grid,
// and the two need not line up. Lanes past valid_k are read and translated
// but never stored; that costs bandwidth only when a row is mostly invalid
// (short contexts), which is when the op is cheap anyway.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"
#include "kernels/store_run.cuh"

namespace ukv::kernels {

// Lane of the tile held in slot (v, q) of a thread: whole 4-lane groups, the
// threads of a block side by side, so that the vector loads are coalesced.
template <int kThreads>
UKV_DEVICE int32_t tile_lane(int v, int q) {
  return (v * kThreads + static_cast<int32_t>(threadIdx.x)) * 4 + q;
}

// The four lanes of one 16-byte group of top-k cells.
UKV_DEVICE void unpack_group(const int4& g, int32_t (&cells)[4]) {
  cells[0] = g.x;
  cells[1] = g.y;
  cells[2] = g.z;
  cells[3] = g.w;
}

// Token t's top-k cells of the tile from tile_start, this thread's kVectors
// groups of 4 lanes; lanes at or past tile_lanes are left 0. kVectorRows: the
// launcher has checked topk_rows_vectorizable, so every group is one
// predicated 16-byte load with no branch (a branch between vector and scalar
// loads here would sit before every load of the kernel) at a 32-bit offset.
template <int kThreads, int kVectors, bool kVectorRows>
UKV_DEVICE void load_topk_tile(const CsaTranslatePackParams& p, int32_t t, int32_t tile_start, int32_t tile_lanes,
                               int32_t (&cells)[kVectors][4]) {
  if constexpr (kVectorRows) {
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const int32_t lane = tile_lane<kThreads>(v, 0);
      const uint32_t offset = t * static_cast<int32_t>(p.topk_row_stride) + tile_start + lane;
      unpack_group(lane < tile_lanes ? *reinterpret_cast<const int4*>(p.topk + offset) : make_int4(0, 0, 0, 0),
                   cells[v]);
    }
  } else {
    const int32_t* row = p.topk + t * p.topk_row_stride + tile_start * p.topk_col_stride;
    const bool vector_loads = p.topk_col_stride == 1 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const int32_t lane = tile_lane<kThreads>(v, 0);
      if (vector_loads && lane + 4 <= tile_lanes) {
        unpack_group(*reinterpret_cast<const int4*>(row + lane), cells[v]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) cells[v][q] = lane + q < tile_lanes ? row[(lane + q) * p.topk_col_stride] : 0;
      }
    }
  }
}

// The translated rows of this thread's cells, for the aligned path. Every
// lookup is issued before any store (a store may alias the table as far as
// the compiler knows, and would hold back the loads after it), and none sits
// behind a branch or a test of count, so the loads of all cells share one
// basic block and go out together. A lane at or past count translates the
// garbage the top-k row holds there: compress_row clamps it into the table
// row, and the caller stores only the lanes below count.
template <int kVectors, typename RowOf>
UKV_DEVICE void translate_tile(const int32_t (&cells)[kVectors][4], const RowOf& row_of,
                               int32_t (&rows)[kVectors][4]) {
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
#pragma unroll
    for (int q = 0; q < 4; ++q) rows[v][q] = row_of(cells[v][q]);
  }
}

// Where a token's skip comes from. A template argument rather than a test of
// which pointer is set: the kernel then loads one value with no predicates
// and converts it with no selects, about twenty instructions fewer between a
// token's loads and its table lookups (the path every lookup waits on).
enum class SkipSource { kPositionsI32, kPositionsI64, kPerToken };

inline SkipSource skip_source(const CsaTranslatePackParams& p) {
  if (p.skip) return SkipSource::kPerToken;
  return p.positions.i64 ? SkipSource::kPositionsI64 : SkipSource::kPositionsI32;
}

// The one value a token's skip is made from, loaded (widened only to carry
// either dtype; its use comes after the token's other loads are out).
template <SkipSource kSource>
UKV_DEVICE int64_t load_skip_input(const CsaTranslatePackParams& p, int32_t t) {
  if (kSource == SkipSource::kPerToken) return p.skip[t];
  if (kSource == SkipSource::kPositionsI64) return p.positions.i64[t];
  return p.positions.i32[t];
}

template <SkipSource kSource>
UKV_DEVICE int32_t skip_of(int64_t loaded, int32_t window) {
  if (kSource == SkipSource::kPerToken) return static_cast<int32_t>(loaded);
  return swa_window_count(clamp_position(loaded), window);
}

template <int kThreads, int kVectors, bool kCompact, bool kVectorRows, SkipSource kSource>
__global__ void csa_translate_pack_kernel(CsaTranslatePackParams p) {
  gpu::after_prior_kernels();
  constexpr int32_t kTile = kThreads * kVectors * 4;
  __shared__ int32_t staged[kTile];
  const int32_t t = blockIdx.x;
  const int32_t tile_start = blockIdx.y * kTile;
  const int32_t tile_lanes = min_i32(kTile, p.topk_width - tile_start);

  int32_t cells[kVectors][4];
  load_topk_tile<kThreads, kVectors, kVectorRows>(p, t, tile_start, tile_lanes, cells);
  const int32_t bid = p.batch_id[t];
  const int64_t skip_input = load_skip_input<kSource>(p, t);
  const int64_t begin = p.out.indptr[t];
  const int64_t end = p.out.indptr[t + 1];

  const int32_t skip = skip_of<kSource>(skip_input, p.window);
  // In 32 bits once clamped: 64-bit arithmetic costs two to three
  // instructions an operation, on the path every lookup waits for.
  const int32_t valid_k = static_cast<int32_t>(min_i64(max_i64(end - begin - skip, 0), p.topk_width));
  const int32_t count = min_i32(valid_k - tile_start, tile_lanes);
  if (!is_real_token(bid, p.table.rows) || count <= 0) return;
  const SliceBounds bounds = slice_bounds(p.out, t);

  const TableRow row = table_row(p.table, bid);
  const auto row_of = [&](int32_t entry) {
    return compress_row<kCompact>(row, entry, p.rows_per_block, p.block_stride, p.compress_base);
  };
  const int64_t first = begin + tile_start;
  if (vector_aligned(p.out, first)) {
    // The tile's cells fall on the output's 16-byte grid as they were loaded:
    // every thread translates and stores its own groups, no staging.
    // Whether the tile's count cells lie in the slice, as they do unless the
    // indptr is out of order or past the output: then no store needs its own
    // bounds check (64-bit compares, on the path every store waits for).
    const bool inside = first >= bounds.lo && first + count <= bounds.hi;
    int32_t rows[kVectors][4];
    translate_tile(cells, row_of, rows);
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const int32_t lane = tile_lane<kThreads>(v, 0);
      const int4 group = make_int4(rows[v][0], rows[v][1], rows[v][2], rows[v][3]);
      if (lane + 4 <= count) {
        if (inside) {
          *reinterpret_cast<int4*>(p.out.data + first + lane) = group;
        } else {
          store_group_in_slice(p.out, bounds, first + lane, group);
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (lane + q < count) store_in_slice(p.out, bounds, first + lane + q, rows[v][q]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int32_t lane = tile_lane<kThreads>(v, q);
      if (lane < count) staged[lane] = cells[v][q];
    }
  }
  __syncthreads();
  store_run(p.out, bounds, first, count, [&](int32_t i) { return row_of(staged[i]); }, threadIdx.x, kThreads);
}

}  // namespace ukv::kernels
