// The checksum of a KV tier object (ukv_torch/tiers/objects.py), written once
// for the CPU loop and the GPU kernels.
//
// An object is a 64-byte header and a payload. The checksum covers the
// header's first 48 bytes (6 words) and the payload, as little-endian 64-bit
// words w_j: j = 0..5 the header words, j = 6 + i the payload's word i (the
// last one zero-padded). Each word gives a term that depends on its position,
//     x_j = (w_j ^ (j + 1) * kPositionKey) * kSpread,
// and two 64-bit lanes sum them in any order (modulo 2^64):
//     a = sum x_j,    b = sum (x_j ^ (x_j >> 31)).
// The 16 checksum bytes are fmix64(a ^ total bytes) and fmix64(b ^ lo ^ kLane).
//
// Why this and not a streaming hash (XXH3, which it replaced): every term is
// independent, so the GPU sums an object's words in parallel, block by block,
// and adds the blocks' sums atomically, at a few instructions per 8 bytes,
// and the result does not depend on the order. A tier then checks an object
// on the device, where its bytes are anyway, instead of on one host thread
// (XXH3 on the host bounded saves and loads to a tenth of the PCIe bandwidth).
// Both lanes are a bijection of each word, so any change confined to one word
// always changes the checksum; other corruption (a stale range, swapped or
// cut-off data) escapes with probability about 2^-64 per lane. It guards
// against corruption, not against an adversary: what ties an object to its
// prefix, model and tenant is its key, a cryptographic chain (tiers/keys.py).
#pragma once

#include <cstdint>

#include "kernels/compat.h"

namespace ukv::kernels {

constexpr int64_t kObjectHeaderBytes = 64;
constexpr int64_t kObjectSignedWords = 6;  // the header words the checksum covers
constexpr int64_t kObjectChecksumOffset = kObjectSignedWords * 8;
constexpr uint64_t kPositionKey = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kSpread = 0xD6E8FEB86659FD93ull;
constexpr uint64_t kLane = 0xC2B2AE3D27D4EB4Full;

// One object: where it starts in the buffer and the header words it must
// carry (word 1 is the payload's size in bytes).
struct ObjectSpan {
  int64_t offset;
  uint64_t header[kObjectSignedWords];
};

// The payloads are summed in chunks of this many bytes, a GPU block each.
constexpr int64_t kChecksumChunkBytes = 64 * 1024;

struct ObjectChecksumParams {
  uint8_t* buffer;              // offsets and payloads are 16-byte aligned in it (checked by the op)
  const ObjectSpan* spans;      // [num_objects]
  const int64_t* chunk_starts;  // [num_objects + 1]: the first chunk of each object, then the total
  unsigned long long* sums;     // [num_objects][2], zeroed before the payload sums
  uint8_t* ok;                  // verify: [num_objects], 1 where the object is sound; seal: nullptr
  int32_t num_objects;
  int64_t num_chunks;
};

struct ChecksumLanes {
  uint64_t a;
  uint64_t b;
};

UKV_HOST_DEVICE uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

UKV_HOST_DEVICE void add_word(ChecksumLanes& lanes, uint64_t word, uint64_t j) {
  const uint64_t x = (word ^ (j + 1) * kPositionKey) * kSpread;
  lanes.a += x;
  lanes.b += x ^ (x >> 31);
}

UKV_HOST_DEVICE uint64_t payload_bytes(const ObjectSpan& s) { return s.header[1]; }

// Little-endian word from up to 8 bytes (the payload's last, partial word).
UKV_HOST_DEVICE uint64_t partial_word(const uint8_t* p, uint64_t n) {
  uint64_t w = 0;
  for (uint64_t i = 0; i < n; ++i) w |= static_cast<uint64_t>(p[i]) << (8 * i);
  return w;
}

// The checksum from the payload's lanes: the header words added, then mixed.
UKV_HOST_DEVICE void finish_checksum(const ObjectSpan& s, ChecksumLanes lanes, uint64_t out[2]) {
  for (int64_t j = 0; j < kObjectSignedWords; ++j) add_word(lanes, s.header[j], static_cast<uint64_t>(j));
  const uint64_t total = static_cast<uint64_t>(kObjectChecksumOffset) + payload_bytes(s);
  out[0] = fmix64(lanes.a ^ total);
  out[1] = fmix64(lanes.b ^ out[0] ^ kLane);
}

}  // namespace ukv::kernels
