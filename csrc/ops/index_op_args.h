// The index-building ops' arguments, each op's list written once (op_args.h
// turns it into the schema, the typed Args struct and the boxed kernel).
// Contracts: ukv_torch/ops.py. Entries: X(kind, name, default).
#pragma once

#include "ops/op_args.h"

namespace ukv::ops {

#define UKV_CSA_TRANSLATE_PACK_ARGS(X)                                                             \
  X(In, topk_local, "") X(In, block_table, "") X(In, positions, "") X(In, batch_id, "")           \
  X(In, kv_indptr, "") X(OutA, kv_indices, "") X(Int, compress_base, "") X(Int, window, "0")      \
  X(OptIn, skip_per_token, "None") X(Int, compress_ratio, "4") X(Int, block_size, "")                 \
  X(OptInt, block_stride, "None")
UKV_DESCRIBE_OP(CsaTranslatePack, "csa_translate_pack", UKV_CSA_TRANSLATE_PACK_ARGS)

#define UKV_PAGED_DECODE_INDICES_ARGS(X)                                                           \
  X(In, swa_block_table, "") X(In, positions, "") X(In, batch_id, "") X(In, swa_indptr, "")       \
  X(OutA, swa_indices, "") X(OptIn, csa_indptr, "None") X(OptOutB, csa_indices, "None")           \
  X(OptIn, hca_indptr, "None") X(OptOutC, hca_indices, "None") X(Int, window, "")                 \
  X(Int, block_size, "") X(OptInts, swa_rows, "None") X(OptInts, csa_swa_rows, "None")             \
  X(OptInts, hca_swa_rows, "None")
UKV_DESCRIBE_OP(PagedDecodeIndices, "paged_decode_indices", UKV_PAGED_DECODE_INDICES_ARGS)

#define UKV_HCA_DECODE_INDICES_ARGS(X)                                                             \
  X(In, hca_block_table, "") X(In, batch_id, "") X(In, n_committed_hca, "") X(In, hca_indptr, "") \
  X(OutA, hca_indices, "") X(Int, compress_base, "") X(Int, compress_ratio, "128")                \
  X(Int, block_size, "") X(OptInt, block_stride, "None")
UKV_DESCRIBE_OP(HcaDecodeIndices, "hca_decode_indices", UKV_HCA_DECODE_INDICES_ARGS)

#define UKV_PAGED_PREFILL_INDICES_ARGS(X)                                                          \
  X(In, positions, "") X(In, batch_id, "") X(In, chunk_start, "") X(In, query_start, "")          \
  X(In, n_committed_hca, "") X(In, swa_block_table, "") X(In, hca_block_table, "")                \
  X(In, extend_indptr, "") X(In, swa_indptr, "") X(In, csa_indptr, "") X(In, hca_indptr, "")      \
  X(OutA, extend_indices, "") X(OutB, swa_indices, "") X(OutC, csa_indices, "")                   \
  X(OutD, hca_indices, "") X(Int, compress_base, "") X(Int, window, "")                           \
  X(Int, compress_ratio, "128") X(Int, block_size, "") X(OptInts, swa_rows, "None")                \
  X(OptInts, csa_swa_rows, "None") X(OptInts, hca_swa_rows, "None") X(OptInt, hca_block_stride, "None")
UKV_DESCRIBE_OP(PagedPrefillIndices, "paged_prefill_indices", UKV_PAGED_PREFILL_INDICES_ARGS)

#define UKV_DECODE_INDEX_METADATA_ARGS(X)                                                          \
  X(In, positions, "") X(In, batch_id, "") X(In, n_committed_csa, "") X(In, n_committed_hca, "")  \
  X(OutA, swa_indptr, "") X(OutB, csa_indptr, "") X(OutC, hca_indptr, "") X(Int, window, "")      \
  X(Int, index_topk, "") X(Int, csa_ratio, "4")
UKV_DESCRIBE_OP(DecodeIndexMetadata, "decode_index_metadata", UKV_DECODE_INDEX_METADATA_ARGS)

#define UKV_PREFILL_INDEX_METADATA_ARGS(X)                                                         \
  X(In, positions, "") X(In, batch_id, "") X(In, chunk_start, "") X(In, n_committed_csa, "")      \
  X(In, n_committed_hca, "") X(OutA, extend_indptr, "") X(OutB, swa_indptr, "")                   \
  X(OutC, csa_indptr, "") X(OutD, hca_indptr, "") X(OutE, prefix_swa_count, "")                   \
  X(Int, window, "") X(Int, index_topk, "") X(Int, csa_ratio, "4") X(Int, hca_ratio, "128")
UKV_DESCRIBE_OP(PrefillIndexMetadata, "prefill_index_metadata", UKV_PREFILL_INDEX_METADATA_ARGS)

#define UKV_SWA_SLOT_MAPPING_ARGS(X)                                                               \
  X(In, swa_block_table, "") X(In, positions, "") X(In, batch_id, "") X(OutA, slot_mapping, "")     \
  X(Int, block_size, "") X(OptInts, swa_rows, "None")
UKV_DESCRIBE_OP(SwaSlotMapping, "swa_slot_mapping", UKV_SWA_SLOT_MAPPING_ARGS)

#define UKV_APPLY_ROW_COPIES_ARGS(X) X(OutListA, planes, "") X(In, copies, "") X(In, copy_counts, "")
UKV_DESCRIBE_OP(ApplyRowCopies, "apply_row_copies", UKV_APPLY_ROW_COPIES_ARGS)

#define UKV_GATHER_ROWS_ARGS(X)                                                                   \
  X(InList, sources, "") X(In, runs, "") X(In, run_count, "") X(OutA, buffer, "")                 \
  X(OptInts, layer_offsets, "None")
UKV_DESCRIBE_OP(GatherRows, "gather_rows", UKV_GATHER_ROWS_ARGS)

#define UKV_SCATTER_ROWS_ARGS(X)                                                                  \
  X(OutListA, targets, "") X(In, runs, "") X(In, run_count, "") X(In, buffer, "")                 \
  X(OptInts, layer_offsets, "None")
UKV_DESCRIBE_OP(ScatterRows, "scatter_rows", UKV_SCATTER_ROWS_ARGS)

}  // namespace ukv::ops
