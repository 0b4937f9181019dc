// Whole blocks (slots, bitmap words, pages) that hold a count of smaller units.
#pragma once

#include <cstdint>

namespace ukv {

// ceil(a / b) for a >= 0 and b > 0. Written as a quotient plus a carry rather
// than (a + b - 1) / b, so it cannot overflow for any a up to INT64_MAX.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// Most pages of page_tokens that any w consecutive positions touch.
constexpr int64_t span_pages(int64_t w, int64_t page_tokens) {
  return w <= 0 ? 0 : ceil_div(w - 1, page_tokens) + 1;
}

}  // namespace ukv
