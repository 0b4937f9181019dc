// copy_spans: the byte copy under apply_row_copies, gather_rows and
// scatter_rows. A list holds spans: `rows` rows of row_bytes bytes, read
// from_stride bytes apart and written to_stride bytes apart.
//
// Every block of the grid takes part in every span. Spans are cut into chunks
// of about kChunkBytes, the chunks are numbered across the list, and block b
// copies chunks b, b + G, b + 2G, ... (G blocks). With one block per span, a
// step that moves 16 units kept 16 multiprocessors busy and reached 9% of the
// device copy bandwidth; chunks spread any list, a few large spans or many
// small ones, over the whole GPU. The numbering is a scan of the chunk counts
// of kThreads spans at a time (block_scan.cuh), which every block does alike,
// so no block waits on another.
//
// A chunk is copied by its whole block in 16-byte vectors where both sides
// and the row size are 16-byte aligned (else byte by byte), kUnroll vectors a
// thread in flight at once; contiguous spans (both strides equal to the row
// size) are copied as one flat range with no per-vector division.
#pragma once

#include <cstdint>

#include "kernels/block_scan.cuh"
#include "kernels/compat.h"

namespace ukv::kernels {

struct CopySpan {
  const uint8_t* from;
  uint8_t* to;
  int64_t from_stride;
  int64_t to_stride;
  int64_t rows;  // 0: nothing to copy
  int64_t row_bytes;
};

constexpr int64_t kChunkBytes = 32 << 10;
// At most this many chunks a span (larger spans get larger chunks), so the
// uint32 chunk numbering of kThreads spans never wraps.
constexpr int64_t kMaxChunksPerSpan = 1 << 22;
constexpr int32_t kCopyUnroll = 4;

UKV_DEVICE int64_t chunk_rows_of(const CopySpan& s) {
  const int64_t by_bytes = kChunkBytes / s.row_bytes > 0 ? kChunkBytes / s.row_bytes : 1;
  const int64_t by_count = (s.rows + kMaxChunksPerSpan - 1) / kMaxChunksPerSpan;
  return by_bytes > by_count ? by_bytes : by_count;
}

// n units of kUnit bytes from `from` to `to`, unit i of row i / per_row at
// column i % per_row (per_row == 0: one flat range).
template <int kThreads, typename Unit>
UKV_DEVICE void copy_units(const uint8_t* from, int64_t from_stride, uint8_t* to, int64_t to_stride, uint32_t n,
                           uint32_t per_row) {
  const auto from_at = [&](uint32_t i) -> const Unit* {
    if (per_row == 0) return reinterpret_cast<const Unit*>(from) + i;
    const uint32_t r = i / per_row;
    return reinterpret_cast<const Unit*>(from + r * from_stride) + (i - r * per_row);
  };
  const auto to_at = [&](uint32_t i) -> Unit* {
    if (per_row == 0) return reinterpret_cast<Unit*>(to) + i;
    const uint32_t r = i / per_row;
    return reinterpret_cast<Unit*>(to + r * to_stride) + (i - r * per_row);
  };
  for (uint32_t i0 = threadIdx.x; i0 < n; i0 += kCopyUnroll * kThreads) {
    Unit v[kCopyUnroll];
#pragma unroll
    for (int32_t u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = i0 + u * kThreads;
      if (i < n) v[u] = *from_at(i);
    }
#pragma unroll
    for (int32_t u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = i0 + u * kThreads;
      if (i < n) *to_at(i) = v[u];
    }
  }
}

// Rows [first, first + rows) of span s, by the whole block.
template <int kThreads>
UKV_DEVICE void copy_chunk(const CopySpan& s, int64_t first, int64_t rows) {
  const uint8_t* from = s.from + first * s.from_stride;
  uint8_t* to = s.to + first * s.to_stride;
  const bool flat = s.from_stride == s.row_bytes && s.to_stride == s.row_bytes;
  const uint64_t bits = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
                        static_cast<uint64_t>(s.from_stride | s.to_stride | s.row_bytes);
  if ((bits & 15) == 0) {
    const uint32_t per_row = static_cast<uint32_t>(s.row_bytes / 16);
    copy_units<kThreads, int4>(from, s.from_stride, to, s.to_stride, static_cast<uint32_t>(rows * per_row),
                               flat ? 0 : per_row);
  } else {
    const uint32_t per_row = static_cast<uint32_t>(s.row_bytes);
    copy_units<kThreads, uint8_t>(from, s.from_stride, to, s.to_stride, static_cast<uint32_t>(rows * per_row),
                                  flat ? 0 : per_row);
  }
}

template <int kThreads>
struct SpanShared {
  ScanShared<kThreads, 1> scan;
  CopySpan span[kThreads];
  int64_t chunk_rows[kThreads];
};

// Copies spans [0, n) given by span_at(i) (a CopySpan with rows 0 is
// skipped). A chunk is at most kChunkBytes or a single row, so its units are
// counted in uint32 for any row below 4 GiB.
template <int kThreads, typename SpanAt>
UKV_DEVICE void copy_spans(int32_t n, const SpanAt& span_at) {
  __shared__ SpanShared<kThreads> sh;
  const int32_t tid = threadIdx.x;
  const uint32_t grid = gridDim.x, block = blockIdx.x;
  uint64_t done = 0;  // chunks numbered by earlier passes
  for (int32_t base = 0; base < n; base += kThreads) {
    CopySpan s{nullptr, nullptr, 0, 0, 0, 1};
    if (tid < n - base) s = span_at(base + tid);
    const int64_t chunk_rows = s.rows > 0 ? chunk_rows_of(s) : 1;
    const uint32_t chunks = s.rows > 0 ? static_cast<uint32_t>((s.rows + chunk_rows - 1) / chunk_rows) : 0;
    sh.span[tid] = s;
    sh.chunk_rows[tid] = chunk_rows;
    sh.scan.value[0][bank_padded(tid)] = 0;
    sh.scan.value[0][bank_padded(kThreads + tid)] = chunks;
    __syncthreads();
    raking_scan<kThreads, 1>(sh.scan);
    const uint32_t total = sh.scan.value[0][bank_padded(2 * kThreads - 1)];
    // This block's first chunk of the pass: the next c >= done with c % grid == block.
    for (uint32_t c = static_cast<uint32_t>((block + grid - done % grid) % grid); c < total; c += grid) {
      int32_t lo = 0, hi = kThreads - 1;  // the first span whose inclusive count exceeds c
      while (lo < hi) {
        const int32_t mid = (lo + hi) / 2;
        if (sh.scan.value[0][bank_padded(kThreads + mid)] > c) hi = mid; else lo = mid + 1;
      }
      const CopySpan& span = sh.span[lo];
      const uint32_t before = lo == 0 ? 0 : sh.scan.value[0][bank_padded(kThreads + lo - 1)];
      const int64_t first = static_cast<int64_t>(c - before) * sh.chunk_rows[lo];
      const int64_t rows = span.rows - first < sh.chunk_rows[lo] ? span.rows - first : sh.chunk_rows[lo];
      copy_chunk<kThreads>(span, first, rows);
    }
    done += total;
    __syncthreads();  // the next pass rewrites the spans and the scan
  }
}

}  // namespace ukv::kernels
