// Unit tests of SlotList, the intrusive FIFO behind every free list.
#include <gtest/gtest.h>

#include <vector>

#include "core/slots/slot_list.h"

namespace ukv {
namespace {

TEST(SlotList, IsAFifoWithRemovalFromAnywhere) {
  SlotList list(6);
  for (int64_t id : {4, 1, 5, 0}) list.push_back(id);
  EXPECT_EQ(list.size(), 4);
  EXPECT_EQ(list.front(), 4);
  EXPECT_EQ(list.back(), 0);
  list.erase(5);  // middle
  list.erase(4);  // front
  EXPECT_EQ(list.to_vector(), (std::vector<int64_t>{1, 0}));
  list.push_back(4);  // a removed id rejoins at the back
  EXPECT_EQ(list.back(), 4);
  EXPECT_EQ(list.pop_front(), 1);
  list.erase(4);  // back
  EXPECT_EQ(list.back(), 0);
  EXPECT_EQ(list.to_vector(), (std::vector<int64_t>{0}));
  EXPECT_TRUE(list.contains(0));
  EXPECT_FALSE(list.contains(4));
  EXPECT_EQ(list.pop_front(), 0);
  EXPECT_TRUE(list.empty());
  list.push_back(3);  // usable again once empty
  EXPECT_EQ(list.front(), 3);
  EXPECT_EQ(list.to_vector(), (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace ukv
