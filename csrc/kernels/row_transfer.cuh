// gather_rows / scatter_rows: a sequence's rows between the KV tensors and
// one contiguous transfer buffer. Each block takes runs in turn and copies a
// run's rows with copy_rows; a run outside its tensor or the buffer is
// skipped (row_run gives it no rows). Runs write disjoint bytes, so their
// order does not matter.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/copy_rows.cuh"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

template <int kThreads>
__global__ void transfer_rows_kernel(RowTransferParams p) {
  gpu::after_prior_kernels();
  const int32_t n = run_count(p);
  for (int32_t i = static_cast<int32_t>(blockIdx.x); i < n; i += static_cast<int32_t>(gridDim.x)) {
    const RowRun r = row_run(p, i);
    if (r.rows == 0) continue;
    const int64_t row_bytes = p.row_bytes[r.tensor], stride = p.row_stride[r.tensor];
    uint8_t* rows = p.tensors[r.tensor] + r.first_row * stride;
    uint8_t* packed = p.buffer + r.offset;
    if (p.to_buffer)
      copy_rows<kThreads>(rows, stride, packed, row_bytes, r.rows, row_bytes);
    else
      copy_rows<kThreads>(packed, row_bytes, rows, stride, r.rows, row_bytes);
  }
}

}  // namespace ukv::kernels
