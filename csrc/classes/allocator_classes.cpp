#include "classes/allocator_classes.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>

#include "classes/tensor_args.h"
#include "core/config/sizing.h"
#include "ops/core_errors.h"

namespace ukv::ops {
namespace {

at::Tensor to_tensor(const std::vector<int64_t>& ids) {
  return at::tensor(at::ArrayRef<int64_t>(ids), at::TensorOptions().dtype(at::kLong));
}

std::string owner_str(SlotOwner o) {
  std::string s = slot_owner_name(o);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

c10::Dict<std::string, int64_t> pool_counters(const TypePool& p) {
  c10::Dict<std::string, int64_t> d;
  const auto& c = p.counters();
  d.insert("swa_allocs", c.swa_allocs);
  d.insert("swa_frees", c.swa_frees);
  d.insert("compress_allocs", c.compress_allocs);
  d.insert("compress_frees", c.compress_frees);
  d.insert("borrows", c.borrows);
  return d;
}

}  // namespace

// ---------------------------------------------------------------- TypePool --

template <typename F>
decltype(auto) TypePoolHolder::locked(F&& fn) {
  std::lock_guard<std::mutex> guard(mu_);
  return translate_core_errors(std::forward<F>(fn));
}

TypePoolHolder::TypePoolHolder(int64_t num_slots, int64_t compress_ratio, int64_t block_size, int64_t shared_slots)
    : pool_(translate_core_errors([&] {
        return TypePool(num_slots, rows_per_compress_block(compress_ratio, block_size), block_size, shared_slots);
      })) {}

bool TypePoolHolder::reserve_slot(int64_t slot) { return locked([&] { return pool_.reserve_slot(slot); }); }
void TypePoolHolder::release_slot(int64_t slot) { locked([&] { pool_.release_slot(slot); }); }
bool TypePoolHolder::slot_is_free(int64_t slot) { return locked([&] { return pool_.slot_is_free(slot); }); }
std::string TypePoolHolder::owner(int64_t slot) { return locked([&] { return owner_str(pool_.owner(slot)); }); }

int64_t TypePoolHolder::alloc_swa() { return locked([&] { return pool_.alloc_swa(); }); }
void TypePoolHolder::free_swa(int64_t slot) { locked([&] { pool_.free_swa(slot); }); }
void TypePoolHolder::claim_swa(int64_t slot) { locked([&] { pool_.claim_swa(slot); }); }
bool TypePoolHolder::is_free_swa(int64_t slot) { return locked([&] { return pool_.is_free_swa(slot); }); }
bool TypePoolHolder::has_free_swa(int64_t n) { return locked([&] { return pool_.has_free_swa(n); }); }
at::Tensor TypePoolHolder::alloc_swa_n(int64_t n) { return to_tensor(alloc_n(BatchRole::kSwa, 0, n)); }
void TypePoolHolder::free_swa_many(const at::Tensor& slots) {
  const at::Tensor ids = int64_arg(slots, "slots");
  free_many(BatchRole::kSwa, 0, ids.data_ptr<int64_t>(), ids.numel());
}

int64_t TypePoolHolder::alloc_compress() { return locked([&] { return pool_.alloc_compress(); }); }
void TypePoolHolder::free_compress(int64_t phys) { locked([&] { pool_.free_compress(phys); }); }
bool TypePoolHolder::has_free_compress(int64_t n) { return locked([&] { return pool_.has_free_compress(n); }); }
at::Tensor TypePoolHolder::alloc_compress_n(int64_t n) { return to_tensor(alloc_n(BatchRole::kCompress, 0, n)); }
void TypePoolHolder::free_compress_many(const at::Tensor& ids) {
  const at::Tensor batch = int64_arg(ids, "ids");
  free_many(BatchRole::kCompress, 0, batch.data_ptr<int64_t>(), batch.numel());
}

std::vector<int64_t> TypePoolHolder::alloc_n(BatchRole role, int64_t type, int64_t n) {
  return locked([&] {
    require(type == 0, "a TypePool has one compress type (0), got type ", type);
    return role == BatchRole::kSwa ? pool_.alloc_swa_n(n) : pool_.alloc_compress_n(n);
  });
}
void TypePoolHolder::alloc_into(BatchRole role, int64_t type, int64_t n, int64_t* out) {
  locked([&] {
    require(type == 0, "a TypePool has one compress type (0), got type ", type);
    if (role == BatchRole::kSwa) {
      pool_.alloc_swa_into(n, out);
    } else {
      pool_.alloc_compress_into(n, out);
    }
  });
}
void TypePoolHolder::free_many(BatchRole role, int64_t type, const int64_t* ids, int64_t n) {
  locked([&] {
    require(type == 0, "a TypePool has one compress type (0), got type ", type);
    if (role == BatchRole::kSwa) {
      pool_.free_swa_many(ids, static_cast<size_t>(n));
    } else {
      pool_.free_compress_many(ids, static_cast<size_t>(n));
    }
  });
}

int64_t TypePoolHolder::free_slots() { return locked([&] { return pool_.free_slots(); }); }
int64_t TypePoolHolder::free_compress_blocks() { return locked([&] { return pool_.free_compress_blocks(); }); }
c10::Dict<std::string, int64_t> TypePoolHolder::counters() { return locked([&] { return pool_counters(pool_); }); }
void TypePoolHolder::check_invariants() { locked([&] { pool_.check_invariants(); }); }

std::vector<int64_t> TypePoolHolder::get_state() { return locked([&] { return pool_.to_state(); }); }
c10::intrusive_ptr<TypePoolHolder> TypePoolHolder::from_state(std::vector<int64_t> state) {
  return c10::make_intrusive<TypePoolHolder>(translate_core_errors([&] { return TypePool::from_state(state); }));
}
std::tuple<std::tuple<std::string, at::Tensor>> TypePoolHolder::obj_flatten() {
  return {{"state", to_tensor(get_state())}};
}

// ------------------------------------------------------------- Coordinator --

template <typename F>
decltype(auto) CoordinatorHolder::locked(F&& fn) {
  std::lock_guard<std::mutex> guard(mu_);
  return translate_core_errors(std::forward<F>(fn));
}

CoordinatorHolder::CoordinatorHolder(int64_t num_swa_base, std::vector<int64_t> compress_ratios,
                                     std::vector<int64_t> num_slots, int64_t block_size, bool borrow_unreleased_swa)
    : coord_(translate_core_errors([&] {
        require(compress_ratios.size() == num_slots.size(), "compress_ratios and num_slots must have the same length, got ",
                compress_ratios.size(), " and ", num_slots.size());
        std::vector<CompressTypeSpec> types;
        for (size_t t = 0; t < compress_ratios.size(); ++t) {
          require(compress_ratios[t] > 0, "compress_ratios must be > 0, got ", compress_ratios[t]);
          types.push_back({rows_per_compress_block(compress_ratios[t], block_size), num_slots[t]});
        }
        return Coordinator(num_swa_base, types, block_size, borrow_unreleased_swa);
      })) {}

std::vector<int64_t> CoordinatorHolder::compress_ratios() {
  return locked([&] {
    std::vector<int64_t> out;
    for (int64_t t = 0; t < coord_.num_types(); ++t) out.push_back(coord_.block_size() / coord_.pool(t).k());
    return out;
  });
}

std::vector<int64_t> CoordinatorHolder::ks() {
  return locked([&] {
    std::vector<int64_t> out;
    for (int64_t t = 0; t < coord_.num_types(); ++t) out.push_back(coord_.pool(t).k());
    return out;
  });
}

std::vector<int64_t> CoordinatorHolder::type_slots() {
  return locked([&] {
    std::vector<int64_t> out;
    for (int64_t t = 0; t < coord_.num_types(); ++t) out.push_back(coord_.pool(t).num_slots());
    return out;
  });
}

int64_t CoordinatorHolder::alloc_swa() { return locked([&] { return coord_.alloc_swa(); }); }
void CoordinatorHolder::free_swa(int64_t slot) { locked([&] { coord_.free_swa(slot); }); }
void CoordinatorHolder::claim_swa(int64_t slot) { locked([&] { coord_.claim_swa(slot); }); }
bool CoordinatorHolder::is_free_swa(int64_t slot) { return locked([&] { return coord_.is_free_swa(slot); }); }
bool CoordinatorHolder::has_free_swa(int64_t n) { return locked([&] { return coord_.has_free_swa(n); }); }
int64_t CoordinatorHolder::free_swa_slots() { return locked([&] { return coord_.free_swa_slots(); }); }
at::Tensor CoordinatorHolder::alloc_swa_n(int64_t n) { return to_tensor(alloc_n(BatchRole::kSwa, 0, n)); }
void CoordinatorHolder::free_swa_many(const at::Tensor& slots) {
  const at::Tensor ids = int64_arg(slots, "slots");
  free_many(BatchRole::kSwa, 0, ids.data_ptr<int64_t>(), ids.numel());
}

int64_t CoordinatorHolder::alloc_compress(int64_t type) { return locked([&] { return coord_.alloc_compress(type); }); }
void CoordinatorHolder::free_compress(int64_t type, int64_t phys) { locked([&] { coord_.free_compress(type, phys); }); }
bool CoordinatorHolder::has_free_compress(int64_t type, int64_t n) {
  return locked([&] { return coord_.has_free_compress(type, n); });
}
int64_t CoordinatorHolder::free_compress_blocks(int64_t type) {
  return locked([&] { return coord_.free_compress_blocks(type); });
}
at::Tensor CoordinatorHolder::alloc_compress_n(int64_t type, int64_t n) {
  return to_tensor(alloc_n(BatchRole::kCompress, type, n));
}
void CoordinatorHolder::free_compress_many(int64_t type, const at::Tensor& ids) {
  const at::Tensor batch = int64_arg(ids, "ids");
  free_many(BatchRole::kCompress, type, batch.data_ptr<int64_t>(), batch.numel());
}

std::vector<int64_t> CoordinatorHolder::alloc_n(BatchRole role, int64_t type, int64_t n) {
  return locked([&] { return role == BatchRole::kSwa ? coord_.alloc_swa_n(n) : coord_.alloc_compress_n(type, n); });
}
void CoordinatorHolder::alloc_into(BatchRole role, int64_t type, int64_t n, int64_t* out) {
  locked([&] {
    if (role == BatchRole::kSwa) {
      coord_.alloc_swa_into(n, out);
    } else {
      coord_.alloc_compress_into(type, n, out);
    }
  });
}
void CoordinatorHolder::free_many(BatchRole role, int64_t type, const int64_t* ids, int64_t n) {
  locked([&] {
    if (role == BatchRole::kSwa) {
      coord_.free_swa_many(ids, static_cast<size_t>(n));
    } else {
      coord_.free_compress_many(type, ids, static_cast<size_t>(n));
    }
  });
}
bool CoordinatorHolder::can_allocate_jointly(int64_t n_swa, std::vector<int64_t> compress_demand) {
  return locked([&] { return coord_.can_allocate_jointly(n_swa, compress_demand); });
}

std::vector<int64_t> CoordinatorHolder::take_evicted_swa() { return locked([&] { return coord_.take_evicted_swa(); }); }
std::string CoordinatorHolder::owner(int64_t type, int64_t slot) {
  return locked([&] { return owner_str(coord_.pool(type, "owner").owner(slot)); });
}
bool CoordinatorHolder::pool_slot_is_free(int64_t type, int64_t slot) {
  return locked([&] { return coord_.pool(type, "pool_slot_is_free").slot_is_free(slot); });
}
bool CoordinatorHolder::pool_reserve_slot(int64_t type, int64_t slot) {
  return locked([&] { return coord_.pool_reserve_slot(type, slot); });
}
void CoordinatorHolder::pool_release_slot(int64_t type, int64_t slot) {
  locked([&] { coord_.pool_release_slot(type, slot); });
}
int64_t CoordinatorHolder::pool_alloc_swa(int64_t type) { return locked([&] { return coord_.pool_alloc_swa(type); }); }
void CoordinatorHolder::pool_free_swa(int64_t type, int64_t slot) { locked([&] { coord_.pool_free_swa(type, slot); }); }
void CoordinatorHolder::pool_claim_swa(int64_t type, int64_t slot) {
  locked([&] { coord_.pool_claim_swa(type, slot); });
}
bool CoordinatorHolder::pool_has_free_swa(int64_t type, int64_t n) {
  return locked([&] { return coord_.pool(type, "pool_has_free_swa").has_free_swa(n); });
}
int64_t CoordinatorHolder::pool_free_slots(int64_t type) {
  return locked([&] { return coord_.pool(type, "pool_free_slots").free_slots(); });
}

c10::Dict<std::string, int64_t> CoordinatorHolder::counters() {
  return locked([&] {
    c10::Dict<std::string, int64_t> d;
    const auto& c = coord_.counters();
    d.insert("swa_allocs", c.swa_allocs);
    d.insert("swa_frees", c.swa_frees);
    d.insert("swa_claims", c.swa_claims);
    d.insert("swa_evictions", c.swa_evictions);
    d.insert("unreleased_borrows", c.unreleased_borrows);
    for (int64_t t = 0; t < coord_.num_types(); ++t) {
      const auto& pc = coord_.pool(t).counters();
      const std::string prefix = "type" + std::to_string(t) + "_";
      d.insert(prefix + "compress_allocs", pc.compress_allocs);
      d.insert(prefix + "compress_frees", pc.compress_frees);
      d.insert(prefix + "borrows", pc.borrows);
    }
    return d;
  });
}

void CoordinatorHolder::check_invariants() { locked([&] { coord_.check_invariants(); }); }

std::vector<int64_t> CoordinatorHolder::get_state() { return locked([&] { return coord_.to_state(); }); }
c10::intrusive_ptr<CoordinatorHolder> CoordinatorHolder::from_state(std::vector<int64_t> state) {
  return c10::make_intrusive<CoordinatorHolder>(translate_core_errors([&] { return Coordinator::from_state(state); }));
}
std::tuple<std::tuple<std::string, at::Tensor>> CoordinatorHolder::obj_flatten() {
  return {{"state", to_tensor(get_state())}};
}

}  // namespace ukv::ops
