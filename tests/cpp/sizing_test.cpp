#include <gtest/gtest.h>

#include <limits>

#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {
namespace {

TEST(Sizing, UnifiedSlotCountsMatchUpstreamFormula) {
  // n_csa = num_swa + ceil(NB / 4), n_hca = num_swa + ceil(NB / 128)
  EXPECT_EQ(slot_counts(10, 100, {32, 1}, 128), (std::vector<int64_t>{35, 11}));
  EXPECT_EQ(slot_counts(0, 0, {32, 1}, 128), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(slot_counts(3, 129, {32, 1}, 128), (std::vector<int64_t>{3 + 33, 3 + 2}));
  EXPECT_EQ(slot_counts(3, 129, {64, 2}, 256), (std::vector<int64_t>{3 + 33, 3 + 2}));
}

TEST(Sizing, LayerRowsBothLayouts) {
  EXPECT_EQ(layer_rows(Layout::Unified, 4, 10, 100, 128), 35 * 128);
  EXPECT_EQ(layer_rows(Layout::Unified, 128, 10, 100, 128), 11 * 128);
  EXPECT_EQ(layer_rows(Layout::Unified, 0, 10, 100, 128), 10 * 128);
  EXPECT_EQ(layer_rows(Layout::StaticSplit, 4, 10, 100, 128), 1280 + 3200);
  EXPECT_EQ(layer_rows(Layout::StaticSplit, 128, 10, 100, 128), 1280 + 100);
  EXPECT_EQ(layer_rows(Layout::StaticSplit, 0, 10, 100, 128), 1280);
  // flag-on capacity >= flag-off, equal when NB % 4 == 0 (CSA)
  EXPECT_EQ(layer_rows(Layout::Unified, 4, 7, 64, 128), layer_rows(Layout::StaticSplit, 4, 7, 64, 128));
  EXPECT_EQ(compress_base_row(Layout::Unified, 10, 128), 0);
  EXPECT_EQ(compress_base_row(Layout::StaticSplit, 10, 128), 1280);
}

TEST(Sizing, RefusesOverflowAndBadArguments) {
  EXPECT_THROW(layer_rows(Layout::Unified, 4, int64_t{1} << 24, 0, 128), InvalidArgument);
  EXPECT_THROW(layer_rows(Layout::StaticSplit, 4, 0, int64_t{1} << 40, 128), InvalidArgument);
  EXPECT_THROW(layer_rows(Layout::Unified, 3, 1, 1, 128), InvalidArgument);
  EXPECT_THROW(slot_counts(-1, 1, {32}, 128), InvalidArgument);
  EXPECT_THROW(slot_counts(1, 1, {0}, 128), InvalidArgument);
  EXPECT_THROW(layer_rows_for_slots(4, 3, 4, 128), InvalidArgument);
  // Parts whose int64 sum would wrap are refused before they are added.
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(slot_counts(kInt64Max, 1, {32}, 128), InvalidArgument);
  EXPECT_THROW(slot_counts(1, kInt64Max, {128}, 128), InvalidArgument);
  EXPECT_THROW(layer_rows(Layout::Unified, 1, 1, kInt64Max, 128), InvalidArgument);
  EXPECT_EQ(layer_rows(Layout::Unified, 4, 0, (int64_t{1} << 24) - 4 * 0, 128), (int64_t{1} << 22) * 128);
}

}  // namespace
}  // namespace ukv
