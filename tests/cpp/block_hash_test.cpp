// XXH64 against published test vectors; the chained block hash against the
// byte layout it documents. (tests/test_kv_manager.py checks block hashes
// against the `xxhash` Python package as an independent implementation.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

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

TEST(BlockHash, MatchesTheDocumentedByteLayout) {
  const std::vector<int32_t> toks = {1, -2, 300000, 7};
  std::vector<unsigned char> bytes(8 + 8 * toks.size());
  const uint64_t parent = 0x0123456789ABCDEFULL;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(parent >> (8 * i));
  for (size_t t = 0; t < toks.size(); ++t) {
    const auto v = static_cast<uint64_t>(int64_t{toks[t]});
    for (int i = 0; i < 8; ++i) bytes[8 + 8 * t + i] = static_cast<unsigned char>(v >> (8 * i));
  }
  EXPECT_EQ(block_hash(toks.data(), toks.size(), true, parent), xxh64(bytes.data(), bytes.size()));
  EXPECT_EQ(block_hash(toks.data(), toks.size(), false, 0), xxh64(bytes.data() + 8, bytes.size() - 8));
  EXPECT_NE(block_hash(toks.data(), toks.size(), true, parent), block_hash(toks.data(), toks.size(), true, parent + 1));
  // A salt seeds block 0 only; a chained block inherits it through its parent.
  const uint64_t salt = 0xFEEDFACEULL;
  EXPECT_EQ(block_hash(toks.data(), toks.size(), false, 0, salt), xxh64(bytes.data() + 8, bytes.size() - 8, salt));
  EXPECT_EQ(block_hash(toks.data(), toks.size(), true, parent, salt), block_hash(toks.data(), toks.size(), true, parent));
}

TEST(BlockHash, SwaPageKeysAreTheBlockHashWithOnePagePerBlockElseDistinct) {
  const uint64_t h = 0x0123456789ABCDEFULL;
  EXPECT_EQ(swa_page_hash(h, 0, 1), h);
  EXPECT_NE(swa_page_hash(h, 0, 4), swa_page_hash(h, 1, 4));
  EXPECT_NE(swa_page_hash(h, 0, 4), h);
}

}  // namespace
}  // namespace ukv
