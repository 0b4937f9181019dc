// The one TORCH_LIBRARY(ukv, m): every torch class and every op schema of
// ukv_torch, in one readable place. Kernels attach per backend with
// TORCH_LIBRARY_IMPL(ukv, CPU|CUDA, m) next to their code in csrc/ops/.
#include <torch/library.h>

#include "classes/allocator_classes.h"
#include "classes/kv_manager_class.h"
#include "ops/hash_ops.h"
#include "ops/index_op_args.h"
#include "ops/record_ops.h"
#include "ops/sizing_ops.h"

using ukv::ops::CoordinatorHolder;
using ukv::ops::KvManagerHolder;
using ukv::ops::TypePoolHolder;

TORCH_LIBRARY(ukv, m) {
  // ---- allocator classes (classes first: later schemas may name them) -----
  m.class_<TypePoolHolder>("TypePool")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t>(), "one layer type's shared slot free-list",
           {torch::arg("num_slots"), torch::arg("compress_ratio"), torch::arg("block_size"),
            torch::arg("shared_slots") = 0})
      .def("num_slots", &TypePoolHolder::num_slots)
      .def("k", &TypePoolHolder::k)
      .def("compress_ratio", &TypePoolHolder::compress_ratio)
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
           {torch::arg("num_swa_base"), torch::arg("compress_ratios"), torch::arg("num_slots"), torch::arg("block_size"),
            torch::arg("borrow_unreleased_swa") = false})
      .def("num_swa_base", &CoordinatorHolder::num_swa_base)
      .def("block_size", &CoordinatorHolder::block_size)
      .def("num_types", &CoordinatorHolder::num_types)
      .def("borrow_unreleased_swa", &CoordinatorHolder::borrow_unreleased_swa)
      .def("ks", &CoordinatorHolder::ks)
      .def("compress_ratios", &CoordinatorHolder::compress_ratios)
      .def("type_slots", &CoordinatorHolder::type_slots)
      .def("alloc_swa", &CoordinatorHolder::alloc_swa)
      .def("free_swa", &CoordinatorHolder::free_swa)
      .def("claim_swa", &CoordinatorHolder::claim_swa)
      .def("is_free_swa", &CoordinatorHolder::is_free_swa)
      .def("has_free_swa", &CoordinatorHolder::has_free_swa, "", {torch::arg("n") = 1})
      .def("free_swa_slots", &CoordinatorHolder::free_swa_slots)
      .def("alloc_swa_n", &CoordinatorHolder::alloc_swa_n)
      .def("free_swa_many", &CoordinatorHolder::free_swa_many)
      // The SWA role of one compress type's pool (a released shared slot so taken is not SWA's).
      .def("pool_alloc_swa", &CoordinatorHolder::pool_alloc_swa)
      .def("pool_free_swa", &CoordinatorHolder::pool_free_swa)
      .def("pool_claim_swa", &CoordinatorHolder::pool_claim_swa)
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
      // One compress type's pool through its own methods (upstream's coord.csa / coord.hca).
      .def("pool_free_slots", &CoordinatorHolder::pool_free_slots)
      .def("pool_has_free_swa", &CoordinatorHolder::pool_has_free_swa, "",
           {torch::arg("type"), torch::arg("n") = 1})
      .def("pool_reserve_slot", &CoordinatorHolder::pool_reserve_slot)
      .def("pool_release_slot", &CoordinatorHolder::pool_release_slot)
      .def("counters", &CoordinatorHolder::counters)
      .def("check_invariants", &CoordinatorHolder::check_invariants)
      .def("__obj_flatten__", &CoordinatorHolder::obj_flatten)
      .def_pickle([](const c10::intrusive_ptr<CoordinatorHolder>& self) { return self->get_state(); },
                  [](std::vector<int64_t> state) { return CoordinatorHolder::from_state(std::move(state)); });

  // ---- the sequence-level KV manager --------------------------------------
  m.class_<KvManagerHolder>("KvManager")
      .def(torch::init<std::vector<int64_t>, std::vector<int64_t>, std::string>(),
           "sequence-level KV manager: prefix cache, sliding window, per-type tables, admission, staging "
           "(config and pools: a serialised ukv_torch.ServeConfig and PoolSizes)",
           {torch::arg("config"), torch::arg("pools"), torch::arg("device") = std::string()})
      .def("can_allocate", &KvManagerHolder::can_allocate, "",
           {torch::arg("tokens"), torch::arg("salt") = 0, torch::arg("loaded_tokens") = 0})
      .def("allocate", &KvManagerHolder::allocate, "",
           {torch::arg("seq_id"), torch::arg("tokens"), torch::arg("salt") = 0, torch::arg("loaded_tokens") = 0})
      .def("ensure_for_tokens", &KvManagerHolder::ensure_for_tokens)
      .def("commit_prefill", &KvManagerHolder::commit_prefill)
      .def("can_append", &KvManagerHolder::can_append, "", {torch::arg("seq_ids"), torch::arg("num_new_tokens")})
      .def("append", &KvManagerHolder::append, "", {torch::arg("seq_ids"), torch::arg("num_new_tokens")})
      .def("commit_decode", &KvManagerHolder::commit_decode)
      .def("deallocate", &KvManagerHolder::deallocate)
      .def("clear_cache", &KvManagerHolder::clear_cache)
      .def("has_sequence", &KvManagerHolder::has_sequence)
      .def("set_whole_chunks", &KvManagerHolder::set_whole_chunks)
      .def("whole_chunks", &KvManagerHolder::whole_chunks)
      .def("num_sequences", &KvManagerHolder::num_sequences)
      .def("num_computed", &KvManagerHolder::num_computed)
      .def("num_tokens", &KvManagerHolder::num_tokens)
      .def("logical_table", &KvManagerHolder::logical_table)
      .def("swa_table", &KvManagerHolder::swa_table)
      .def("phys_table", &KvManagerHolder::phys_table)
      .def("staged_swa_table", &KvManagerHolder::staged_swa_table)
      .def("describe_sequence", &KvManagerHolder::describe_sequence)
      .def("import_sequence", &KvManagerHolder::import_sequence)
      .def("locate_blocks", &KvManagerHolder::locate_blocks)
      .def("locate_pages", &KvManagerHolder::locate_pages)
      .def("stage", &KvManagerHolder::stage)
      .def("upload", &KvManagerHolder::upload)
      .def("mark_uploaded", &KvManagerHolder::mark_uploaded)
      .def("invalidate_staging", &KvManagerHolder::invalidate_staging)
      .def("host_tables", &KvManagerHolder::host_tables)
      .def("tables", &KvManagerHolder::tables)
      .def("row_copies", &KvManagerHolder::row_copies)
      .def("row_copy_counts", &KvManagerHolder::row_copy_counts)
      .def("take_events", &KvManagerHolder::take_events)
      .def("stats", &KvManagerHolder::stats)
      .def("config", &KvManagerHolder::config)
      .def("pools", &KvManagerHolder::pools)
      .def("quota_bounds", &KvManagerHolder::quota_bounds)
      .def("check_invariants", &KvManagerHolder::check_invariants)
      .def("__obj_flatten__", &KvManagerHolder::obj_flatten)
      .def_pickle([](const c10::intrusive_ptr<KvManagerHolder>& self) { return self->get_state(); },
                  [](std::tuple<std::vector<int64_t>, std::string> state) {
                    return KvManagerHolder::from_state(std::move(state));
                  });

  // ---- sizing (no tensors; one C++ source for pools and tensors) ----------
  m.def("slot_counts(int num_swa_blocks, int num_compress_blocks, int[] compress_ratios, int block_size) -> int[]",
        &ukv::ops::slot_counts);
  m.def("layer_rows(int compress_ratio, int num_swa_blocks, int num_compress_blocks, int block_size, "
        "bool unified=True) -> int",
        &ukv::ops::layer_rows);
  m.def("layer_rows_for_slots(int compress_ratio, int type_slots, int num_swa_blocks, int block_size) -> int",
        &ukv::ops::layer_rows_for_slots);
  m.def("compress_base_row(bool unified, int num_swa_blocks, int block_size) -> int",
        &ukv::ops::compress_base_row);

  // ---- prefix-cache keys, for routers that replay KV events (no tensors) ---
  // Keys are their unsigned 64-bit words carried as int64: one per xxh64 key,
  // two (lo, hi) per sha256 or blake2b key; salt likewise (0: none).
  m.def("block_hashes(int[] tokens, int block_size, int salt=0, str prefix_hash=\"xxh64\") -> int[]",
        &ukv::ops::block_hashes);
  m.def("swa_page_hashes(int[] block_hashes, int pages_per_block, str prefix_hash=\"xxh64\") -> int[]",
        &ukv::ops::swa_page_hashes);

  // ---- records: configuration and plans cross as serialised records --------
  m.def("record_fields(str record) -> (str[] names, str[] kinds, str[] docs, str[] choices)", &ukv::ops::record_fields);
  m.def("record_defaults(str record) -> int[]", &ukv::ops::record_defaults);
  m.def("validate_record(str record, int[] encoded) -> ()", &ukv::ops::validate_record);
  m.def("plan_kv_layout(int budget_bytes, int[] model, int[] config) -> int[]", &ukv::ops::plan_kv_layout);
  m.def("staged_tables_shape(int[] config) -> int[]", &ukv::ops::staged_tables_shape);
  m.def("staged_table_index(int[] config, str table) -> int", &ukv::ops::staged_table_index);

  // ---- index-building and tensor ops ----------------------------------------
  // Each index op's arguments are listed once, in ops/index_op_args.h; the
  // contracts are in ukv_torch/ops.py. Outputs are written in place
  // (Tensor(x!)) and never returned. T tokens (batch_id [T], -1 = padding),
  // B sequences (table rows). compress_base is the first compress row: 0 in
  // the unified layout, num_swa_blocks * block_size in the static split
  // (ukv.compress_base_row).
  for (const std::string& schema :
       {ukv::ops::CsaTranslatePack::schema(), ukv::ops::PagedDecodeIndices::schema(),
        ukv::ops::HcaDecodeIndices::schema(), ukv::ops::PagedPrefillIndices::schema(),
        ukv::ops::DecodeIndexMetadata::schema(), ukv::ops::PrefillIndexMetadata::schema(),
        ukv::ops::SwaSlotMapping::schema(), ukv::ops::ApplyRowCopies::schema(),
        ukv::ops::GatherRows::schema(), ukv::ops::ScatterRows::schema()})
    m.def(schema.c_str());
  // ---- KV tier objects (ops/object_checksum_ops.h): checksums on the host or the GPU ----
  m.def("seal_objects(Tensor(a!) buffer, Tensor objects) -> ()");
  m.def("verify_objects(Tensor buffer, Tensor objects) -> Tensor");
  m.def("bind_compress_view(Tensor(a) unified_kv, *, int compress_base, int compress_ratio, int block_size, "
        "int? block_stride=None) -> Tensor(a)");
}
