// The checksum kernels of the KV tier objects (formula: object_checksum.h).
// Included by object_checksum_launchers.cu alone (the kernels are defined here).
//
// object_sums_kernel: the payloads are cut into chunks of kChecksumChunkBytes;
// block b finds its object and chunk from the chunks' prefix (chunk_starts),
// its threads sum their 16-byte vectors' words into the two lanes, the block
// reduces them in shared memory and adds them to the object's sums with one
// atomic add per lane (sums mod 2^64 do not depend on the order).
// object_checksums_kernel: one thread per object adds the header words,
// mixes, and either writes the header and the checksum (seal) or compares
// them with the buffer's (verify).
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/object_checksum.h"

namespace ukv::kernels {

constexpr int32_t kChecksumThreads = 256;
constexpr int32_t kChecksumLoadsInFlight = 4;

#if defined(UKV_GPU_COMPILER)

UKV_DEVICE uint64_t low_word(const uint4& v) { return v.x | (static_cast<uint64_t>(v.y) << 32); }
UKV_DEVICE uint64_t high_word(const uint4& v) { return v.z | (static_cast<uint64_t>(v.w) << 32); }

// The object whose chunks hold chunk c: the last o with chunk_starts[o] <= c.
UKV_DEVICE int32_t object_of_chunk(const ObjectChecksumParams& p, int64_t c) {
  int32_t lo = 0, hi = p.num_objects - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (p.chunk_starts[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <int kThreads>
UKV_DEVICE void add_block_sums(ChecksumLanes lanes, unsigned long long* sums) {
  __shared__ uint64_t a[kThreads], b[kThreads];
  a[threadIdx.x] = lanes.a;
  b[threadIdx.x] = lanes.b;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (static_cast<int>(threadIdx.x) < step) {
      a[threadIdx.x] += a[threadIdx.x + step];
      b[threadIdx.x] += b[threadIdx.x + step];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(sums, static_cast<unsigned long long>(a[0]));
    atomicAdd(sums + 1, static_cast<unsigned long long>(b[0]));
  }
}

template <int kThreads>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, 4) object_sums_kernel(ObjectChecksumParams p) {
  gpu::after_prior_kernels();
  const int64_t c = blockIdx.x;
  const int32_t o = object_of_chunk(p, c);
  const ObjectSpan& span = p.spans[o];
  const uint64_t bytes = payload_bytes(span);
  const uint8_t* payload = p.buffer + span.offset + kObjectHeaderBytes;
  const uint64_t begin = static_cast<uint64_t>(c - p.chunk_starts[o]) * kChecksumChunkBytes;
  const uint64_t end = begin + kChecksumChunkBytes < bytes ? begin + kChecksumChunkBytes : bytes;
  const uint64_t vectors_end = end / 16;  // whole 16-byte vectors of this chunk
  const uint4* vectors = reinterpret_cast<const uint4*>(payload);
  ChecksumLanes lanes{0, 0};
  uint64_t v = begin / 16 + threadIdx.x;
  for (; v + (kChecksumLoadsInFlight - 1) * kThreads < vectors_end; v += kChecksumLoadsInFlight * kThreads) {
    uint4 loaded[kChecksumLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kChecksumLoadsInFlight; ++i) loaded[i] = vectors[v + i * kThreads];
#pragma unroll
    for (int i = 0; i < kChecksumLoadsInFlight; ++i) {
      const uint64_t j = kObjectSignedWords + 2 * (v + i * kThreads);
      add_word(lanes, low_word(loaded[i]), j);
      add_word(lanes, high_word(loaded[i]), j + 1);
    }
  }
  for (; v < vectors_end; v += kThreads) {
    const uint4 loaded = vectors[v];
    const uint64_t j = kObjectSignedWords + 2 * v;
    add_word(lanes, low_word(loaded), j);
    add_word(lanes, high_word(loaded), j + 1);
  }
  // The payload's last bytes after its whole vectors, in the chunk that ends it.
  if (end == bytes && threadIdx.x == 0) {
    for (uint64_t at = vectors_end * 16; at < bytes; at += 8) {
      const uint64_t n = bytes - at < 8 ? bytes - at : 8;
      add_word(lanes, partial_word(payload + at, n), kObjectSignedWords + at / 8);
    }
  }
  add_block_sums<kThreads>(lanes, p.sums + 2 * static_cast<int64_t>(o));
}

__global__ void object_checksums_kernel(ObjectChecksumParams p) {
  gpu::after_prior_kernels();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= p.num_objects) return;
  const ObjectSpan& span = p.spans[o];
  uint64_t checksum[2];
  finish_checksum(span, ChecksumLanes{p.sums[2 * o], p.sums[2 * o + 1]}, checksum);
  uint64_t* header = reinterpret_cast<uint64_t*>(p.buffer + span.offset);
  if (p.ok == nullptr) {
    for (int64_t j = 0; j < kObjectSignedWords; ++j) header[j] = span.header[j];
    header[kObjectSignedWords] = checksum[0];
    header[kObjectSignedWords + 1] = checksum[1];
    return;
  }
  bool sound = header[kObjectSignedWords] == checksum[0] && header[kObjectSignedWords + 1] == checksum[1];
  for (int64_t j = 0; j < kObjectSignedWords; ++j) sound = sound && header[j] == span.header[j];
  p.ok[o] = sound ? 1 : 0;
}

#endif  // UKV_GPU_COMPILER

}  // namespace ukv::kernels
