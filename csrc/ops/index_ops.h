// Dispatcher entry points of the index-building ops, written once for every
// backend: each validates its arguments with the op's check function
// (index_checks.h) and hands the raw parameters to Backend::run(params, anchor),
// where anchor is an output tensor that fixes the device, and supplies
// kDeviceType, the device type its tensors must be on. A backend file
// (index_ops_cpu.cpp, index_ops_cuda.cu) supplies the run overloads and calls
// register_index_ops<Backend> from its TORCH_LIBRARY_IMPL block. The schemas
// are in csrc/bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "ops/index_checks.h"

namespace ukv::ops {

template <class Backend>
void csa_translate_pack(const at::Tensor& topk_local, const at::Tensor& block_table, const at::Tensor& positions,
                        const at::Tensor& batch_id, const at::Tensor& kv_indptr,
                        const std::optional<at::Tensor>& skip_per_token, at::Tensor& kv_indices,
                        int64_t compress_base, int64_t window, int64_t compress_ratio, int64_t block_size) {
  Backend::run(check_csa_translate_pack(Backend::kDeviceType, topk_local, block_table, positions, batch_id, kv_indptr,
                                        skip_per_token, kv_indices, compress_base, window, compress_ratio, block_size),
               kv_indices);
}

template <class Backend>
void paged_decode_indices(const at::Tensor& swa_block_table, const at::Tensor& positions, const at::Tensor& batch_id,
                          const at::Tensor& swa_indptr, at::Tensor& swa_indices,
                          const std::optional<at::Tensor>& csa_indptr, const std::optional<at::Tensor>& csa_indices,
                          const std::optional<at::Tensor>& hca_indptr, const std::optional<at::Tensor>& hca_indices,
                          int64_t window, int64_t block_size) {
  Backend::run(check_paged_decode_indices(Backend::kDeviceType, swa_block_table, positions, batch_id, swa_indptr,
                                          swa_indices, csa_indptr, csa_indices, hca_indptr, hca_indices, window,
                                          block_size),
               swa_indices);
}

template <class Backend>
void hca_decode_indices(const at::Tensor& hca_block_table, const at::Tensor& batch_id,
                        const at::Tensor& n_committed_hca, const at::Tensor& hca_indptr, at::Tensor& hca_indices,
                        int64_t compress_base, int64_t compress_ratio, int64_t block_size) {
  Backend::run(check_hca_decode_indices(Backend::kDeviceType, hca_block_table, batch_id, n_committed_hca, hca_indptr,
                                        hca_indices, compress_base, compress_ratio, block_size),
               hca_indices);
}

template <class Backend>
void paged_prefill_indices(const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& chunk_start,
                           const at::Tensor& query_start, const at::Tensor& n_committed_hca,
                           const at::Tensor& swa_block_table, const at::Tensor& hca_block_table,
                           const at::Tensor& extend_indptr, const at::Tensor& swa_indptr,
                           const at::Tensor& csa_indptr, const at::Tensor& hca_indptr, at::Tensor& extend_indices,
                           at::Tensor& swa_indices, at::Tensor& csa_indices, at::Tensor& hca_indices,
                           int64_t compress_base, int64_t window, int64_t compress_ratio, int64_t block_size) {
  Backend::run(check_paged_prefill_indices(Backend::kDeviceType, positions, batch_id, chunk_start, query_start,
                                           n_committed_hca, swa_block_table, hca_block_table, extend_indptr, swa_indptr,
                                           csa_indptr, hca_indptr, extend_indices, swa_indices, csa_indices,
                                           hca_indices, compress_base, window, compress_ratio, block_size),
               hca_indices);
}

template <class Backend>
void decode_index_metadata(const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& n_committed_csa,
                           const at::Tensor& n_committed_hca, at::Tensor& swa_indptr, at::Tensor& csa_indptr,
                           at::Tensor& hca_indptr, int64_t window, int64_t index_topk, int64_t csa_ratio) {
  Backend::run(check_decode_index_metadata(Backend::kDeviceType, positions, batch_id, n_committed_csa, n_committed_hca,
                                           swa_indptr, csa_indptr, hca_indptr, window, index_topk, csa_ratio),
               swa_indptr);
}

template <class Backend>
void prefill_index_metadata(const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& chunk_start,
                            const at::Tensor& n_committed_csa, const at::Tensor& n_committed_hca,
                            at::Tensor& extend_indptr, at::Tensor& swa_indptr, at::Tensor& csa_indptr,
                            at::Tensor& hca_indptr, at::Tensor& prefix_swa_count, int64_t window, int64_t index_topk,
                            int64_t csa_ratio, int64_t hca_ratio) {
  Backend::run(check_prefill_index_metadata(Backend::kDeviceType, positions, batch_id, chunk_start, n_committed_csa,
                                            n_committed_hca, extend_indptr, swa_indptr, csa_indptr, hca_indptr,
                                            prefix_swa_count, window, index_topk, csa_ratio, hca_ratio),
               extend_indptr);
}

template <class Backend>
void register_index_ops(torch::Library& m) {
  m.impl("csa_translate_pack", &csa_translate_pack<Backend>);
  m.impl("paged_decode_indices", &paged_decode_indices<Backend>);
  m.impl("hca_decode_indices", &hca_decode_indices<Backend>);
  m.impl("paged_prefill_indices", &paged_prefill_indices<Backend>);
  m.impl("decode_index_metadata", &decode_index_metadata<Backend>);
  m.impl("prefill_index_metadata", &prefill_index_metadata<Backend>);
}

}  // namespace ukv::ops
