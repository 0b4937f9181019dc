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
template <typename ValueAt>
UKV_DEVICE void store_run(const SlicedOutput& out, const SliceBounds& bounds, int64_t start, int32_t count,
                          const ValueAt& value_at, int32_t lane, int32_t lanes) {
  if (count <= 0) return;
  const int64_t first_cell = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out.data) / sizeof(int32_t)) + start;
  const int32_t head = min_i32(static_cast<int32_t>((4 - (first_cell & 3)) & 3), count);
  const int32_t groups = (count - head) / 4;
  const int32_t tail_begin = head + 4 * groups;
  if (lane < head) store_in_slice(out, bounds, start + lane, value_at(lane));
  for (int32_t g = lane; g < groups; g += lanes) {
    const int32_t i = head + 4 * g;
    store_group_in_slice(out, bounds, start + i, make_int4(value_at(i), value_at(i + 1), value_at(i + 2), value_at(i + 3)));
  }
  if (tail_begin + lane < count) store_in_slice(out, bounds, start + tail_begin + lane, value_at(tail_begin + lane));
}

}  // namespace ukv::kernels
