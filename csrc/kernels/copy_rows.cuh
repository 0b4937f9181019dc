// copy_rows: the byte copy under apply_row_copies, gather_rows and
// scatter_rows. One thread block copies `rows` rows of row_bytes bytes from
// rows from_stride bytes apart to rows to_stride bytes apart, its threads
// striding over the rows' 16-byte groups together (a run of short rows keeps
// every thread busy), or over single bytes where a row, a stride or a base
// address is not 16-byte aligned.
#pragma once

#include <cstdint>

#include "kernels/compat.h"

namespace ukv::kernels {

template <int kThreads>
__device__ __forceinline__ void copy_rows(const uint8_t* from, int64_t from_stride, uint8_t* to, int64_t to_stride,
                                          int64_t rows, int64_t row_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
                        static_cast<uint64_t>(from_stride | to_stride | row_bytes);
  const bool vector = (bits & 15) == 0;
  const int64_t unit = vector ? 16 : 1, per_row = row_bytes / unit;
  for (int64_t j = threadIdx.x; j < rows * per_row; j += kThreads) {
    const int64_t r = j / per_row, c = (j - r * per_row) * unit;
    if (vector)
      *reinterpret_cast<int4*>(to + r * to_stride + c) = *reinterpret_cast<const int4*>(from + r * from_stride + c);
    else
      to[r * to_stride + c] = from[r * from_stride + c];
  }
}

}  // namespace ukv::kernels
