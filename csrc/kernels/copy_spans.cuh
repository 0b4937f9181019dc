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
// The grid is one wave, so a block's prelude (finding its share and laying
// out its pieces) is not hidden behind other blocks' copies: it is a chain
// of dependent steps, and its length is the kernel's overhead over a plain
// copy. The scans therefore go through lane shuffles (three barriers, not
// two per step), and the share's bounds take a 32-bit division where the
// list's bytes fit 32 bits.
//
// A block then copies its share as one flat range of units, whatever spans
// it crosses: it lays the pieces of up to kThreads spans in shared memory,
// and each group of 32 threads copies stretches of 32 * kCopyUnroll
// consecutive units, kCopyUnroll loads in flight a thread. A stretch inside
// one contiguous, 16-byte piece (nearly all of them: pieces are KiBs) is
// copied from two pointers found once; only a stretch across pieces, or in
// a strided or byte piece, finds each unit's piece and place. Finding them
// for every unit cost more instructions than the copy itself: 16 unit moves
// ran at half the speed of a plain copy of their bytes.
// Units are 16-byte vectors where both sides and the row size are 16-byte
// aligned, else bytes (the split points are rounded to the unit, the same
// way by the two blocks that meet there); contiguous spans (both strides
// equal to the row size) are one flat range, without a division per unit.
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

constexpr int32_t kCopyUnroll = 8;
// Spans a thread sums at once while finding the block's share.
constexpr int32_t kSumsInFlight = 4;
// Blocks a multiprocessor the copy kernels are sized for (and fit: their
// registers are capped to).
constexpr int32_t kCopyBlocksPerSm = 3;

UKV_DEVICE uint64_t span_bytes(const CopySpan& s) {
  return s.rows > 0 ? static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.row_bytes) : 0;
}

// The part of one span inside a block's share, from the span's unit `first`
// (its rows laid end to end) on.
struct CopyPiece {
  const uint8_t* from;
  uint8_t* to;
  int64_t from_stride;
  int64_t to_stride;
  uint64_t first;
  uint32_t row_units;
  uint32_t shift;  // log2 of the unit's bytes: 4 (16-byte vectors) or 0 (bytes)
  bool flat;
};

// Where block b's share of total bytes starts: b * total / G, without
// overflowing 64 bits, and with one 64-bit division (a 32-bit one where
// total fits 32 bits).
UKV_DEVICE uint64_t share_start(uint64_t total, uint32_t b) {
  const uint32_t blocks = gridDim.x;
  if ((total >> 32) == 0) {
    const uint32_t t = static_cast<uint32_t>(total), whole = t / blocks, rest = t - whole * blocks;
    return static_cast<uint64_t>(whole) * b + static_cast<uint64_t>(rest) * b / blocks;
  }
  const uint64_t whole = total / blocks;
  const uint32_t rest = static_cast<uint32_t>(total - whole * blocks);  // < G: rest * b / G is a small division
  return whole * b + static_cast<uint64_t>(rest) * b / blocks;
}

// Inclusive prefix sums of cells[0, kThreads), by the whole block. Every
// thread has written its cell before; every thread may read any cell after.
// Each group of 32 threads scans its cells by shuffles, then adds the totals
// of the groups before it.
template <int kThreads>
UKV_DEVICE void block_inclusive_scan(uint64_t* cells) {
  constexpr int32_t kGroups = kThreads / 32;
  static_assert(kThreads % 64 == 0, "blocks are whole wavefronts on AMD and whole warps on NVIDIA");
  __shared__ uint64_t group_total[kGroups];
  const int32_t tid = threadIdx.x, lane = tid % 32, group = tid / 32;
  __syncthreads();
  uint64_t x = cells[tid];
#pragma unroll
  for (int32_t d = 1; d < 32; d *= 2) {
    const uint64_t below = gpu::shfl_up_in_32(x, d);
    if (lane >= d) x += below;
  }
  if (lane == 31) group_total[group] = x;
  __syncthreads();
#pragma unroll
  for (int32_t g = 0; g < kGroups; ++g) x += g < group ? group_total[g] : 0;
  cells[tid] = x;
  __syncthreads();
}

// Span s's part of the block's share [lo, hi), s covering [begin, begin + bytes).
UKV_DEVICE CopyPiece piece_of(const CopySpan& s, uint64_t begin, uint64_t lo, uint64_t hi, uint64_t* units) {
  const uint64_t bytes = span_bytes(s), end = begin + bytes;
  const uint64_t bits = reinterpret_cast<uintptr_t>(s.from) | reinterpret_cast<uintptr_t>(s.to) |
                        static_cast<uint64_t>(s.from_stride | s.to_stride | s.row_bytes);
  const uint32_t shift = (bits & 15) == 0 ? 4 : 0;
  const bool inside = bytes > 0 && end > lo && begin < hi;
  const uint64_t a = inside && lo > begin ? lo - begin : 0, b = inside ? (hi < end ? hi : end) - begin : 0;
  *units = (b >> shift) - (a >> shift);
  return {s.from, s.to, s.from_stride, s.to_stride, a >> shift,
          static_cast<uint32_t>(static_cast<uint64_t>(s.row_bytes) >> shift), shift,
          s.from_stride == s.row_bytes && s.to_stride == s.row_bytes};
}

// Unit u of piece c (u counted from the piece's first unit): where it is
// read and written.
UKV_DEVICE void locate(const CopyPiece& c, uint64_t u, const uint8_t** from, uint8_t** to) {
  const uint64_t unit = c.first + u;
  if (c.flat) {
    *from = c.from + (unit << c.shift);
    *to = c.to + (unit << c.shift);
    return;
  }
  // 32-bit division where the unit index fits, as it does below 64 GiB a span.
  const uint64_t row = unit >> 32 ? unit / c.row_units : static_cast<uint32_t>(unit) / c.row_units;
  const uint64_t column = (unit - row * c.row_units) << c.shift;
  *from = c.from + static_cast<int64_t>(row) * c.from_stride + column;
  *to = c.to + static_cast<int64_t>(row) * c.to_stride + column;
}

// Copies units [0, unit_end[kThreads - 1]) of the pieces, piece p holding
// units [unit_end[p - 1], unit_end[p]). Group g of 32 threads copies the
// stretches g, g + kThreads / 32, ... of 32 * kCopyUnroll units; its cursor
// into the pieces only moves forward.
template <int kThreads>
UKV_DEVICE void copy_pieces(const CopyPiece* pieces, const uint64_t* unit_end) {
  constexpr uint64_t kStretch = 32 * kCopyUnroll;
  const uint64_t total = unit_end[kThreads - 1];
  const int32_t lane = threadIdx.x % 32;
  const auto first_unit = [&](int32_t p) { return p > 0 ? unit_end[p - 1] : 0; };
  int32_t p = 0;
  for (uint64_t s0 = threadIdx.x / 32 * kStretch; s0 < total; s0 += kStretch * (kThreads / 32)) {
    while (unit_end[p] <= s0) ++p;
    const CopyPiece& c = pieces[p];
    if (s0 + kStretch <= unit_end[p] && c.flat && c.shift == 4) {  // the stretch lies in one flat 16-byte piece
      const uint64_t at = c.first + (s0 - first_unit(p)) + lane;
      const int4* from = reinterpret_cast<const int4*>(c.from) + at;
      int4* to = reinterpret_cast<int4*>(c.to) + at;
      int4 v[kCopyUnroll];
#pragma unroll
      for (int32_t k = 0; k < kCopyUnroll; ++k) v[k] = from[k * 32];
#pragma unroll
      for (int32_t k = 0; k < kCopyUnroll; ++k) to[k * 32] = v[k];
      continue;
    }
    // Unit by unit, half a stretch at a time (the registers of a whole
    // stretch's places would spill).
    constexpr int32_t kHalf = kCopyUnroll / 2;
    int32_t q = p;
    for (int32_t h = 0; h < kCopyUnroll; h += kHalf) {
      int4 v[kHalf];
      int32_t piece[kHalf];
#pragma unroll
      for (int32_t k = 0; k < kHalf; ++k) {
        const uint64_t j = s0 + (h + k) * 32 + lane;
        piece[k] = -1;
        if (j >= total) continue;
        while (unit_end[q] <= j) ++q;
        const CopyPiece& d = pieces[q];
        const uint8_t* from;
        uint8_t* to;
        locate(d, j - first_unit(q), &from, &to);
        piece[k] = q;
        if (d.shift == 4) v[k] = *reinterpret_cast<const int4*>(from); else v[k].x = *from;
      }
#pragma unroll
      for (int32_t k = 0; k < kHalf; ++k) {
        if (piece[k] < 0) continue;
        const CopyPiece& d = pieces[piece[k]];
        const uint8_t* from;
        uint8_t* to;
        locate(d, s0 + (h + k) * 32 + lane - first_unit(piece[k]), &from, &to);
        if (d.shift == 4) *reinterpret_cast<int4*>(to) = v[k]; else *to = static_cast<uint8_t>(v[k].x);
      }
    }
  }
}

// Copies span s's part of the share [lo, hi), every thread its own span,
// span s beginning at byte `begin` of the list. sums and pieces are its
// shared scratch: every thread is done with them when it returns.
template <int kThreads>
UKV_DEVICE void copy_batch(const CopySpan& s, uint64_t begin, uint64_t lo, uint64_t hi, uint64_t* sums,
                           CopyPiece* pieces) {
  uint64_t units = 0;
  const CopyPiece piece = piece_of(s, begin, lo, hi, &units);
  __syncthreads();  // every thread has read the byte sums
  pieces[threadIdx.x] = piece;
  sums[threadIdx.x] = units;
  block_inclusive_scan<kThreads>(sums);
  copy_pieces<kThreads>(pieces, sums);
  __syncthreads();  // every thread is done with the pieces
}

// Copies spans [0, n) given by span_at(i) (a CopySpan with rows 0 is skipped).
template <int kThreads, typename SpanAt>
UKV_DEVICE void copy_spans(int32_t n, const SpanAt& span_at) {
  if (n <= 0) return;
  __shared__ uint64_t sums[kThreads];
  __shared__ CopyPiece pieces[kThreads];
  const int32_t tid = threadIdx.x;
  constexpr CopySpan kNone{nullptr, nullptr, 0, 0, 0, 1};
  if (n <= kThreads) {  // a span a thread: their sums find the share, and the spans are at hand
    const CopySpan s = tid < n ? span_at(tid) : kNone;
    sums[tid] = span_bytes(s);
    block_inclusive_scan<kThreads>(sums);
    const uint64_t total = sums[kThreads - 1];
    const uint64_t lo = share_start(total, blockIdx.x), hi = share_start(total, blockIdx.x + 1);
    if (lo < hi) copy_batch<kThreads>(s, sums[tid] - span_bytes(s), lo, hi, sums, pieces);
    return;
  }
  // The block's share, and the group of spans it starts in.
  const int32_t per_group = (n + kThreads - 1) / kThreads;
  const int32_t group_first = static_cast<int32_t>(min_i64(static_cast<int64_t>(tid) * per_group, n));
  const int32_t group_last = static_cast<int32_t>(min_i64(static_cast<int64_t>(group_first) + per_group, n));
  uint64_t bytes = 0;
  for (int32_t i = group_first; i < group_last; i += kSumsInFlight) {  // the loads of kSumsInFlight spans at once
    uint64_t b[kSumsInFlight];
#pragma unroll
    for (int32_t k = 0; k < kSumsInFlight; ++k) b[k] = i + k < group_last ? span_bytes(span_at(i + k)) : 0;
#pragma unroll
    for (int32_t k = 0; k < kSumsInFlight; ++k) bytes += b[k];
  }
  sums[tid] = bytes;
  block_inclusive_scan<kThreads>(sums);
  const uint64_t total = sums[kThreads - 1];
  const uint64_t lo = share_start(total, blockIdx.x), hi = share_start(total, blockIdx.x + 1);
  if (lo == hi) return;
  int32_t g = 0, top = kThreads - 1;  // the first group that ends past lo
  while (g < top) {
    const int32_t mid = (g + top) / 2;
    if (sums[mid] > lo) top = mid; else g = mid + 1;
  }
  uint64_t base = g == 0 ? 0 : sums[g - 1];  // bytes before span `first`
  // The spans from there on, kThreads at a time, until the share ends.
  for (int32_t first = g * per_group; first < n && base < hi; first += kThreads) {
    const int32_t i = first + tid;
    const CopySpan s = i < n ? span_at(i) : kNone;
    __syncthreads();  // every thread is done with the group sums
    sums[tid] = span_bytes(s);
    block_inclusive_scan<kThreads>(sums);
    const uint64_t batch_end = base + sums[kThreads - 1];
    copy_batch<kThreads>(s, base + sums[tid] - span_bytes(s), lo, hi, sums, pieces);
    base = batch_end;
  }
}

}  // namespace ukv::kernels
