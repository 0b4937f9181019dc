// SHA-256 and BLAKE2b against Python's hashlib (data/digest_vectors.txt,
// written by data/digest_vectors.py) on pseudo-random messages of every
// length 0..300, which crosses every block and padding boundary of both;
// and against the examples of FIPS 180-4 and RFC 7693.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/hashing/blake2b.h"
#include "core/hashing/sha256.h"

namespace ukv {
namespace {

std::string hex(const unsigned char* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

// The message digest_vectors.py makes for this length (splitmix64 seeded with it).
std::vector<unsigned char> message(uint64_t length) {
  std::vector<unsigned char> out;
  uint64_t state = length;
  while (out.size() < length) {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(z >> (8 * i)));
  }
  out.resize(length);
  return out;
}

std::string blake2b_hex(const void* data, size_t len, size_t out_len) {
  unsigned char d[64];
  blake2b(data, len, d, out_len);
  return hex(d, out_len);
}

TEST(Digest, StandardExamples) {
  EXPECT_EQ(hex(sha256("abc", 3).data(), 32), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("", 0).data(), 32), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(blake2b_hex("abc", 3, 64),
            "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
            "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923");
}

TEST(Digest, MatchHashlibOnEveryLengthUpTo300) {
  std::ifstream in(UKV_TEST_DATA "/digest_vectors.txt");
  ASSERT_TRUE(in) << "cannot read " UKV_TEST_DATA "/digest_vectors.txt";
  std::string line;
  uint64_t expected_length = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    uint64_t n;
    std::string want_sha, want_blake;
    ASSERT_TRUE(fields >> n >> want_sha >> want_blake) << line;
    ASSERT_EQ(n, expected_length++);
    const auto m = message(n);
    EXPECT_EQ(hex(sha256(m.data(), m.size()).data(), 32), want_sha) << "SHA-256 of " << n << " bytes";
    EXPECT_EQ(blake2b_hex(m.data(), m.size(), want_blake.size() / 2), want_blake) << "BLAKE2b of " << n << " bytes";
  }
  EXPECT_EQ(expected_length, 301u);
}

TEST(Digest, Blake2bRefusesABadDigestLength) {
  unsigned char d[65];
  EXPECT_THROW(blake2b("", 0, d, 0), std::exception);
  EXPECT_THROW(blake2b("", 0, d, 65), std::exception);
}

}  // namespace
}  // namespace ukv
