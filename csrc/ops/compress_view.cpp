// bind_compress_view: the [N, k, head_dim] view through which a
// layer's main compressor writes, kv_cache[block, slot] = row
// compress_base + block * stride + slot of unified_kv, the stride being k
// unless given. In the unified layout (compress_base 0) it is the whole
// tensor, N = rows / k; in the static split it is the rows after the SWA
// region; in the row-space layout (stride = the envelope) every envelope's
// rows of this layer, N = the envelopes whose block lies inside the tensor.
// Works the same for the rope plane, which shares the row addressing.
//
// Registered as CompositeImplicitAutograd: it is narrow + view (narrow +
// unfold + transpose with a block stride), so autograd, fake tensors,
// functionalization and torch.compile see plain aten views and the result
// aliases its input with no kernel of its own.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv::ops {
namespace {

constexpr const char* kOp = "bind_compress_view";

at::Tensor bind_compress_view(const at::Tensor& unified_kv, int64_t compress_base, int64_t compress_ratio,
                              int64_t block_size, std::optional<int64_t> block_stride) {
  TORCH_CHECK_VALUE(unified_kv.dim() == 2, kOp, ": unified_kv must be 2-D [rows, head_dim], got ", unified_kv.dim(),
                    "-D");
  TORCH_CHECK_VALUE(compress_ratio > 0, kOp, ": compress_ratio must be > 0 (a dense layer has no compress view), got ",
                    compress_ratio);
  int64_t k = 0;
  try {
    k = ukv::rows_per_compress_block(compress_ratio, block_size);
  } catch (const ukv::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, kOp, ": ", e.what());
  }
  const int64_t rows = unified_kv.size(0);
  TORCH_CHECK_VALUE(compress_base >= 0 && compress_base <= rows, kOp, ": compress_base must be in [0, ", rows,
                    "] (the rows of unified_kv), got ", compress_base);
  const int64_t compress_rows = rows - compress_base;
  if (block_stride.has_value()) {
    // The range of the index ops' block strides (the rows they address are int32).
    TORCH_CHECK_VALUE(*block_stride >= k && *block_stride <= std::numeric_limits<int32_t>::max(), kOp,
                      ": block_stride must be in [k = ", k, ", ", std::numeric_limits<int32_t>::max(),
                      "] (blocks must not overlap) or None, got ", *block_stride);
    TORCH_CHECK_VALUE(unified_kv.stride(1) == 1, kOp, ": unified_kv's rows must be contiguous, got strides ",
                      unified_kv.strides());
    // The windows of k rows every block_stride rows, (compress_rows - k) / stride + 1
    // of them: unfold, not as_strided, which functionalization cannot replay (a
    // write through an as_strided view fails under torch.compile).
    if (compress_rows < k) return unified_kv.narrow(0, compress_base, 0).view({0, k, unified_kv.size(1)});
    return unified_kv.narrow(0, compress_base, compress_rows).unfold(0, k, *block_stride).transpose(1, 2);
  }
  TORCH_CHECK_VALUE(compress_rows % k == 0, kOp, ": the ", compress_rows, " rows from compress_base ", compress_base,
                    " are not a whole number of ", k, "-row compress blocks");
  return unified_kv.narrow(0, compress_base, compress_rows).view({compress_rows / k, k, unified_kv.size(1)});
}

}  // namespace

TORCH_LIBRARY_IMPL(ukv, CompositeImplicitAutograd, m) { m.impl("bind_compress_view", &bind_compress_view); }

}  // namespace ukv::ops
