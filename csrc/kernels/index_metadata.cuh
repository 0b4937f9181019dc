// Device-side builders of the per-token slice lengths and their indptr
// cumsums (decode: SPEC §2.4; prefill: SPEC §2.6), so a step's whole index
// metadata can be built inside a captured graph from positions, batch ids and
// per-sequence counts. Padding tokens have empty slices, so the indptr repeats
// its last value over the padded tail.
//
// One block does the whole scan: thread i owns a contiguous run of tokens,
// sums it, the block scans the per-thread sums in shared memory (no warp
// intrinsics, so any wavefront width works), and each thread writes its run's
// indptr entries. Token counts here are at most a few thousand per step.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

constexpr int32_t kMetadataMaxThreads = 1024;

// Exclusive prefix sums over the block of kFields per-thread values, in place.
template <int kFields>
UKV_DEVICE void block_exclusive_scan(int32_t (&value)[kFields]) {
  __shared__ int32_t partial[kFields][kMetadataMaxThreads];
  const int32_t tid = threadIdx.x;
  int32_t own[kFields];
#pragma unroll
  for (int f = 0; f < kFields; ++f) {
    own[f] = value[f];
    partial[f][tid] = value[f];
  }
  __syncthreads();
  for (int32_t offset = 1; offset < static_cast<int32_t>(blockDim.x); offset <<= 1) {
    int32_t add[kFields];
#pragma unroll
    for (int f = 0; f < kFields; ++f) add[f] = tid >= offset ? partial[f][tid - offset] : 0;
    __syncthreads();
#pragma unroll
    for (int f = 0; f < kFields; ++f) partial[f][tid] += add[f];
    __syncthreads();
  }
#pragma unroll
  for (int f = 0; f < kFields; ++f) value[f] = partial[f][tid] - own[f];
}

// Fills indptr[f][0 .. T] with the cumsum of field f of counts_at(t).
template <int kFields, typename CountsAt>
UKV_DEVICE void build_indptrs(int32_t num_tokens, const CountsAt& counts_at, int32_t* const (&indptr)[kFields]) {
  const int32_t per_thread = (num_tokens + blockDim.x - 1) / blockDim.x;
  const int32_t lo = min_i32(threadIdx.x * per_thread, num_tokens);
  const int32_t hi = min_i32(lo + per_thread, num_tokens);
  int32_t running[kFields] = {};
  for (int32_t t = lo; t < hi; ++t) {
    const auto c = counts_at(t);
#pragma unroll
    for (int f = 0; f < kFields; ++f) running[f] += c[f];
  }
  block_exclusive_scan<kFields>(running);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int f = 0; f < kFields; ++f) indptr[f][0] = 0;
  }
  for (int32_t t = lo; t < hi; ++t) {
    const auto c = counts_at(t);
#pragma unroll
    for (int f = 0; f < kFields; ++f) {
      running[f] += c[f];
      indptr[f][t + 1] = running[f];
    }
  }
}

template <typename T, int N>
struct Fields {
  T v[N];
  UKV_DEVICE const T& operator[](int i) const { return v[i]; }
};

__global__ void decode_index_metadata_kernel(DecodeMetadataParams p) {
  gpu::after_prior_kernels();
  const auto counts_at = [&](int32_t t) {
    const DecodeTokenCounts c = decode_token_counts(p, t);
    return Fields<int32_t, 3>{{c.swa, c.csa, c.hca}};
  };
  int32_t* const indptr[3] = {p.swa_indptr, p.csa_indptr, p.hca_indptr};
  build_indptrs<3>(p.num_tokens, counts_at, indptr);
}

__global__ void prefill_index_metadata_kernel(PrefillMetadataParams p) {
  gpu::after_prior_kernels();
  const auto counts_at = [&](int32_t t) {
    const PrefillTokenCounts c = prefill_token_counts(p, t);
    return Fields<int32_t, 4>{{c.extend, c.swa, c.csa, c.hca}};
  };
  int32_t* const indptr[4] = {p.extend_indptr, p.swa_indptr, p.csa_indptr, p.hca_indptr};
  build_indptrs<4>(p.num_tokens, counts_at, indptr);
  for (int32_t t = threadIdx.x; t < p.num_tokens; t += blockDim.x)
    p.prefix_swa_count[t] = prefill_token_counts(p, t).prefix_swa;
}

}  // namespace ukv::kernels
