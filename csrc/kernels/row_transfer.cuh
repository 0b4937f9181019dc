// gather_rows / scatter_rows: a sequence's rows between the KV tensors and
// one contiguous transfer buffer. Each run (of each layer) is one span of
// copy_spans, so the whole grid shares every run; a run outside its tensor or
// the buffer is skipped (row_run gives it no rows). Runs write disjoint
// bytes, so their order does not matter.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/copy_spans.cuh"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

// Run r's copy between the rows of `tensor` (r's tensor, in its layer) and the buffer.
UKV_DEVICE CopySpan transfer_span(const RowTransferParams& p, uint8_t* tensor, const RowRun& r) {
  if (r.rows == 0) return CopySpan{nullptr, nullptr, 0, 0, 0, 1};
  const int64_t row_bytes = p.row_bytes[r.tensor], stride = p.row_stride[r.tensor];
  uint8_t* rows = tensor + r.first_row * stride;
  uint8_t* packed = p.buffer + r.offset;
  return p.to_buffer ? CopySpan{rows, packed, stride, row_bytes, r.rows, row_bytes}
                     : CopySpan{packed, rows, row_bytes, stride, r.rows, row_bytes};
}

template <int kThreads>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kCopyBlocksPerSm) transfer_rows_kernel(RowTransferParams p) {
  gpu::after_prior_kernels();
  copy_spans<kThreads>(run_count(p), [&](int32_t i) {
    const RowRun r = row_run(p, i);
    return transfer_span(p, p.tensors[r.tensor], r);
  });
}

// Every layer's runs as one list: span i is run i % n of layer i / n (the
// host checked that n * num_layers fits 32 bits).
template <int kThreads>
__global__ void UKV_LAUNCH_BOUNDS(kThreads, kCopyBlocksPerSm) transfer_layer_rows_kernel(LayerRowTransferParams p) {
  gpu::after_prior_kernels();
  const int32_t n = run_count(p.rows);
  copy_spans<kThreads>(n * p.num_layers, [&](int32_t i) {
    const int32_t layer = i / n;
    const RowRun r = row_run(p.rows, i - layer * n, p.layer_offset[layer]);
    return transfer_span(p.rows, p.tensors[layer][r.tensor], r);
  });
}

}  // namespace ukv::kernels
