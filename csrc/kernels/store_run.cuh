// Cooperative store of a run of generated int32 values into one token's slice,
// with 16-byte vector stores wherever the destination is aligned. The index
// kernels are store-bound at large token counts, and a slice can start at any
// int32 offset, so the run is split into a scalar head up to the first 16-byte
// boundary, whole int4 groups, and a scalar tail.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

// Four cells from a 16-byte aligned cell on: one vector store when all four
// lie in the slice, else the ones that do, one by one.
UKV_DEVICE void store_group_in_slice(const SlicedOutput& out, const SliceBounds& bounds, int64_t cell, const int4& v) {
  if (cell >= bounds.lo && cell + 4 <= bounds.hi) {
    *reinterpret_cast<int4*>(out.data + cell) = v;
  } else {
    store_in_slice(out, bounds, cell, v.x);
    store_in_slice(out, bounds, cell + 1, v.y);
    store_in_slice(out, bounds, cell + 2, v.z);
    store_in_slice(out, bounds, cell + 3, v.w);
  }
}

// Whether out.data[cell] starts a 16-byte group.
UKV_DEVICE bool vector_aligned(const SlicedOutput& out, int64_t cell) {
  return (reinterpret_cast<uintptr_t>(out.data + cell) & 15) == 0;
}

// out.data[start + i] = value_at(i) for i in [0, count), shared by `lanes`
// threads (this one is `lane`; lanes >= 4). Cells outside `bounds` are dropped.
// group_at(i) gives the values of cells i .. i + 3 as one int4, for the whole
// groups; the overload without it builds them from value_at.
template <typename ValueAt, typename GroupAt>
UKV_DEVICE void store_run(const SlicedOutput& out, const SliceBounds& bounds, int64_t start, int32_t count,
                          const ValueAt& value_at, const GroupAt& group_at, int32_t lane, int32_t lanes) {
  if (count <= 0) return;
  const int64_t first_cell = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out.data) / sizeof(int32_t)) + start;
  const int32_t head = min_i32(static_cast<int32_t>((4 - (first_cell & 3)) & 3), count);
  const int32_t groups = (count - head) / 4;
  const int32_t tail_begin = head + 4 * groups;
  if (lane < head) store_in_slice(out, bounds, start + lane, value_at(lane));
  for (int32_t g = lane; g < groups; g += lanes) {
    const int32_t i = head + 4 * g;
    store_group_in_slice(out, bounds, start + i, group_at(i));
  }
  if (tail_begin + lane < count) store_in_slice(out, bounds, start + tail_begin + lane, value_at(tail_begin + lane));
}

template <typename ValueAt>
UKV_DEVICE void store_run(const SlicedOutput& out, const SliceBounds& bounds, int64_t start, int32_t count,
                          const ValueAt& value_at, int32_t lane, int32_t lanes) {
  const auto group_at = [&](int32_t i) {
    return make_int4(value_at(i), value_at(i + 1), value_at(i + 2), value_at(i + 3));
  };
  store_run(out, bounds, start, count, value_at, group_at, lane, lanes);
}

// compress_row of entries e .. e + 3 when k = 1 and the row is contiguous:
// base + data[e + j] * block_stride (1 in the slot layouts, the envelope in
// the row space), read with the two 16-byte loads that cover them instead of
// four scalar ones (paged_prefill's HCA runs, up to a context / 128 entries
// per token, are such runs; four scalar loads a lane left 56% of the row
// space's L2 sectors unused). The caller guarantees
// e >= 0 and e + 3 < row.cols; a load that would pass the row's last whole
// 16-byte group, or a row that does not start on one, falls back to scalars.
UKV_DEVICE int4 unit_k_group(const TableRow& row, int32_t e, int32_t block_stride, int32_t compress_base) {
  const uint32_t base = static_cast<uint32_t>(compress_base);
  const int32_t shift = e & 3;
  const int32_t q = e >> 2;
  const int32_t* data = row_start(row);
  int32_t v[4];
  if ((reinterpret_cast<uintptr_t>(data) & 15) == 0 && q + (shift ? 1 : 0) < row.cols / 4) {
    const int4* groups = reinterpret_cast<const int4*>(data);
    const int4 a = groups[q];
    const int4 b = shift ? groups[q + 1] : a;
    // A switch, not w[shift + j]: a register array indexed at run time would
    // live in local memory.
    switch (shift) {
      case 0: v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; break;
      case 1: v[0] = a.y; v[1] = a.z; v[2] = a.w; v[3] = b.x; break;
      case 2: v[0] = a.z; v[1] = a.w; v[2] = b.x; v[3] = b.y; break;
      default: v[0] = a.w; v[1] = b.x; v[2] = b.y; v[3] = b.z; break;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = data[e + j];
  }
  const uint32_t stride = static_cast<uint32_t>(block_stride);
  return make_int4(static_cast<int32_t>(base + static_cast<uint32_t>(v[0]) * stride),
                   static_cast<int32_t>(base + static_cast<uint32_t>(v[1]) * stride),
                   static_cast<int32_t>(base + static_cast<uint32_t>(v[2]) * stride),
                   static_cast<int32_t>(base + static_cast<uint32_t>(v[3]) * stride));
}

}  // namespace ukv::kernels
