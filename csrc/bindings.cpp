// The one TORCH_LIBRARY(ukv, m): every torch class and every op schema of
// ukv_torch, in one readable place. Kernels attach per backend with
// TORCH_LIBRARY_IMPL(ukv, CPU|CUDA, m) next to their code in csrc/ops/.
#include <torch/library.h>

#include "ops/sizing_ops.h"

TORCH_LIBRARY(ukv, m) {
  // ---- sizing (no tensors; one C++ source for pools and tensors) ----------
  m.def("slot_counts(int num_swa_blocks, int num_compress_blocks, int[] ks, int block_size=128) -> int[]",
        &ukv::ops::slot_counts);
  m.def("layer_rows(int compress_ratio, int num_swa_blocks, int num_compress_blocks, int block_size=128, "
        "bool unified=True) -> int",
        &ukv::ops::layer_rows);
  m.def("layer_rows_for_slots(int compress_ratio, int type_slots, int num_swa_blocks, int block_size=128) -> int",
        &ukv::ops::layer_rows_for_slots);
  m.def("compress_base_row(bool unified, int num_swa_blocks, int block_size=128) -> int",
        &ukv::ops::compress_base_row);

  // ---- index-building and tensor ops ----------------------------------------
  // Contracts: SPEC.md §2. Outputs are written in place (Tensor(x!)) and never
  // returned. T tokens (batch_id [T], -1 = padding), B sequences (table rows).
  // compress_base is the first compress row: 0 in the unified layout,
  // num_swa_blocks * block_size in the static split (ukv.compress_base_row).
  m.def("csa_translate_pack(Tensor topk_local, Tensor block_table, Tensor positions, Tensor batch_id, "
        "Tensor kv_indptr, Tensor? skip_per_token, Tensor(a!) kv_indices, *, int compress_base, int window=0, "
        "int compress_ratio=4, int block_size=128) -> ()");
  m.def("paged_decode_indices(Tensor swa_block_table, Tensor positions, Tensor batch_id, Tensor swa_indptr, "
        "Tensor(a!) swa_indices, Tensor? csa_indptr=None, Tensor(b!)? csa_indices=None, Tensor? hca_indptr=None, "
        "Tensor(c!)? hca_indices=None, *, int window, int block_size=128) -> ()");
  m.def("hca_decode_indices(Tensor hca_block_table, Tensor batch_id, Tensor n_committed_hca, Tensor hca_indptr, "
        "Tensor(a!) hca_indices, *, int compress_base, int compress_ratio=128, int block_size=128) -> ()");
  m.def("paged_prefill_indices(Tensor positions, Tensor batch_id, Tensor chunk_start, Tensor query_start, "
        "Tensor n_committed_hca, Tensor swa_block_table, Tensor hca_block_table, Tensor extend_indptr, "
        "Tensor swa_indptr, Tensor csa_indptr, Tensor hca_indptr, Tensor(a!) extend_indices, "
        "Tensor(b!) swa_indices, Tensor(c!) csa_indices, Tensor(d!) hca_indices, *, int compress_base, int window, "
        "int compress_ratio=128, int block_size=128) -> ()");
  m.def("decode_index_metadata(Tensor positions, Tensor batch_id, Tensor n_committed_csa, Tensor n_committed_hca, "
        "Tensor(a!) swa_indptr, Tensor(b!) csa_indptr, Tensor(c!) hca_indptr, *, int window, int index_topk, "
        "int csa_ratio=4) -> ()");
  m.def("prefill_index_metadata(Tensor positions, Tensor batch_id, Tensor chunk_start, Tensor n_committed_csa, "
        "Tensor n_committed_hca, Tensor(a!) extend_indptr, Tensor(b!) swa_indptr, Tensor(c!) csa_indptr, "
        "Tensor(d!) hca_indptr, Tensor(e!) prefix_swa_count, *, int window, int index_topk, int csa_ratio=4, "
        "int hca_ratio=128) -> ()");
  m.def("bind_compress_view(Tensor(a) unified_kv, *, int compress_base, int compress_ratio, int block_size=128) "
        "-> Tensor(a)");
}
