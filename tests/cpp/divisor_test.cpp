// The index kernels' branch-free division (kernels/index_params.h Divisor,
// quotient and remainder in kernels/index_formulas.h) against the hardware /
// and %: every divisor the ops can be given is a positive int32, every
// numerator a non-negative int32.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/index_formulas.h"

namespace ukv::kernels {
namespace {

constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

void expect_divides(int32_t d, int32_t x) {
  const Divisor div = make_divisor(d);
  ASSERT_EQ(quotient(x, div), x / d) << "x=" << x << " d=" << d;
  ASSERT_EQ(remainder(x, div), x % d) << "x=" << x << " d=" << d;
}

// Numerators where a rounding error would show first: around multiples of d,
// the top of the range, and a random spread.
std::vector<int32_t> numerators(int32_t d, std::mt19937& rng) {
  std::vector<int32_t> xs = {0, 1, 2, kMax - 1, kMax};
  for (int64_t q : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{kMax} / d - 1, int64_t{kMax} / d}) {
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t x = q * d + delta;
      if (x >= 0 && x <= kMax) xs.push_back(static_cast<int32_t>(x));
    }
  }
  std::uniform_int_distribution<int32_t> any(0, kMax);
  for (int i = 0; i < 2000; ++i) xs.push_back(any(rng));
  return xs;
}

TEST(Divisor, MatchesHardwareDivisionForEveryKindOfDivisor) {
  std::mt19937 rng(7);
  std::vector<int32_t> divisors;
  for (int32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int l = 9; l <= 30; ++l) {  // each power of two and its neighbours
    for (int32_t delta : {-1, 0, 1}) divisors.push_back((int32_t{1} << l) + delta);
  }
  divisors.push_back(kMax);
  std::uniform_int_distribution<int32_t> any(1, kMax);
  for (int i = 0; i < 200; ++i) divisors.push_back(any(rng));
  for (int32_t d : divisors) {
    for (int32_t x : numerators(d, rng)) expect_divides(d, x);
  }
}

TEST(Divisor, SmallNumeratorsExhaustivelyForTheV4Divisors) {
  for (int32_t d : {1, 32, 128, 3, 24, 96}) {
    for (int32_t x = 0; x < (1 << 20); ++x) expect_divides(d, x);
  }
}

TEST(Divisor, MultiplierFitsIn32Bits) {
  // make_divisor narrows the multiplier to uint32: the proof that it fits
  // (d > 2^(l-1)) checked where it is tightest, just above each power of two.
  for (int l = 1; l <= 30; ++l) {
    const int32_t d = (int32_t{1} << l) + 1;
    const Divisor div = make_divisor(d);
    const uint64_t exact = ((uint64_t{1} << div.shift) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d);
    EXPECT_EQ(div.multiplier, exact) << "d=" << d;
  }
}

}  // namespace
}  // namespace ukv::kernels
