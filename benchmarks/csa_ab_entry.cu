// The entry point of benchmarks/csa_ab.py: csa_translate_pack's launchers as
// built from one variant of csrc/kernels, callable through ctypes with raw
// pointers (torch tensors' data_ptr) on a given stream, with the tile shape
// either the product launcher's choice (shape 0) or a fixed one.
#include "kernels/index_launchers.cu"

namespace ukv::kernels {
gpu::Error run_shape(const CsaTranslatePackParams& p, int shape, gpu::Stream s) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  switch (shape) {
    case 1: return launch_csa_tiles<256, 1>(p, s);
    case 2: return launch_csa_tiles<128, 2>(p, s);
    case 3: return launch_csa_tiles<64, 4>(p, s);
    case 4: return launch_csa_tiles<128, 1>(p, s);
    case 5: return launch_csa_tiles<64, 1>(p, s);
    default: return launch_csa_translate_pack(p, s);
  }
}
}  // namespace ukv::kernels

using namespace ukv::kernels;
using ukv::gpu::Stream;

extern "C" int ukv_ab_csa(const int32_t* topk, int64_t topk_row_stride, int32_t topk_width, int32_t num_tokens,
                          const int32_t* table, int32_t rows, int32_t cols, const int64_t* positions,
                          const int32_t* batch_id, const int32_t* skip, const int32_t* indptr, int32_t* out,
                          int64_t out_size, int32_t window, int32_t k, int32_t base, int32_t shape, void* stream) {
  CsaTranslatePackParams p{};
  p.topk = topk;
  p.topk_row_stride = topk_row_stride;
  p.topk_col_stride = 1;
  p.topk_width = topk_width;
  p.table = Table{table, rows, cols, cols, 1};
  p.positions = Positions{nullptr, positions};
  p.batch_id = batch_id;
  p.skip = skip;
  p.out = SlicedOutput{indptr, out, out_size};
  p.num_tokens = num_tokens;
  p.window = window;
  p.rows_per_block = make_divisor(k);
  p.compress_base = base;
  return static_cast<int>(run_shape(p, shape, static_cast<Stream>(stream)));
}
