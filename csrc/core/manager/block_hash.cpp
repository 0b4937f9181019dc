#include "core/manager/block_hash.h"

#include <cstring>
#include <vector>

namespace ukv {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads, independent of the host's byte order.
inline uint64_t load64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

inline uint64_t round_step(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  return rotl(acc, 31) * kP1;
}

inline uint64_t merge_step(uint64_t acc, uint64_t v) {
  acc ^= round_step(0, v);
  return acc * kP1 + kP4;
}

inline void store64le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

uint64_t xxh64(const void* data, size_t len, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    for (; p + 32 <= end; p += 32) {
      v1 = round_step(v1, load64(p));
      v2 = round_step(v2, load64(p + 8));
      v3 = round_step(v3, load64(p + 16));
      v4 = round_step(v4, load64(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge_step(merge_step(merge_step(merge_step(h, v1), v2), v3), v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(len);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round_step(0, load64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) {
    h = rotl(h ^ (static_cast<uint64_t>(load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t block_hash(const int32_t* tokens, size_t n, bool has_parent, uint64_t parent, uint64_t salt) {
  // Serialise to the upstream byte layout; thread_local keeps it allocation-free.
  thread_local std::vector<unsigned char> buf;
  buf.resize(8 * (n + 1));
  size_t off = 0;
  if (has_parent) {
    store64le(buf.data(), parent);
    off = 8;
  }
  for (size_t i = 0; i < n; ++i, off += 8) store64le(buf.data() + off, static_cast<uint64_t>(int64_t{tokens[i]}));
  return xxh64(buf.data(), off, has_parent ? 0 : salt);
}

uint64_t swa_page_hash(uint64_t block_hash, int64_t page_in_block, int64_t pages_per_block) {
  if (pages_per_block == 1) return block_hash;
  uint64_t h = block_hash ^ (static_cast<uint64_t>(page_in_block + 1) * 0x9E3779B97F4A7C15ull);
  h = (h ^ (h >> 33)) * 0xFF51AFD7ED558CCDull;
  h = (h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}

}  // namespace ukv
