// copy_spans: the byte copy under apply_row_copies, gather_rows and
// scatter_rows. A list holds spans: `rows` rows of row_bytes bytes, read
// from_stride bytes apart and written to_stride bytes apart.
//
// Every block copies an equal share of the list's bytes: the spans laid end
// to end form one byte range, and block b of G copies [b * total / G,
// (b + 1) * total / G) of it, whichever spans that covers. With one block
// per span instead, a step that moved 16 units kept 16 multiprocessors busy
// (9% of the device copy bandwidth), and a sequence's runs of unequal sizes
// left most blocks idle behind the largest. Each block finds its share from
// the sums of span bytes: thread t sums the spans of one contiguous group,
// a scan over the threads gives every group's end, a binary search the
// group where the block's share starts. No block waits on another.
//
// A share is copied in 16-byte vectors where both sides and the row size are
// 16-byte aligned (else byte by byte; the split points are rounded to the
// unit, the same way by the two blocks that meet there), four vectors in
// flight a thread; contiguous spans (both strides equal to the row size) as
// one flat range, without a division per vector.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

struct CopySpan {
  const uint8_t* from;
  uint8_t* to;
  int64_t from_stride;
  int64_t to_stride;
  int64_t rows;  // 0: nothing to copy
  int64_t row_bytes;
};

constexpr int32_t kCopyUnroll = 4;
// Blocks a multiprocessor the copy kernels are sized for (and fit: their
// registers are capped to).
constexpr int32_t kCopyBlocksPerSm = 4;

UKV_DEVICE uint64_t span_bytes(const CopySpan& s) {
  return s.rows > 0 ? static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.row_bytes) : 0;
}

// Units [first, first + n) of a span's rows, in units of sizeof(Unit) bytes:
// unit i lies in row i / per_row at column i % per_row (flat: one range). The
// indices start at the share's first row, so they fit 32 bits.
template <int kThreads, typename Unit>
UKV_DEVICE void copy_units(const CopySpan& s, uint64_t first, uint64_t n, bool flat) {
  const uint64_t per_row = static_cast<uint64_t>(s.row_bytes) / sizeof(Unit);
  const uint64_t first_row = flat ? 0 : first / per_row;
  const uint32_t skip = static_cast<uint32_t>(flat ? 0 : first - first_row * per_row);
  const uint8_t* from = s.from + (flat ? static_cast<int64_t>(first * sizeof(Unit))
                                       : static_cast<int64_t>(first_row) * s.from_stride);
  uint8_t* to = s.to + (flat ? static_cast<int64_t>(first * sizeof(Unit)) : static_cast<int64_t>(first_row) * s.to_stride);
  const uint32_t end = skip + static_cast<uint32_t>(n), row_units = static_cast<uint32_t>(per_row);
  const auto source = [&](uint32_t i) -> const Unit* {
    if (flat) return reinterpret_cast<const Unit*>(from) + i;
    const uint32_t r = i / row_units;
    return reinterpret_cast<const Unit*>(from + r * s.from_stride) + (i - r * row_units);
  };
  const auto target = [&](uint32_t i) -> Unit* {
    if (flat) return reinterpret_cast<Unit*>(to) + i;
    const uint32_t r = i / row_units;
    return reinterpret_cast<Unit*>(to + r * s.to_stride) + (i - r * row_units);
  };
  for (uint32_t i0 = skip + threadIdx.x; i0 < end; i0 += kCopyUnroll * kThreads) {
    Unit v[kCopyUnroll];
#pragma unroll
    for (int32_t u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = i0 + u * kThreads;
      if (i < end) v[u] = *source(i);
    }
#pragma unroll
    for (int32_t u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = i0 + u * kThreads;
      if (i < end) *target(i) = v[u];
    }
  }
}

// Bytes [lo, hi) of a span (its rows laid end to end), by the whole block.
template <int kThreads>
UKV_DEVICE void copy_piece(const CopySpan& s, uint64_t lo, uint64_t hi) {
  const bool flat = s.from_stride == s.row_bytes && s.to_stride == s.row_bytes;
  const uint64_t bits = reinterpret_cast<uintptr_t>(s.from) | reinterpret_cast<uintptr_t>(s.to) |
                        static_cast<uint64_t>(s.from_stride | s.to_stride | s.row_bytes);
  if ((bits & 15) == 0) {
    copy_units<kThreads, int4>(s, lo / 16, hi / 16 - lo / 16, flat);
  } else {
    copy_units<kThreads, uint8_t>(s, lo, hi - lo, flat);
  }
}

// Copies spans [0, n) given by span_at(i) (a CopySpan with rows 0 is skipped).
template <int kThreads, typename SpanAt>
UKV_DEVICE void copy_spans(int32_t n, const SpanAt& span_at) {
  if (n <= 0) return;
  __shared__ uint64_t group_end[kThreads];  // bytes of the spans of groups 0 .. t
  const int32_t tid = threadIdx.x;
  const int32_t per_group = (n + kThreads - 1) / kThreads;
  const int32_t group_first = static_cast<int32_t>(min_i64(static_cast<int64_t>(tid) * per_group, n));
  const int32_t group_last = static_cast<int32_t>(min_i64(static_cast<int64_t>(group_first) + per_group, n));
  uint64_t bytes = 0;
  for (int32_t i = group_first; i < group_last; ++i) bytes += span_bytes(span_at(i));
  group_end[tid] = bytes;
  __syncthreads();
  for (int32_t d = 1; d < kThreads; d *= 2) {  // inclusive scan
    const uint64_t before = tid >= d ? group_end[tid - d] : 0;
    __syncthreads();
    group_end[tid] += before;
    __syncthreads();
  }
  const uint64_t total = group_end[kThreads - 1], blocks = gridDim.x, b = blockIdx.x;
  // b * total / G without overflowing 64 bits.
  const uint64_t lo = total / blocks * b + total % blocks * b / blocks;
  const uint64_t hi = total / blocks * (b + 1) + total % blocks * (b + 1) / blocks;
  if (lo == hi) return;
  int32_t g = 0, top = kThreads - 1;  // the first group that ends past lo
  while (g < top) {
    const int32_t mid = (g + top) / 2;
    if (group_end[mid] > lo) top = mid; else g = mid + 1;
  }
  uint64_t start = g == 0 ? 0 : group_end[g - 1];
  for (int32_t i = g * per_group; i < n && start < hi; ++i) {
    const CopySpan s = span_at(i);
    const uint64_t end = start + span_bytes(s);
    if (end > lo && end > start) copy_piece<kThreads>(s, lo > start ? lo - start : 0, (hi < end ? hi : end) - start);
    start = end;
  }
}

}  // namespace ukv::kernels
