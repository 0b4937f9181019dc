// apply_row_copies: the row-space layout's unit moves (RowSpace), row ranges
// copied in every plane before the step that reads them. Copies of one phase
// touch disjoint rows; phase p runs as its own launch after phase p - 1, so
// a copy into rows an earlier copy reads waits for that read. An entry whose
// rows fall outside a plane is skipped. Each block takes entries in turn and
// copies an entry's rows with copy_rows.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/copy_rows.cuh"
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
      copy_rows<kThreads>(p.planes[plane] + src * row_bytes, row_bytes, p.planes[plane] + dst * row_bytes, row_bytes,
                          rows, row_bytes);
    }
  }
}

}  // namespace ukv::kernels
