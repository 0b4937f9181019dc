// XXH64 against published test vectors; the chained block keys of every
// prefix hash against the byte layout they document. (The SHA-256 and
// BLAKE2b functions are checked against hashlib in digest_test.cpp;
// tests/manager checks whole chains against Python's xxhash and hashlib.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/hashing/blake2b.h"
#include "core/hashing/byte_order.h"
#include "core/hashing/sha256.h"
#include "core/hashing/xxh64.h"
#include "core/manager/block_hash.h"

namespace ukv {
namespace {

TEST(Xxh64, KnownVectors) {
  EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(xxh64(fox.data(), fox.size()), 0x0B242D361FDA71BCULL);
}

const std::vector<int32_t> kToks = {1, -2, 300000, 7};

// prefix ++ the tokens as 8-byte little-endian integers.
std::vector<unsigned char> chain_bytes(const std::vector<unsigned char>& prefix) {
  std::vector<unsigned char> bytes(prefix);
  for (int32_t t : kToks) {
    bytes.resize(bytes.size() + 8);
    store64_le(bytes.data() + bytes.size() - 8, static_cast<uint64_t>(int64_t{t}));
  }
  return bytes;
}

std::vector<unsigned char> le8(uint64_t v) {
  std::vector<unsigned char> b(8);
  store64_le(b.data(), v);
  return b;
}

CacheKey key_of(PrefixHash kind, const CacheKey* parent, uint64_t salt = 0) {
  return block_hash(kind, kToks.data(), kToks.size(), parent, salt);
}

TEST(BlockHash, Xxh64MatchesTheDocumentedByteLayout) {
  const CacheKey parent{0x0123456789ABCDEFULL, 0};
  const auto chained = chain_bytes(le8(parent.lo)), first = chain_bytes({});
  const auto xxh = PrefixHash::Xxh64;
  EXPECT_EQ(key_of(xxh, &parent), (CacheKey{xxh64(chained.data(), chained.size()), 0}));
  EXPECT_EQ(key_of(xxh, nullptr), (CacheKey{xxh64(first.data(), first.size()), 0}));
  const CacheKey other{parent.lo + 1, 0};
  EXPECT_NE(key_of(xxh, &parent), key_of(xxh, &other));
  // A salt seeds block 0 only; a chained block inherits it through its parent.
  const uint64_t salt = 0xFEEDFACEULL;
  EXPECT_EQ(key_of(xxh, nullptr, salt), (CacheKey{xxh64(first.data(), first.size(), salt), 0}));
  EXPECT_EQ(key_of(xxh, &parent, salt), key_of(xxh, &parent));
}

// The first 16 bytes of a strong digest of these bytes, as a key.
CacheKey strong(PrefixHash kind, const std::vector<unsigned char>& bytes) {
  unsigned char d[16];
  if (kind == PrefixHash::Sha256) {
    std::memcpy(d, sha256(bytes.data(), bytes.size()).data(), 16);
  } else {
    blake2b(bytes.data(), bytes.size(), d, 16);
  }
  return {load64_le(d), load64_le(d + 8)};
}

TEST(BlockHash, StrongHashesMatchTheDocumentedByteLayout) {
  const CacheKey parent{0x0123456789ABCDEFULL, 0xFEDCBA9876543210ULL};
  std::vector<unsigned char> parent_bytes = le8(parent.lo), hi = le8(parent.hi);
  parent_bytes.insert(parent_bytes.end(), hi.begin(), hi.end());
  const uint64_t salt = 0xFEEDFACEULL;
  for (PrefixHash kind : {PrefixHash::Sha256, PrefixHash::Blake2b}) {
    SCOPED_TRACE(prefix_hash_name(kind));
    EXPECT_EQ(key_of(kind, &parent), strong(kind, chain_bytes(parent_bytes)));
    EXPECT_EQ(key_of(kind, nullptr), strong(kind, chain_bytes({})));
    // The salt is block 0's prefix; a chained block inherits it through its parent.
    EXPECT_EQ(key_of(kind, nullptr, salt), strong(kind, chain_bytes(le8(salt))));
    EXPECT_NE(key_of(kind, nullptr, salt), key_of(kind, nullptr));
    EXPECT_EQ(key_of(kind, &parent, salt), key_of(kind, &parent));
  }
  EXPECT_NE(key_of(PrefixHash::Sha256, nullptr), key_of(PrefixHash::Blake2b, nullptr));
}

TEST(BlockHash, SwaPageKeysAreTheBlockHashWithOnePagePerBlockElseDistinct) {
  for (PrefixHash kind : {PrefixHash::Xxh64, PrefixHash::Sha256, PrefixHash::Blake2b}) {
    SCOPED_TRACE(prefix_hash_name(kind));
    const CacheKey h = key_of(kind, nullptr);
    EXPECT_EQ(swa_page_hash(kind, h, 0, 1), h);
    EXPECT_NE(swa_page_hash(kind, h, 0, 4), swa_page_hash(kind, h, 1, 4));
    EXPECT_NE(swa_page_hash(kind, h, 0, 4), h);
    EXPECT_EQ(swa_page_hash(kind, h, 3, 4).hi == 0, kind == PrefixHash::Xxh64);
  }
  // A strong page key hashes the block key's 16 bytes and the page index.
  const CacheKey h = key_of(PrefixHash::Sha256, nullptr);
  std::vector<unsigned char> bytes = le8(h.lo), hi = le8(h.hi), page = le8(2);
  bytes.insert(bytes.end(), hi.begin(), hi.end());
  bytes.insert(bytes.end(), page.begin(), page.end());
  EXPECT_EQ(swa_page_hash(PrefixHash::Sha256, h, 2, 4), strong(PrefixHash::Sha256, bytes));
}

}  // namespace
}  // namespace ukv
