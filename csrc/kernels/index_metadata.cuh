// Device-side builders of the per-token slice lengths and their indptr
// cumsums (upstream builds them on the host), so a step's whole index
// metadata can be built inside a captured graph from positions, batch ids and
// per-sequence counts. Padding tokens have empty slices, so the indptr repeats
// its last value over the padded tail.
//
// The scan is spread over blocks that never wait on each other (the ops have
// no scratch buffer, and a block spinning on another's flag may wait for a
// block that is not resident): block b owns the token segment [b*S, (b+1)*S)
// and finds that segment's offset itself, by summing the counts of every token
// before it. That is redundant work (about T^2 / 2S token evaluations in all)
// but fully parallel: the block's threads stride over the earlier tokens, so
// the loads are coalesced, and a thread loads the batch ids and positions of
// kMetadataBatch tokens before it evaluates any of them. A call costs about as
// much as its last block, which evaluates all T tokens, T / blockDim per
// thread; one block doing the whole scan over contiguous runs of tokens per
// thread had each thread wait on a token's batch id, then on its sequence's
// counts, token after token, twice. The launcher keeps S = blockDim (S grows
// only past kMetadataMaxBlocks blocks), so up to kMetadataMaxThreads tokens are
// one block and larger batches spread over the GPU.
//
// A block then scans its segment in passes of blockDim tokens, one token per
// thread, in shared memory (raking_scan); no warp intrinsics, so any wavefront
// width works. Sums are uint32, so an overflowing cumsum wraps modulo 2^32
// whatever the order of the additions, as the CPU loop's int32 sums do (the op
// checks do not bound the counts).
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

constexpr int32_t kMetadataMinThreads = 128;
constexpr int32_t kMetadataMaxThreads = 1024;
// Threads that serially sum runs of a pass's scan values: every thread up to
// 256, so runs stay short (2 slots up to 256 threads, 4 at 512, 8 at 1024), and
// never more than the 4^4 = 256 that the radix-4 scan of their run totals
// covers in four barriers. 128 rakers for every block size cost T=512 0.2 us
// (runs of 8).
template <int kThreads>
constexpr int32_t kMetadataRakers = kThreads < 256 ? kThreads : 256;
// Earlier tokens a thread evaluates with their loads in flight together.
constexpr int32_t kMetadataBatch = 8;
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
  uint32_t run[2][kFields][kMetadataRakers<kThreads>];  // run totals, double-buffered
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
  static_assert(kThreads % 64 == 0 && kThreads >= kMetadataMinThreads && kThreads <= kMetadataMaxThreads,
                "metadata blocks are whole wavefronts, at least one per raker");
  constexpr int32_t kRakers = kMetadataRakers<kThreads>;
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

// p narrowed to one token whose batch id and position are already loaded: the
// formulas read them as its token 0 (from registers, once inlined), so a batch
// of earlier tokens has all these loads in flight before any formula needs one.
template <typename Params>
UKV_DEVICE Params one_token(Params p, const int32_t& batch_id, const int32_t& position) {
  p.batch_id = &batch_id;
  p.positions = Positions{&position, nullptr};
  return p;
}

// Fills indptr[f][t + 1] for this block's segment of `segment` tokens (a
// multiple of kThreads) with the cumsum of field f of the counts, and
// indptr[f][0] = 0 in block 0. counts_at(q, t, own) gives token t's counts
// under parameters q: p itself (own = true) once for each of the segment's
// tokens, a one_token view of p (own = false) for each token before it.
template <int kThreads, int kFields, typename Params, typename CountsAt>
UKV_DEVICE void build_indptrs(const Params& p, int32_t segment, const CountsAt& counts_at,
                              int32_t* const (&indptr)[kFields]) {
  __shared__ ScanShared<kThreads, kFields> s;
  const int32_t num_tokens = p.num_tokens;
  const int32_t tid = threadIdx.x;
  const int32_t seg_lo = static_cast<int32_t>(blockIdx.x) * segment;  // < num_tokens, or 0
  const int32_t seg_len = min_i32(segment, num_tokens - seg_lo);

  // This thread's share of the segment offset: tokens j * kThreads + tid for
  // j < seg_lo / kThreads (the same count for every thread).
  Sums<kFields> carry{};
  const int32_t before = seg_lo / kThreads;
  for (int32_t j0 = 0; j0 < before; j0 += kMetadataBatch) {
    int32_t batch_id[kMetadataBatch];
    int32_t position[kMetadataBatch];
#pragma unroll
    for (int32_t u = 0; u < kMetadataBatch; ++u) {
      if (j0 + u < before) {
        const int32_t t = (j0 + u) * kThreads + tid;
        batch_id[u] = p.batch_id[t];
        position[u] = load_position(p.positions, t);
      }
    }
#pragma unroll
    for (int32_t u = 0; u < kMetadataBatch; ++u) {
      if (j0 + u < before) {
        const Sums<kFields> c = counts_at(one_token(p, batch_id[u], position[u]), 0, false);
#pragma unroll
        for (int f = 0; f < kFields; ++f) carry[f] += c[f];
      }
    }
  }

  if (seg_lo == 0 && tid == 0) {
#pragma unroll
    for (int f = 0; f < kFields; ++f) indptr[f][0] = 0;
  }
  for (int32_t done = 0; done < seg_len; done += kThreads) {
    const bool mine = tid < seg_len - done;
    const int32_t t = seg_lo + done + tid;
    Sums<kFields> c{};
    if (mine) c = counts_at(p, t, true);
#pragma unroll
    for (int f = 0; f < kFields; ++f) {
      s.value[f][bank_padded(tid)] = carry[f];
      s.value[f][bank_padded(kThreads + tid)] = c[f];
    }
    __syncthreads();
    raking_scan<kThreads, kFields>(s);
    if (mine) {
#pragma unroll
      for (int f = 0; f < kFields; ++f)
        indptr[f][t + 1] = static_cast<int32_t>(s.value[f][bank_padded(kThreads + tid)]);
    }
    // The next pass starts from this one's total, carried by thread 0.
#pragma unroll
    for (int f = 0; f < kFields; ++f) carry[f] = tid == 0 ? s.value[f][bank_padded(2 * kThreads - 1)] : 0;
    if (seg_len - done > kThreads) __syncthreads();
  }
}

// __launch_bounds__ in its one-argument form means the same for nvcc and hipcc
// (at most kThreads threads a block): it keeps a 1024-thread block's registers
// within what such a block may use, whatever the compiler version.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) decode_index_metadata_kernel(DecodeMetadataParams p, int32_t segment) {
  gpu::after_prior_kernels();
  const auto counts_at = [](const DecodeMetadataParams& q, int32_t t, bool) {
    const DecodeTokenCounts c = decode_token_counts(q, t);
    return Sums<3>{{static_cast<uint32_t>(c.swa), static_cast<uint32_t>(c.csa), static_cast<uint32_t>(c.hca)}};
  };
  int32_t* const indptr[3] = {p.swa_indptr, p.csa_indptr, p.hca_indptr};
  build_indptrs<kThreads, 3>(p, segment, counts_at, indptr);
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads) prefill_index_metadata_kernel(PrefillMetadataParams p, int32_t segment) {
  gpu::after_prior_kernels();
  const auto counts_at = [](const PrefillMetadataParams& q, int32_t t, bool own) {
    const PrefillTokenCounts c = prefill_token_counts(q, t);
    if (own) q.prefix_swa_count[t] = c.prefix_swa;
    return Sums<4>{{static_cast<uint32_t>(c.extend), static_cast<uint32_t>(c.swa), static_cast<uint32_t>(c.csa),
                    static_cast<uint32_t>(c.hca)}};
  };
  int32_t* const indptr[4] = {p.extend_indptr, p.swa_indptr, p.csa_indptr, p.hca_indptr};
  build_indptrs<kThreads, 4>(p, segment, counts_at, indptr);
}

}  // namespace ukv::kernels
