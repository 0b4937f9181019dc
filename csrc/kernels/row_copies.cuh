// apply_row_copies: the row-space layout's unit moves (RowSpace), row ranges
// copied in every plane before the step that reads them. Copies of one phase
// touch disjoint rows; phase p runs as its own launch after phase p - 1, so
// a copy into rows an earlier copy reads waits for that read. An entry whose
// rows fall outside a plane is skipped. Each block takes entries in turn;
// its threads copy an entry's bytes 16 at a time where rows are whole
// 16-byte groups.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

template <int kThreads>
__global__ void apply_row_copies_kernel(RowCopyParams p, int32_t phase) {
  gpu::after_prior_kernels();
  const PhaseSpan span = phase_span(p, phase);
  for (int32_t i = static_cast<int32_t>(blockIdx.x); i < span.count; i += static_cast<int32_t>(gridDim.x)) {
    const int32_t* c = p.copies + 3 * static_cast<int64_t>(span.first + i);
    const int32_t src = c[0], dst = c[1], rows = c[2];
    if (!copy_in_bounds(p, src, dst, rows)) continue;
    for (int32_t plane = 0; plane < p.num_planes; ++plane) {
      const int64_t row_bytes = p.row_bytes[plane];
      const uint8_t* from = p.planes[plane] + src * row_bytes;
      uint8_t* to = p.planes[plane] + dst * row_bytes;
      const int64_t bytes = rows * row_bytes;
      if (row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(p.planes[plane]) & 15) == 0) {
        const int4* f = reinterpret_cast<const int4*>(from);
        int4* d = reinterpret_cast<int4*>(to);
        for (int64_t j = threadIdx.x; j < bytes / 16; j += kThreads) d[j] = f[j];
      } else {
        for (int64_t j = threadIdx.x; j < bytes; j += kThreads) to[j] = from[j];
      }
    }
  }
}

}  // namespace ukv::kernels
