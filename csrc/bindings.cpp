// The one TORCH_LIBRARY(ukv, m): every torch class and every op schema of
// ukv_torch, in one readable place. Kernels attach per backend with
// TORCH_LIBRARY_IMPL(ukv, CPU|CUDA, m) next to their code in csrc/ops/.
#include <torch/library.h>

#include "classes/allocator_classes.h"
#include "classes/kv_manager_class.h"
#include "ops/sizing_ops.h"

using ukv::ops::CoordinatorHolder;
using ukv::ops::KvManagerHolder;
using ukv::ops::TypePoolHolder;

TORCH_LIBRARY(ukv, m) {
  // ---- allocator classes (classes first: later schemas may name them) -----
  m.class_<TypePoolHolder>("TypePool")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t>(), "one layer type's shared slot free-list",
           {torch::arg("num_slots"), torch::arg("k"), torch::arg("block_size") = 128, torch::arg("shared_slots") = 0})
      .def("num_slots", &TypePoolHolder::num_slots)
      .def("k", &TypePoolHolder::k)
      .def("block_size", &TypePoolHolder::block_size)
      .def("shared_slots", &TypePoolHolder::shared_slots)
      .def("blocks_per_slot", &TypePoolHolder::blocks_per_slot)
      .def("reserve_slot", &TypePoolHolder::reserve_slot)
      .def("release_slot", &TypePoolHolder::release_slot)
      .def("slot_is_free", &TypePoolHolder::slot_is_free)
      .def("owner", &TypePoolHolder::owner)
      .def("alloc_swa", &TypePoolHolder::alloc_swa)
      .def("free_swa", &TypePoolHolder::free_swa)
      .def("claim_swa", &TypePoolHolder::claim_swa)
      .def("is_free_swa", &TypePoolHolder::is_free_swa)
      .def("has_free_swa", &TypePoolHolder::has_free_swa, "", {torch::arg("n") = 1})
      .def("alloc_swa_n", &TypePoolHolder::alloc_swa_n)
      .def("free_swa_many", &TypePoolHolder::free_swa_many)
      .def("alloc_compress", &TypePoolHolder::alloc_compress)
      .def("free_compress", &TypePoolHolder::free_compress)
      .def("has_free_compress", &TypePoolHolder::has_free_compress, "", {torch::arg("n") = 1})
      .def("alloc_compress_n", &TypePoolHolder::alloc_compress_n)
      .def("free_compress_many", &TypePoolHolder::free_compress_many)
      .def("free_slots", &TypePoolHolder::free_slots)
      .def("free_compress_blocks", &TypePoolHolder::free_compress_blocks)
      .def("counters", &TypePoolHolder::counters)
      .def("check_invariants", &TypePoolHolder::check_invariants)
      .def("__obj_flatten__", &TypePoolHolder::obj_flatten)
      .def_pickle([](const c10::intrusive_ptr<TypePoolHolder>& self) { return self->get_state(); },
                  [](std::vector<int64_t> state) { return TypePoolHolder::from_state(std::move(state)); });

  m.class_<CoordinatorHolder>("Coordinator")
      .def(torch::init<int64_t, std::vector<int64_t>, std::vector<int64_t>, int64_t, bool>(),
           "option-2 coordinator: one shared SWA slot space, one slot pool per compress type "
           "(borrow_unreleased_swa: compress may also borrow SWA slots SWA never used)",
           {torch::arg("num_swa_base"), torch::arg("ks"), torch::arg("num_slots"), torch::arg("block_size") = 128,
            torch::arg("borrow_unreleased_swa") = false})
      .def("num_swa_base", &CoordinatorHolder::num_swa_base)
      .def("block_size", &CoordinatorHolder::block_size)
      .def("num_types", &CoordinatorHolder::num_types)
      .def("borrow_unreleased_swa", &CoordinatorHolder::borrow_unreleased_swa)
      .def("ks", &CoordinatorHolder::ks)
      .def("type_slots", &CoordinatorHolder::type_slots)
      .def("alloc_swa", &CoordinatorHolder::alloc_swa)
      .def("free_swa", &CoordinatorHolder::free_swa)
      .def("claim_swa", &CoordinatorHolder::claim_swa)
      .def("is_free_swa", &CoordinatorHolder::is_free_swa)
      .def("has_free_swa", &CoordinatorHolder::has_free_swa, "", {torch::arg("n") = 1})
      .def("free_swa_slots", &CoordinatorHolder::free_swa_slots)
      .def("alloc_swa_n", &CoordinatorHolder::alloc_swa_n)
      .def("free_swa_many", &CoordinatorHolder::free_swa_many)
      .def("alloc_compress", &CoordinatorHolder::alloc_compress)
      .def("free_compress", &CoordinatorHolder::free_compress)
      .def("has_free_compress", &CoordinatorHolder::has_free_compress, "",
           {torch::arg("type"), torch::arg("n") = 1})
      .def("free_compress_blocks", &CoordinatorHolder::free_compress_blocks)
      .def("alloc_compress_n", &CoordinatorHolder::alloc_compress_n)
      .def("free_compress_many", &CoordinatorHolder::free_compress_many)
      .def("can_allocate_jointly", &CoordinatorHolder::can_allocate_jointly)
      .def("take_evicted_swa", &CoordinatorHolder::take_evicted_swa)
      .def("owner", &CoordinatorHolder::owner)
      .def("pool_slot_is_free", &CoordinatorHolder::pool_slot_is_free)
      .def("counters", &CoordinatorHolder::counters)
      .def("check_invariants", &CoordinatorHolder::check_invariants)
      .def("__obj_flatten__", &CoordinatorHolder::obj_flatten)
      .def_pickle([](const c10::intrusive_ptr<CoordinatorHolder>& self) { return self->get_state(); },
                  [](std::vector<int64_t> state) { return CoordinatorHolder::from_state(std::move(state)); });

  // ---- the sequence-level KV manager --------------------------------------
  m.class_<KvManagerHolder>("KvManager")
      .def(torch::init<c10::Dict<std::string, int64_t>, std::vector<int64_t>, std::vector<int64_t>, double,
                       std::string>(),
           "sequence-level KV manager: prefix cache, sliding window, per-type tables, admission, staging",
           {torch::arg("options"), torch::arg("compress_ks") = std::vector<int64_t>{32, 1},
            torch::arg("type_slots") = std::vector<int64_t>{}, torch::arg("checkpoint_frac") = 0.5,
            torch::arg("device") = std::string()})
      .def("can_allocate", &KvManagerHolder::can_allocate)
      .def("allocate", &KvManagerHolder::allocate)
      .def("ensure_for_tokens", &KvManagerHolder::ensure_for_tokens)
      .def("commit_prefill", &KvManagerHolder::commit_prefill)
      .def("can_append", &KvManagerHolder::can_append, "", {torch::arg("seq_ids"), torch::arg("num_new_tokens") = 1})
      .def("append", &KvManagerHolder::append, "", {torch::arg("seq_ids"), torch::arg("num_new_tokens") = 1})
      .def("commit_decode", &KvManagerHolder::commit_decode)
      .def("deallocate", &KvManagerHolder::deallocate)
      .def("clear_cache", &KvManagerHolder::clear_cache)
      .def("has_sequence", &KvManagerHolder::has_sequence)
      .def("num_sequences", &KvManagerHolder::num_sequences)
      .def("num_computed", &KvManagerHolder::num_computed)
      .def("num_tokens", &KvManagerHolder::num_tokens)
      .def("logical_table", &KvManagerHolder::logical_table)
      .def("swa_table", &KvManagerHolder::swa_table)
      .def("phys_table", &KvManagerHolder::phys_table)
      .def("stage", &KvManagerHolder::stage)
      .def("upload", &KvManagerHolder::upload)
      .def("mark_uploaded", &KvManagerHolder::mark_uploaded)
      .def("invalidate_staging", &KvManagerHolder::invalidate_staging)
      .def("host_tables", &KvManagerHolder::host_tables)
      .def("tables", &KvManagerHolder::tables)
      .def("take_events", &KvManagerHolder::take_events)
      .def("stats", &KvManagerHolder::stats)
      .def("config", &KvManagerHolder::config)
      .def("compress_ks", &KvManagerHolder::compress_ks)
      .def("check_invariants", &KvManagerHolder::check_invariants)
      .def("__obj_flatten__", &KvManagerHolder::obj_flatten)
      .def_pickle([](const c10::intrusive_ptr<KvManagerHolder>& self) { return self->get_state(); },
                  [](std::tuple<std::vector<int64_t>, std::string> state) {
                    return KvManagerHolder::from_state(std::move(state));
                  });

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
  m.def("plan_kv_layout(int budget_bytes, int[] compress_ratios, int head_dim, int kv_elem_bytes, "
        "int rope_head_dim, int rope_elem_bytes, int indexer_bytes_per_block, int block_size, int window, "
        "int mtp_k, int max_num_seqs, int? max_num_batched_tokens, bool full_retain, float swa_budget_frac, str mode) "
        "-> (int[] summary, int[] compress_ks, int[] type_slots, int[] layer_rows)",
        &ukv::ops::plan_kv_layout);

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
