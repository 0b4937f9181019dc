// The SWA rows of a token's window positions, stored into the index buffers
// of paged_decode_indices and paged_prefill_indices (the SWA output and the
// SWA parts of the CSA and HCA outputs).
//
// A group of kGroup threads covers the positions, a thread every kGroup-th
// one. Each thread first issues the page-table loads of kInFlight of its
// positions, then stores their rows: a window of 128 at kGroup 64 costs one
// memory round trip, not two. (Unrolling the loop instead left the loads
// between the stores in the row-space forms, which keep three rows a cell,
// and cost them a third of their occupancy in registers.)
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

// Positions [first, first + n) of the sequence whose SWA table row is
// `units`; store(i, swa_row, csa_row, hca_row) gets position first + i's row
// in each output's class (SwaRows rows[0..2]; the same row in the plain form).
template <int kGroup, SwaForm kForm, typename Store>
UKV_DEVICE void store_swa_window(const TableRow& units, int32_t cols, const SwaRows* rows, int32_t first, int32_t n,
                                 int32_t lane, const Store& store) {
  constexpr int32_t kInFlight = 2;
  constexpr bool kPlain = kForm == SwaForm::kPlain;
  SwaRowsOfPlace<kForm, 3> place{rows};
  for (int32_t i0 = lane; i0 < n; i0 += kInFlight * kGroup) {
    int32_t unit[kInFlight], q[kInFlight];
#pragma unroll
    for (int32_t k = 0; k < kInFlight; ++k) {  // a position past n reads position n - 1's page again
      const PagePlace at = page_place<kForm>(first + min_i32(i0 + k * kGroup, n - 1), rows[0].page);
      q[k] = at.q;
      unit[k] = swa_unit_at(units, at.col, cols);
    }
#pragma unroll
    for (int32_t k = 0; k < kInFlight; ++k) {
      const int32_t i = i0 + k * kGroup;
      if (i >= n) break;
      const uint32_t unit_row = unit_first_row<kForm>(unit[k], rows[0]);
      place.at(q[k]);
      const int32_t row = place.row(0, unit_row);
      store(i, row, kPlain ? row : place.row(1, unit_row), kPlain ? row : place.row(2, unit_row));
    }
  }
}

}  // namespace ukv::kernels
