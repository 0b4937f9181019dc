// The table addressing of the index kernels (kernels/index_formulas.h): which
// tables take the 32-bit compact lookup, and that it reads the same cells as
// the general one; compress_row against its defining formula
// base + table[seq][e / k] * k + e % k, with entries clamped onto the row.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/index_formulas.h"

namespace ukv::kernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

Table table_of(const int32_t* data, int32_t rows, int32_t cols, int64_t row_stride, int64_t col_stride) {
  return {data, rows, cols, row_stride, col_stride};
}

TEST(TableLookup, CompactMeansContiguousColumnsAndEveryCellBelow2To31) {
  const int32_t* none = nullptr;  // is_compact reads only the shape
  EXPECT_TRUE(is_compact(table_of(none, 64, 513, 513, 1)));
  EXPECT_TRUE(is_compact(table_of(none, 64, 100, 4096, 1)));  // padded rows
  EXPECT_TRUE(is_compact(table_of(none, 0, 8, 8, 1)));
  EXPECT_TRUE(is_compact(table_of(none, 3, 8, 0, 1)));  // one row broadcast
  EXPECT_FALSE(is_compact(table_of(none, 64, 513, 1, 64)));  // transposed
  EXPECT_FALSE(is_compact(table_of(none, 64, 513, -513, 1)));
  // The last cell's offset, (rows - 1) * row_stride + cols - 1, at the limit and one past it.
  const int32_t cols = 1024;
  const int64_t stride = (kInt32Max - cols) / 2;
  EXPECT_TRUE(is_compact(table_of(none, 3, cols, stride, 1)));
  EXPECT_FALSE(is_compact(table_of(none, 3, cols, stride + 1, 1)));
  EXPECT_FALSE(is_compact(table_of(none, 1 << 20, 4096, 4096, 1)));  // 2^32 cells
}

// A top-k of num_tokens rows at topk (read only as an address).
CsaTranslatePackParams topk_of(uintptr_t topk, int32_t num_tokens, int32_t width, int64_t row_stride,
                               int64_t col_stride = 1) {
  CsaTranslatePackParams p{};
  p.topk = reinterpret_cast<const int32_t*>(topk);
  p.num_tokens = num_tokens;
  p.topk_width = width;
  p.topk_row_stride = row_stride;
  p.topk_col_stride = col_stride;
  return p;
}

TEST(TableLookup, TopkVectorRowsNeedAlignedGroupsAndEveryTileLaneBelow2To31) {
  constexpr uintptr_t kAligned = 1 << 12;
  constexpr int32_t kTile = 1024;
  EXPECT_TRUE(topk_rows_vectorizable(topk_of(kAligned, 512, 1024, 1024), kTile));
  EXPECT_TRUE(topk_rows_vectorizable(topk_of(kAligned, 512, 512, 2048), kTile));  // a narrower view of wider rows
  EXPECT_TRUE(topk_rows_vectorizable(topk_of(kAligned, 8, 1024, 0), kTile));      // one row broadcast
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned + 4, 512, 1024, 1024), kTile));  // 4-byte aligned only
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 512, 1022, 1024), kTile));      // a partial group
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 512, 1024, 1026), kTile));      // rows off the 16-byte grid
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 512, 1024, 1, 512), kTile));    // transposed
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 512, 1024, -1024), kTile));
  // The end of the last row's last tile, (T - 1) * row_stride + the width
  // rounded up to whole tiles (1000 -> 1024), at the largest stride (a
  // multiple of 4) that keeps it within INT32_MAX, and at the next one.
  const int64_t stride = (int64_t{1} << 29) - 260;
  EXPECT_LE(4 * stride + kTile, kInt32Max);
  EXPECT_GT(4 * (stride + 4) + kTile, kInt32Max);
  EXPECT_TRUE(topk_rows_vectorizable(topk_of(kAligned, 5, 1000, stride), kTile));
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 5, 1000, stride + 4), kTile));
  EXPECT_FALSE(topk_rows_vectorizable(topk_of(kAligned, 5, 1000, stride), 2 * kTile));  // the tile reaches past
  EXPECT_TRUE(topk_rows_vectorizable(topk_of(kAligned, 1, 1024, int64_t{1} << 40), kTile));  // one row: no stride
}

// base + table[seq][clamp(e) / k] * stride + clamp(e) % k in 64-bit arithmetic, wrapped to int32 like the output.
int32_t compress_row_reference(const std::vector<int32_t>& cells, int32_t cols, int64_t row_stride, int32_t seq,
                               int64_t entry, int32_t k, int32_t block_stride, int32_t base) {
  const int64_t last = int64_t{cols} * k - 1;
  const int64_t e = entry < 0 ? 0 : (entry > last ? last : entry);
  const int64_t id = cells[static_cast<size_t>(seq * row_stride + e / k)];
  return static_cast<int32_t>(static_cast<uint32_t>(base + id * block_stride + e % k));
}

TEST(TableLookup, CompactAndGeneralLookupsMatchTheFormula) {
  std::mt19937 rng(11);
  const int32_t rows = 5, cols = 37;
  const int64_t row_stride = 41;  // padded rows
  std::vector<int32_t> cells(static_cast<size_t>(rows * row_stride));
  std::uniform_int_distribution<int32_t> id(0, 1 << 24);
  for (auto& c : cells) c = id(rng);
  const Table table = table_of(cells.data(), rows, cols, row_stride, 1);
  ASSERT_TRUE(is_compact(table));
  for (int32_t k : {1, 3, 32, 128}) {
    const Divisor divisor = make_divisor(k);
    const int32_t last = cols * k - 1;
    std::vector<int32_t> entries = {0, 1, k - 1, k, last - 1, last, last + 1, -1, std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max()};
    std::uniform_int_distribution<int32_t> any(-2 * last, 2 * last);
    for (int i = 0; i < 500; ++i) entries.push_back(any(rng));
    // The slot layouts' stride is k; the row space's is the envelope (here 1056 rows).
    for (int32_t stride : {k, 1056}) {
      for (int32_t base : {0, 7 * 128, std::numeric_limits<int32_t>::max()}) {
        for (int32_t seq = 0; seq < rows; ++seq) {
          const TableRow row = table_row(table, seq);
          for (int32_t e : entries) {
            const int32_t expected = compress_row_reference(cells, cols, row_stride, seq, e, k, stride, base);
            ASSERT_EQ(compress_row<true>(row, e, divisor, stride, base), expected)
                << "k=" << k << " stride=" << stride << " seq=" << seq << " e=" << e;
            ASSERT_EQ(compress_row<false>(row, e, divisor, stride, base), expected)
                << "k=" << k << " stride=" << stride << " seq=" << seq << " e=" << e;
          }
        }
      }
    }
  }
}

TEST(TableLookup, GeneralLookupFollowsTheColumnStride) {
  const int32_t rows = 3, cols = 4;
  std::vector<int32_t> cells(rows * cols);
  for (size_t i = 0; i < cells.size(); ++i) cells[i] = static_cast<int32_t>(100 + i);
  // The transpose of a [cols, rows] matrix: cell (r, c) at c * rows + r.
  const Table transposed = table_of(cells.data(), rows, cols, 1, rows);
  ASSERT_FALSE(is_compact(transposed));
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t c = 0; c < cols; ++c) EXPECT_EQ(id_at(table_row(transposed, r), c), 100 + c * rows + r);
  }
}

}  // namespace
}  // namespace ukv::kernels
