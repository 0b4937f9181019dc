// gather_rows / scatter_rows: a sequence's rows between the KV tensors and
// one contiguous transfer buffer. Each run is one span of copy_spans, so the
// whole grid shares every run; a run outside its tensor or the buffer is
// skipped (row_run gives it no rows). Runs write disjoint bytes, so their
// order does not matter.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/copy_spans.cuh"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

template <int kThreads>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kCopyBlocksPerSm) transfer_rows_kernel(RowTransferParams p) {
  gpu::after_prior_kernels();
  copy_spans<kThreads>(run_count(p), [&](int32_t i) {
    const RowRun r = row_run(p, i);
    if (r.rows == 0) return CopySpan{nullptr, nullptr, 0, 0, 0, 1};
    const int64_t row_bytes = p.row_bytes[r.tensor], stride = p.row_stride[r.tensor];
    uint8_t* rows = p.tensors[r.tensor] + r.first_row * stride;
    uint8_t* packed = p.buffer + r.offset;
    return p.to_buffer ? CopySpan{rows, packed, stride, row_bytes, r.rows, row_bytes}
                       : CopySpan{packed, rows, row_bytes, stride, r.rows, row_bytes};
  });
}

}  // namespace ukv::kernels
