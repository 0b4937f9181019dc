// torch.classes.ukv.KvManager: the torchbind holder of the C++ KV manager and
// of its graph-safe staging buffers (registered in bindings.cpp).
//
// Calls are coarse: whole sequences and whole batches, ids/counts/tokens as
// 1-D CPU tensors, so a decode step costs a few torchbind calls, not one per
// block. A mutex serialises calls from several threads.
#pragma once

#include <torch/custom_class.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/manager/kv_manager.h"
#include "classes/table_stager.h"

namespace ukv::ops {

class KvManagerHolder : public torch::CustomClassHolder {
 public:
  // config and pools: a serialised ServeConfig and PoolSizes (core/config/record.h).
  KvManagerHolder(std::vector<int64_t> config, std::vector<int64_t> pools, std::string device);
  KvManagerHolder(std::unique_ptr<KvManager> manager, std::string device);

  // salt: the request's 64-bit cache salt as int64 (0: none; KvManager::allocate).
  int64_t can_allocate(const at::Tensor& tokens, int64_t salt, int64_t loaded_tokens);
  // loaded_tokens > 0: KvManager::allocate_loaded (a prefix found in a KV tier).
  int64_t allocate(int64_t seq_id, const at::Tensor& tokens, int64_t salt, int64_t loaded_tokens);
  void ensure_for_tokens(const at::Tensor& seq_ids, const at::Tensor& counts);
  void commit_prefill(const at::Tensor& seq_ids, const at::Tensor& counts, const at::Tensor& sampled);
  // num_new_tokens: one count per sequence (1 + its draft tokens this step).
  int64_t can_append(const at::Tensor& seq_ids, const at::Tensor& num_new_tokens);
  void append(const at::Tensor& seq_ids, const at::Tensor& num_new_tokens);
  void commit_decode(const at::Tensor& seq_ids, const at::Tensor& counts, const at::Tensor& tokens);
  void deallocate(const at::Tensor& seq_ids);
  void clear_cache();

  bool has_sequence(int64_t seq_id);
  void set_whole_chunks(bool on);
  bool whole_chunks();
  int64_t num_sequences();
  int64_t num_computed(int64_t seq_id);
  int64_t num_tokens(int64_t seq_id);
  at::Tensor logical_table(int64_t seq_id);
  at::Tensor swa_table(int64_t seq_id);
  at::Tensor phys_table(int64_t seq_id, int64_t type);
  at::Tensor staged_swa_table(int64_t seq_id);

  // A decoding sequence for export: (tokens, num_computed, the first position
  // whose SWA rows travel, block hashes, logical table, staged SWA units,
  // staged physical tables [tables, blocks], salt, the admission's
  // generation, the cached prefix its admission returned).
  using SequenceDescription =
      std::tuple<at::Tensor, int64_t, int64_t, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t>;
  SequenceDescription describe_sequence(int64_t seq_id);
  int64_t import_sequence(int64_t seq_id, const at::Tensor& tokens, int64_t num_computed, int64_t salt);
  // KvManager::locate_blocks / locate_pages: hashes int64 [n] (xxh64: the
  // unsigned bits) or [n, 2] (sha256, blake2b: the lo and hi words), tokens int32 or int64 [n * block_size] (resp. [n * swa_page]);
  // int32 [n, 1 + num_phys_tables] (resp. [n]).
  at::Tensor locate_blocks(const at::Tensor& hashes, const at::Tensor& tokens);
  at::Tensor locate_pages(const at::Tensor& hashes, const at::Tensor& tokens);

  void stage(const at::Tensor& seq_ids);
  void upload(int64_t rows);
  void mark_uploaded();
  void invalidate_staging();
  at::Tensor host_tables();
  at::Tensor tables();
  at::Tensor row_copies();
  at::Tensor row_copy_counts();

  // The events since the last call as two flat tensors (one copy each,
  // whatever the count): int64 [n, 10] rows (kind, seq_no, role, hash,
  // parent_hash, has_parent, salt, num_tokens, hash_hi, parent_hash_hi: the
  // keys' low and high words, the high ones 0 under xxh64), and the int32 tokens of the
  // Stored events, concatenated in event order.
  std::tuple<at::Tensor, at::Tensor> take_events();
  c10::Dict<std::string, int64_t> stats();
  std::vector<int64_t> config();
  std::vector<int64_t> pools();
  c10::Dict<std::string, int64_t> quota_bounds();
  void check_invariants();

  std::tuple<std::vector<int64_t>, std::string> get_state();
  static c10::intrusive_ptr<KvManagerHolder> from_state(std::tuple<std::vector<int64_t>, std::string> state);
  std::tuple<std::tuple<std::string, at::Tensor>, std::tuple<std::string, std::string>> obj_flatten();

 private:
  template <typename F> decltype(auto) locked(F&& fn);
  void make_stager();
  void stage_copies();

  std::mutex mu_;
  std::unique_ptr<KvManager> manager_;
  std::string device_;
  std::unique_ptr<TableStager> stager_;
};

}  // namespace ukv::ops
