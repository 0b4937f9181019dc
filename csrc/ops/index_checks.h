// Input validation of the index-building ops: one function per op, shared by
// the CPU and the GPU implementation. Each checks dtype, device, dimensions,
// sizes, strides and scalar ranges, and returns the raw kernel parameters.
// device_type is the backend's (CPU or CUDA): a tensor elsewhere is refused by
// name, rather than read through a pointer of the wrong kind.
// Data values are not inspected (that would need a host sync on the GPU); the
// kernels are written so that no value can make them access memory out of
// bounds (csrc/kernels/index_formulas.h).
//
// A failure names the op, the argument and the expectation: TypeError for a
// wrong dtype, RuntimeError for a wrong device, ValueError for the rest.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "kernels/index_params.h"

namespace ukv::ops {

kernels::CsaTranslatePackParams check_csa_translate_pack(
    c10::DeviceType device_type, const at::Tensor& topk_local, const at::Tensor& block_table,
    const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& kv_indptr,
    const std::optional<at::Tensor>& skip_per_token, const at::Tensor& kv_indices, int64_t compress_base,
    int64_t window, int64_t compress_ratio, int64_t block_size);

kernels::PagedDecodeParams check_paged_decode_indices(
    c10::DeviceType device_type, const at::Tensor& swa_block_table, const at::Tensor& positions,
    const at::Tensor& batch_id, const at::Tensor& swa_indptr, const at::Tensor& swa_indices,
    const std::optional<at::Tensor>& csa_indptr, const std::optional<at::Tensor>& csa_indices,
    const std::optional<at::Tensor>& hca_indptr, const std::optional<at::Tensor>& hca_indices, int64_t window,
    int64_t block_size);

kernels::HcaDecodeParams check_hca_decode_indices(
    c10::DeviceType device_type, const at::Tensor& hca_block_table, const at::Tensor& batch_id,
    const at::Tensor& n_committed_hca, const at::Tensor& hca_indptr, const at::Tensor& hca_indices,
    int64_t compress_base, int64_t compress_ratio, int64_t block_size);

kernels::PagedPrefillParams check_paged_prefill_indices(
    c10::DeviceType device_type, const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& chunk_start,
    const at::Tensor& query_start, const at::Tensor& n_committed_hca, const at::Tensor& swa_block_table,
    const at::Tensor& hca_block_table, const at::Tensor& extend_indptr, const at::Tensor& swa_indptr,
    const at::Tensor& csa_indptr, const at::Tensor& hca_indptr, const at::Tensor& extend_indices,
    const at::Tensor& swa_indices, const at::Tensor& csa_indices, const at::Tensor& hca_indices,
    int64_t compress_base, int64_t window, int64_t compress_ratio, int64_t block_size);

kernels::DecodeMetadataParams check_decode_index_metadata(
    c10::DeviceType device_type, const at::Tensor& positions, const at::Tensor& batch_id,
    const at::Tensor& n_committed_csa, const at::Tensor& n_committed_hca, const at::Tensor& swa_indptr,
    const at::Tensor& csa_indptr, const at::Tensor& hca_indptr, int64_t window, int64_t index_topk, int64_t csa_ratio);

kernels::PrefillMetadataParams check_prefill_index_metadata(
    c10::DeviceType device_type, const at::Tensor& positions, const at::Tensor& batch_id, const at::Tensor& chunk_start,
    const at::Tensor& n_committed_csa, const at::Tensor& n_committed_hca, const at::Tensor& extend_indptr,
    const at::Tensor& swa_indptr, const at::Tensor& csa_indptr, const at::Tensor& hca_indptr,
    const at::Tensor& prefix_swa_count, int64_t window, int64_t index_topk, int64_t csa_ratio, int64_t hca_ratio);

}  // namespace ukv::ops
