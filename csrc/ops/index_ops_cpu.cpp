// CPU implementations of the index-building ops: the per-token formulas of
// csrc/kernels/index_formulas.h, which the GPU kernels share, applied token by
// token. Tokens write disjoint slices, so they run in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "kernels/index_formulas.h"
#include "ops/index_ops.h"

namespace ukv::ops {
namespace {

using namespace ukv::kernels;

constexpr int64_t kTokensPerTask = 64;

template <typename PerToken>
void for_each_token(int32_t num_tokens, const PerToken& per_token) {
  at::parallel_for(0, num_tokens, kTokensPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) per_token(static_cast<int32_t>(t));
  });
}

struct CpuBackend {
  static constexpr c10::DeviceType kDeviceType = c10::DeviceType::CPU;

  static void run(const CsaTranslatePackParams& p, const at::Tensor&) {
    for_each_token(p.num_tokens, [&](int32_t t) {
      const int32_t bid = p.batch_id[t];
      if (!is_real_token(bid, p.table.rows)) return;
      const int32_t skip = p.skip ? p.skip[t] : swa_window_count(load_position(p.positions, t), p.window);
      const int64_t begin = p.out.indptr[t];
      const int64_t valid_k = min_i64(max_i64(p.out.indptr[t + 1] - begin - skip, 0), p.topk_width);
      const SliceBounds bounds = slice_bounds(p.out, t);
      const int32_t* row = p.topk + t * p.topk_row_stride;
      for (int32_t i = 0; i < valid_k; ++i)
        store_in_slice(p.out, bounds, begin + i,
                       compress_row(p.table, bid, row[i * p.topk_col_stride], p.rows_per_block, p.block_stride,
                                    p.compress_base));
    });
  }

  static void run(const PagedDecodeParams& p, const at::Tensor&) {
    for_each_token(p.num_tokens, [&](int32_t t) {
      const int32_t bid = p.batch_id[t];
      if (!is_real_token(bid, p.swa_table.rows)) return;
      const int32_t pos = load_position(p.positions, t);
      const int32_t n = swa_window_count(pos, p.window);
      const SlicedOutput* outputs[3] = {&p.swa, &p.csa, &p.hca};
      for (int o = 0; o < 3; ++o) {
        const SlicedOutput& out = *outputs[o];
        if (out.data == nullptr) continue;
        const SliceBounds bounds = slice_bounds(out, t);
        const int64_t tail = out.indptr[t + 1] - n;
        for (int32_t i = 0; i < n; ++i)
          store_in_slice(out, bounds, tail + i, swa_row(p.swa_table, bid, pos - n + 1 + i, p.swa_rows[o]));
      }
    });
  }

  static void run(const HcaDecodeParams& p, const at::Tensor&) {
    for_each_token(p.num_tokens, [&](int32_t t) {
      const int32_t bid = p.batch_id[t];
      if (!is_real_token(bid, p.table.rows)) return;
      const int32_t n = hca_decode_count(p, t, bid);
      const SliceBounds bounds = slice_bounds(p.out, t);
      const int64_t begin = p.out.indptr[t];
      for (int32_t e = 0; e < n; ++e)
        store_in_slice(p.out, bounds, begin + e,
                       compress_row(p.table, bid, e, p.rows_per_block, p.block_stride, p.compress_base));
    });
  }

  static void run(const PagedPrefillParams& p, const at::Tensor&) {
    for_each_token(p.num_tokens, [&](int32_t t) {
      const int32_t bid = p.batch_id[t];
      if (!is_real_token(bid, p.swa_table.rows)) return;
      const int32_t pos = load_position(p.positions, t);
      const PrefillWindow w = prefill_window(pos, p.chunk_start[bid], p.window);

      const SliceBounds extend_bounds = slice_bounds(p.extend, t);
      const int32_t first_extend_row = p.query_start[bid] + w.pos_in_chunk - w.extend_count + 1;
      for (int32_t i = 0; i < w.extend_count; ++i)
        store_in_slice(p.extend, extend_bounds, p.extend.indptr[t] + i, first_extend_row + i);

      const SliceBounds swa_bounds = slice_bounds(p.swa, t);
      const SliceBounds csa_bounds = slice_bounds(p.csa, t);
      const SliceBounds hca_bounds = slice_bounds(p.hca, t);
      const int64_t csa_tail = p.csa.indptr[t + 1] - w.prefix_swa_count;
      for (int32_t i = 0; i < w.prefix_swa_count; ++i) {
        const int32_t a = w.swa_low + i;
        store_in_slice(p.swa, swa_bounds, p.swa.indptr[t] + i, swa_row(p.swa_table, bid, a, p.swa_rows[0]));
        store_in_slice(p.csa, csa_bounds, csa_tail + i, swa_row(p.swa_table, bid, a, p.swa_rows[1]));
        store_in_slice(p.hca, hca_bounds, p.hca.indptr[t] + i, swa_row(p.swa_table, bid, a, p.swa_rows[2]));
      }

      const int32_t n_hca = prefill_hca_count(p, pos, bid);
      const int64_t hca_compress_begin = static_cast<int64_t>(p.hca.indptr[t]) + w.prefix_swa_count;
      for (int32_t e = 0; e < n_hca; ++e)
        store_in_slice(p.hca, hca_bounds, hca_compress_begin + e,
                       compress_row(p.hca_table, bid, e, p.hca_rows_per_block, p.hca_block_stride, p.compress_base));
    });
  }

  static void run(const DecodeMetadataParams& p, const at::Tensor&) {
    int32_t swa = 0, csa = 0, hca = 0;
    p.swa_indptr[0] = p.csa_indptr[0] = p.hca_indptr[0] = 0;
    for (int32_t t = 0; t < p.num_tokens; ++t) {
      const DecodeTokenCounts c = decode_token_counts(p, t);
      p.swa_indptr[t + 1] = swa += c.swa;
      p.csa_indptr[t + 1] = csa += c.csa;
      p.hca_indptr[t + 1] = hca += c.hca;
    }
  }

  static void run(const SwaSlotMappingParams& p, const at::Tensor&) {
    for_each_token(p.num_tokens, [&](int32_t t) { p.out[t] = swa_slot_of(p, t); });
  }

  // Phase by phase, in order; the copies of one phase touch disjoint rows.
  static void run(const RowCopyParams& p, const at::Tensor&) {
    for (int32_t phase = 0; phase < p.num_phases; ++phase) {
      const PhaseSpan span = phase_span(p, phase);
      for (int32_t i = 0; i < span.count; ++i) {
        const int32_t* c = p.copies + 3 * static_cast<int64_t>(span.first + i);
        if (!copy_in_bounds(p, c[0], c[1], c[2])) continue;
        for (int32_t plane = 0; plane < p.num_planes; ++plane)
          std::memmove(p.planes[plane] + c[1] * p.row_bytes[plane], p.planes[plane] + c[0] * p.row_bytes[plane],
                       static_cast<size_t>(c[2] * p.row_bytes[plane]));
      }
    }
  }

  // Runs write disjoint bytes: in parallel, every layer's runs. A run over a tensor whose rows follow
  // each other is one copy (a CSA block's 32 rows of 128-448 bytes cost 32 calls of memcpy otherwise,
  // which halved the host-KV gather's speed); over strided rows, one copy per row.
  static void run(const LayerRowTransferParams& lp, const at::Tensor&) {
    const RowTransferParams& p = lp.rows;
    const int64_t n = run_count(p);
    at::parallel_for(0, n * lp.num_layers, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t layer = i / n;
        const RowRun r = row_run(p, static_cast<int32_t>(i - layer * n), lp.layer_offset[layer]);
        const int64_t row_bytes = p.row_bytes[r.tensor], stride = p.row_stride[r.tensor];
        uint8_t* rows = lp.tensors[layer][r.tensor] + r.first_row * stride;
        uint8_t* packed = p.buffer + r.offset;
        const auto copy = [&](uint8_t* tensor_bytes, uint8_t* buffer_bytes, int64_t bytes) {
          if (p.to_buffer)
            std::memcpy(buffer_bytes, tensor_bytes, static_cast<size_t>(bytes));
          else
            std::memcpy(tensor_bytes, buffer_bytes, static_cast<size_t>(bytes));
        };
        if (stride == row_bytes) {
          copy(rows, packed, r.rows * row_bytes);
        } else {
          for (int64_t row = 0; row < r.rows; ++row) copy(rows + row * stride, packed + row * row_bytes, row_bytes);
        }
      }
    });
  }

  static void run(const PrefillMetadataParams& p, const at::Tensor&) {
    int32_t extend = 0, swa = 0, csa = 0, hca = 0;
    p.extend_indptr[0] = p.swa_indptr[0] = p.csa_indptr[0] = p.hca_indptr[0] = 0;
    for (int32_t t = 0; t < p.num_tokens; ++t) {
      const PrefillTokenCounts c = prefill_token_counts(p, t);
      p.extend_indptr[t + 1] = extend += c.extend;
      p.swa_indptr[t + 1] = swa += c.swa;
      p.csa_indptr[t + 1] = csa += c.csa;
      p.hca_indptr[t + 1] = hca += c.hca;
      p.prefix_swa_count[t] = c.prefix_swa;
    }
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(ukv, CPU, m) { register_index_ops<CpuBackend>(m); }

}  // namespace ukv::ops
