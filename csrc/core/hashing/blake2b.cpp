#include "core/hashing/blake2b.h"

#include <cstring>

#include "core/common/errors.h"
#include "core/hashing/byte_order.h"

namespace ukv {
namespace {

// The SHA-512 initial hash values (RFC 7693, 2.6).
constexpr uint64_t kIv[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                             0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                             0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

// The message schedule of each round (2.7); rounds 10 and 11 reuse rows 0 and 1.
constexpr uint8_t kSigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0}};

constexpr size_t kBlock = 128;

inline uint64_t rotr(uint64_t x, int r) { return (x >> r) | (x << (64 - r)); }

// The mixing function G (3.1).
inline void mix(uint64_t v[16], int a, int b, int c, int d, uint64_t x, uint64_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = rotr(v[d] ^ v[a], 32);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 24);
  v[a] = v[a] + v[b] + y;
  v[d] = rotr(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 63);
}

// The compression function F (3.2); `bytes` counts the message bytes so far,
// this block's included (messages here are far below 2^64 bytes: the high
// counter word stays 0).
void compress(uint64_t h[8], const unsigned char* block, uint64_t bytes, bool last) {
  uint64_t m[16], v[16];
  for (int i = 0; i < 16; ++i) m[i] = load64_le(block + 8 * i);
  for (int i = 0; i < 8; ++i) v[i] = h[i], v[i + 8] = kIv[i];
  v[12] ^= bytes;
  if (last) v[14] = ~v[14];
  for (int r = 0; r < 12; ++r) {
    const uint8_t* s = kSigma[r % 10];
    mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

}  // namespace

void blake2b(const void* data, size_t len, unsigned char* out, size_t out_len) {
  require(out_len >= 1 && out_len <= 64, "blake2b: digest length must be in [1, 64], got ", out_len);
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h[8];
  std::memcpy(h, kIv, sizeof h);
  h[0] ^= 0x01010000ULL ^ out_len;  // parameter block: fanout 1, depth 1, no key, digest length
  // Every block but the last is compressed as it comes; the last (possibly
  // partial, zero-padded; an all-zero block for an empty message) carries the final flag.
  size_t done = 0;
  for (; len - done > kBlock; done += kBlock) compress(h, p + done, done + kBlock, false);
  unsigned char last[kBlock] = {};
  if (len > done) std::memcpy(last, p + done, len - done);
  compress(h, last, len, true);
  unsigned char full[64];
  for (int i = 0; i < 8; ++i) store64_le(full + 8 * i, h[i]);
  std::memcpy(out, full, out_len);
}

}  // namespace ukv
