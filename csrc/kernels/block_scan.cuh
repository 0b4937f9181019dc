// A block-wide inclusive scan in shared memory (raking_scan), for blocks of
// 128 to 1024 threads. No warp intrinsics, so any wavefront width works; sums
// are uint32 and wrap modulo 2^32. Used by the index metadata builders (each
// token's slice lengths into indptrs) and by copy_spans (chunk numbering).
#pragma once

#include <cstdint>

#include "kernels/compat.h"

namespace ukv::kernels {

constexpr int32_t kScanMinThreads = 128;
constexpr int32_t kScanMaxThreads = 1024;
// Threads that serially sum runs of a pass's scan values: every thread up to
// 256, so runs stay short (2 slots up to 256 threads, 4 at 512, 8 at 1024), and
// never more than the 4^4 = 256 that the radix-4 scan of their run totals
// covers in four barriers. 128 rakers for every block size cost T=512 0.2 us
// (runs of 8).
template <int kThreads>
constexpr int32_t kScanRakers = kThreads < 256 ? kThreads : 256;
// Shared memory has 32 four-byte banks on NVIDIA and on AMD CDNA alike; one
// pad word per 32 keeps the rakers' strided reads free of bank conflicts (only
// the speed depends on it).
constexpr int32_t kSharedBanks = 32;

UKV_DEVICE int32_t bank_padded(int32_t i) { return i + i / kSharedBanks; }

template <int kFields>
struct Sums {
  uint32_t v[kFields];
  UKV_DEVICE uint32_t& operator[](int i) { return v[i]; }
  UKV_DEVICE const uint32_t& operator[](int i) const { return v[i]; }
};

template <int kThreads, int kFields>
struct ScanShared {
  static constexpr int32_t kSlots = 2 * kThreads;
  uint32_t value[kFields][kSlots + kSlots / kSharedBanks];  // at bank_padded(slot)
  uint32_t run[2][kFields][kScanRakers<kThreads>];  // run totals, double-buffered
};

// Scans the 2 * kThreads values of s.value: slots [0, kThreads) hold the
// threads' carries, which are only summed, slots [kThreads, 2 * kThreads) the
// pass's token counts. On return slot kThreads + i holds the sum of all
// carries plus the counts up to token i (inclusive), so the block reduction
// of the segment offset rides along in the same scan. Raker r sums the run of
// kRun slots starting at r * kRun; a radix-4 Hillis-Steele scan turns the
// kRakers run totals into inclusive sums; the rakers of the count half write
// their runs back as inclusive sums.
template <int kThreads, int kFields>
UKV_DEVICE void raking_scan(ScanShared<kThreads, kFields>& s) {
  static_assert(kThreads % 64 == 0 && kThreads >= kScanMinThreads && kThreads <= kScanMaxThreads,
                "scan blocks are whole wavefronts, at least one per raker");
  constexpr int32_t kRakers = kScanRakers<kThreads>;
  constexpr int32_t kRun = 2 * kThreads / kRakers;
  const int32_t r = threadIdx.x;
  const bool raker = r < kRakers;
  uint32_t own[kFields] = {};
  if (raker) {
#pragma unroll
    for (int32_t k = 0; k < kRun; ++k) {
#pragma unroll
      for (int f = 0; f < kFields; ++f) own[f] += s.value[f][bank_padded(r * kRun + k)];
    }
#pragma unroll
    for (int f = 0; f < kFields; ++f) s.run[0][f][r] = own[f];
  }
  __syncthreads();
  int in = 0;
#pragma unroll
  for (int32_t stride = 1; stride < kRakers; stride *= 4) {
    if (raker) {
#pragma unroll
      for (int f = 0; f < kFields; ++f) {
        uint32_t sum = s.run[in][f][r];
#pragma unroll
        for (int32_t j = 1; j < 4; ++j)
          if (r >= j * stride) sum += s.run[in][f][r - j * stride];
        s.run[in ^ 1][f][r] = sum;
      }
    }
    in ^= 1;
    __syncthreads();
  }
  if (raker && r >= kRakers / 2) {
    uint32_t sum[kFields];
#pragma unroll
    for (int f = 0; f < kFields; ++f) sum[f] = s.run[in][f][r] - own[f];
#pragma unroll
    for (int32_t k = 0; k < kRun; ++k) {
      const int32_t slot = bank_padded(r * kRun + k);
#pragma unroll
      for (int f = 0; f < kFields; ++f) {
        sum[f] += s.value[f][slot];
        s.value[f][slot] = sum[f];
      }
    }
  }
  __syncthreads();
}

}  // namespace ukv::kernels
