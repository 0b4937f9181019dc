// apply_row_copies: the row-space layout's unit moves (RowSpace), row ranges
// copied in every plane before the step that reads them. Copies of one phase
// touch disjoint rows; phase p runs as its own launch after phase p - 1, so
// a copy into rows an earlier copy reads waits for that read. An entry whose
// rows fall outside a plane is skipped. The phase's entries, one span per
// entry and plane, are copied by the whole grid (copy_spans).
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/copy_spans.cuh"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

template <int kThreads>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kCopyBlocksPerSm) apply_row_copies_kernel(RowCopyParams p, int32_t phase) {
  gpu::after_prior_kernels();
  const PhaseSpan entries = phase_span(p, phase);
  copy_spans<kThreads>(entries.count * p.num_planes, [&](int32_t i) {
    const int32_t entry = i / p.num_planes, plane = i - entry * p.num_planes;
    const int32_t* c = p.copies + 3 * static_cast<int64_t>(entries.first + entry);
    const int32_t src = c[0], dst = c[1], rows = c[2];
    const int64_t row_bytes = p.row_bytes[plane];
    if (!copy_in_bounds(p, src, dst, rows)) return CopySpan{nullptr, nullptr, 0, 0, 0, 1};
    return CopySpan{p.planes[plane] + src * row_bytes, p.planes[plane] + dst * row_bytes, row_bytes, row_bytes, rows,
                    row_bytes};
  });
}

}  // namespace ukv::kernels
