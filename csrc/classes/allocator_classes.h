// torchbind holders of the allocator core: torch.classes.ukv.TypePool and
// torch.classes.ukv.Coordinator (registered in bindings.cpp).
//
// Each holder owns one core object behind a mutex (methods may be called from
// several threads), translates core exceptions into torch errors, and offers
// batch methods taking/returning int64 tensors so a caller pays one call per
// batch. Batch methods are all-or-nothing: they validate the whole batch
// before changing anything.
#pragma once

#include <torch/custom_class.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/slots/coordinator.h"
#include "core/slots/type_pool.h"

namespace ukv::ops {

enum class BatchRole : int64_t { kSwa = 0, kCompress = 1 };

class TypePoolHolder : public torch::CustomClassHolder {
 public:
  // Compress blocks are named by their ratio (k = block_size / compress_ratio;
  // 0 = an SWA-only pool), as everywhere in ukv_torch's public API.
  TypePoolHolder(int64_t num_slots, int64_t compress_ratio, int64_t block_size, int64_t shared_slots);
  explicit TypePoolHolder(TypePool pool) : pool_(std::move(pool)) {}

  int64_t num_slots() const { return pool_.num_slots(); }
  int64_t k() const { return pool_.k(); }
  int64_t compress_ratio() const { return pool_.k() == 0 ? 0 : pool_.block_size() / pool_.k(); }
  int64_t block_size() const { return pool_.block_size(); }
  int64_t shared_slots() const { return pool_.shared_slots(); }
  int64_t blocks_per_slot() const { return pool_.blocks_per_slot(); }

  bool reserve_slot(int64_t slot);
  void release_slot(int64_t slot);
  bool slot_is_free(int64_t slot);
  std::string owner(int64_t slot);

  int64_t alloc_swa();
  void free_swa(int64_t slot);
  void claim_swa(int64_t slot);
  bool is_free_swa(int64_t slot);
  bool has_free_swa(int64_t n);
  at::Tensor alloc_swa_n(int64_t n);
  void free_swa_many(const at::Tensor& slots);

  int64_t alloc_compress();
  void free_compress(int64_t phys);
  bool has_free_compress(int64_t n);
  at::Tensor alloc_compress_n(int64_t n);
  void free_compress_many(const at::Tensor& ids);

  // The batch methods on raw ids, for the tensor methods above and the CPython
  // fast path (csrc/python/batch_calls.cpp). A pool has one compress type: type 0.
  std::vector<int64_t> alloc_n(BatchRole role, int64_t type, int64_t n);
  void alloc_into(BatchRole role, int64_t type, int64_t n, int64_t* out);
  void free_many(BatchRole role, int64_t type, const int64_t* ids, int64_t n);

  int64_t free_slots();
  int64_t free_compress_blocks();
  c10::Dict<std::string, int64_t> counters();
  void check_invariants();

  std::vector<int64_t> get_state();
  static c10::intrusive_ptr<TypePoolHolder> from_state(std::vector<int64_t> state);
  std::tuple<std::tuple<std::string, at::Tensor>> obj_flatten();

 private:
  template <typename F> decltype(auto) locked(F&& fn);
  std::mutex mu_;
  TypePool pool_;
};

class CoordinatorHolder : public torch::CustomClassHolder {
 public:
  // One compress type per ratio (k = block_size / ratio), each with its slots.
  CoordinatorHolder(int64_t num_swa_base, std::vector<int64_t> compress_ratios, std::vector<int64_t> num_slots,
                    int64_t block_size, bool borrow_unreleased_swa);
  explicit CoordinatorHolder(Coordinator c) : coord_(std::move(c)) {}

  int64_t num_swa_base() const { return coord_.num_swa_base(); }
  int64_t block_size() const { return coord_.block_size(); }
  int64_t num_types() const { return coord_.num_types(); }
  bool borrow_unreleased_swa() const { return coord_.borrow_unreleased_swa(); }
  std::vector<int64_t> ks();
  std::vector<int64_t> compress_ratios();
  std::vector<int64_t> type_slots();

  int64_t alloc_swa();
  void free_swa(int64_t slot);
  void claim_swa(int64_t slot);
  bool is_free_swa(int64_t slot);
  bool has_free_swa(int64_t n);
  int64_t free_swa_slots();
  at::Tensor alloc_swa_n(int64_t n);
  void free_swa_many(const at::Tensor& slots);

  int64_t alloc_compress(int64_t type);
  void free_compress(int64_t type, int64_t phys);
  bool has_free_compress(int64_t type, int64_t n);
  int64_t free_compress_blocks(int64_t type);
  at::Tensor alloc_compress_n(int64_t type, int64_t n);
  void free_compress_many(int64_t type, const at::Tensor& ids);
  bool can_allocate_jointly(int64_t n_swa, std::vector<int64_t> compress_demand);

  // The batch methods on raw ids (see TypePoolHolder::alloc_n); `type` is the
  // compress type, ignored for the SWA role.
  std::vector<int64_t> alloc_n(BatchRole role, int64_t type, int64_t n);
  void alloc_into(BatchRole role, int64_t type, int64_t n, int64_t* out);
  void free_many(BatchRole role, int64_t type, const int64_t* ids, int64_t n);

  std::vector<int64_t> take_evicted_swa();
  std::string owner(int64_t type, int64_t slot);
  bool pool_slot_is_free(int64_t type, int64_t slot);

  // One compress type's pool through its own methods (Coordinator::pool_*).
  bool pool_reserve_slot(int64_t type, int64_t slot);
  void pool_release_slot(int64_t type, int64_t slot);
  int64_t pool_alloc_swa(int64_t type);
  void pool_free_swa(int64_t type, int64_t slot);
  void pool_claim_swa(int64_t type, int64_t slot);
  bool pool_has_free_swa(int64_t type, int64_t n);
  int64_t pool_free_slots(int64_t type);
  c10::Dict<std::string, int64_t> counters();
  void check_invariants();

  std::vector<int64_t> get_state();
  static c10::intrusive_ptr<CoordinatorHolder> from_state(std::vector<int64_t> state);
  std::tuple<std::tuple<std::string, at::Tensor>> obj_flatten();

 private:
  template <typename F> decltype(auto) locked(F&& fn);
  std::mutex mu_;
  Coordinator coord_;
};

}  // namespace ukv::ops
