#include "core/slots/coordinator.h"

#include <algorithm>
#include <limits>

#include "core/slots/batch.h"
#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {

Coordinator::Coordinator(int64_t num_swa_base, std::vector<CompressTypeSpec> types, int64_t block_size,
                         bool borrow_unreleased_swa)
    : num_swa_base_(num_swa_base), block_size_(block_size), borrow_unreleased_swa_(borrow_unreleased_swa) {
  require(num_swa_base >= 0, "num_swa_base must be >= 0, got ", num_swa_base);
  require(block_size > 0, "block_size must be > 0, got ", block_size);
  // Dense layers have exactly the SWA space's rows; with no compress type no
  // TypePool would catch an SWA space beyond the int32 row limit.
  require(num_swa_base <= kMaxRows / block_size, "num_swa_base ", num_swa_base, " x block_size ", block_size,
          " rows exceed the int32 row limit");
  pools_.reserve(types.size());
  for (size_t t = 0; t < types.size(); ++t) {
    const auto& spec = types[t];
    require(spec.k > 0, "compress type ", t, ": k must be > 0, got ", spec.k);
    require(spec.num_slots >= num_swa_base, "compress type ", t, ": num_slots (", spec.num_slots,
            ") must be >= num_swa_base (", num_swa_base, "): every SWA slot must exist in every layer tensor");
    pools_.emplace_back(spec.num_slots, spec.k, block_size, num_swa_base);
  }
  swa_state_.assign(static_cast<size_t>(num_swa_base), SwaState::Available);
  busy_.assign(static_cast<size_t>(num_swa_base), 0);
  cached_.assign(static_cast<size_t>(num_swa_base), 0);
  swa_free_ = SlotList(num_swa_base);
  unreleased_ = SlotList(num_swa_base);
  for (int64_t s = 0; s < num_swa_base; ++s) {
    for (auto& p : pools_) p.reserve_slot(s);  // compress starts in its own region
    swa_free_.push_back(s);
    unreleased_.push_back(s);
  }
}

const TypePool& Coordinator::pool(int64_t type, const char* what) const {
  check_type(type, what);
  return pools_[static_cast<size_t>(type)];
}

void Coordinator::check_type(int64_t type, const char* what) const {
  require(type >= 0 && type < num_types(), what, ": compress type ", type, " out of range [0, ", num_types(), ")");
}

void Coordinator::check_swa_slot(int64_t slot, const char* what) const {
  require(slot >= 0 && slot < num_swa_base_, what, ": SWA slot ", slot, " out of range [0, ", num_swa_base_, ")");
}

void Coordinator::reserve_in_all_pools(int64_t slot) {
  for (auto& p : pools_) p.reserve_slot(slot);
}

bool Coordinator::is_free_swa(int64_t slot) const {
  check_swa_slot(slot, "is_free_swa");
  return swa_free_.contains(slot);
}

bool Coordinator::swa_slot_is_held(int64_t slot) const {
  check_swa_slot(slot, "swa_slot_is_held");
  return swa_state_[static_cast<size_t>(slot)] == SwaState::Held;
}

int64_t Coordinator::alloc_swa() {
  require<OutOfSlots>(!swa_free_.empty(), "No free SWA slots available");
  const int64_t slot = swa_free_.front();
  take_swa_slot(slot);
  ++counters_.swa_allocs;
  return slot;
}

void Coordinator::claim_swa(int64_t slot) {
  check_swa_slot(slot, "claim_swa");
  require<StateError>(swa_free_.contains(slot), "claim_swa: SWA slot ", slot, " is not free (",
                      swa_slot_is_held(slot) ? "held by SWA" : "borrowed by compress", ")");
  take_swa_slot(slot);
  ++counters_.swa_claims;
}

void Coordinator::take_swa_slot(int64_t slot) {
  swa_free_.erase(slot);
  auto& state = swa_state_[static_cast<size_t>(slot)];
  if (state == SwaState::Released) reserve_in_all_pools(slot); else unreleased_.erase(slot);
  state = SwaState::Held;
  cached_[static_cast<size_t>(slot)] = 0;
  ++held_swa_;
}

void Coordinator::free_swa(int64_t slot) {
  check_swa_slot(slot, "free_swa");
  require<StateError>(swa_slot_is_held(slot), "free_swa: SWA slot ", slot, " is not held by SWA (double free?)");
  for (auto& p : pools_) p.release_slot(slot);
  swa_state_[static_cast<size_t>(slot)] = SwaState::Released;
  --held_swa_;
  cached_[static_cast<size_t>(slot)] = 1;  // its rows may back a lazily cached SWA block
  swa_free_.push_back(slot);
  ++counters_.swa_frees;
}

void Coordinator::lend_unreleased_slot() {
  // SWA takes its free list front first, so the back-most never-used slot is
  // the one it would reach last: SWA's next allocations are unchanged.
  const int64_t slot = unreleased_.back();
  unreleased_.erase(slot);
  for (auto& p : pools_) p.release_slot(slot);
  swa_state_[static_cast<size_t>(slot)] = SwaState::Released;  // cached_ stays 0: SWA never wrote it
  ++counters_.unreleased_borrows;
}

bool Coordinator::has_free_compress(int64_t type, int64_t n) const {
  return !pool(type, "has_free_compress").enabled() || free_compress_blocks(type) >= n;
}

int64_t Coordinator::free_compress_blocks(int64_t type) const {
  const TypePool& p = pool(type, "free_compress_blocks");
  return p.free_compress_blocks() + lendable_slots() * p.blocks_per_slot();
}

int64_t Coordinator::alloc_compress(int64_t type) {
  check_type(type, "alloc_compress");
  TypePool& pool = pools_[static_cast<size_t>(type)];
  // Only where the pool would run out: the lent slot is then its one free slot.
  if (pool.free_compress_blocks() == 0 && lendable_slots() > 0) lend_unreleased_slot();
  int64_t opened = -1;
  const int64_t phys = pool.alloc_compress(&opened);
  if (opened >= 0) pool_took(opened);
  return phys;
}

void Coordinator::free_compress(int64_t type, int64_t phys) {
  check_type(type, "free_compress");
  auto& p = pools_[static_cast<size_t>(type)];
  if (p.free_compress(phys)) pool_gave_back(phys / p.blocks_per_slot());
}

void Coordinator::pool_took(int64_t slot) {
  if (slot >= num_swa_base_) return;  // the pool's own region
  // A borrowed released slot: SWA may no longer take it, and whatever SWA
  // block it cached is gone the moment the pool writes into it.
  const auto s = static_cast<size_t>(slot);
  if (busy_[s]++ == 0) swa_free_.erase(slot);
  if (cached_[s]) {
    cached_[s] = 0;
    ++counters_.swa_evictions;
    if (listener_) listener_(slot); else evicted_.push_back(slot);
  }
}

void Coordinator::pool_gave_back(int64_t slot) {
  if (slot < num_swa_base_ && --busy_[static_cast<size_t>(slot)] == 0) swa_free_.push_back(slot);
}

TypePool& Coordinator::pool_for(int64_t type, const char* what) {
  check_type(type, what);
  return pools_[static_cast<size_t>(type)];
}

// The pool's own checks come first (range, role); a taken or freed slot then
// updates the SWA side. Only a released shared slot can be free in a pool.
bool Coordinator::pool_reserve_slot(int64_t type, int64_t slot) {
  TypePool& p = pool_for(type, "pool_reserve_slot");
  // In the shared region a pool's reservation means "the SWA space's" (held or
  // never used); one made through the pool could not be told from it.
  require<StateError>(slot < 0 || slot >= num_swa_base_ || !p.slot_is_free(slot), "reserve_slot: slot ", slot,
                      " is in the SWA space [0, ", num_swa_base_, "), which only the coordinator reserves");
  return p.reserve_slot(slot);  // the own region: no SWA side
}

void Coordinator::pool_release_slot(int64_t type, int64_t slot) {
  TypePool& p = pool_for(type, "pool_release_slot");
  if (slot >= 0 && slot < num_swa_base_) {
    const SwaState state = swa_state_[static_cast<size_t>(slot)];
    require<StateError>(state == SwaState::Released, "release_slot: slot ", slot, " is reserved for the SWA space (",
                        state == SwaState::Held ? "held by SWA" : "never released by SWA", ")");
  }
  p.release_slot(slot);  // a released shared slot is never reserved in a pool: no SWA side
}

int64_t Coordinator::pool_alloc_swa(int64_t type) {
  const int64_t slot = pool_for(type, "pool_alloc_swa").alloc_swa();
  pool_took(slot);
  return slot;
}

void Coordinator::pool_free_swa(int64_t type, int64_t slot) {
  pool_for(type, "pool_free_swa").free_swa(slot);
  pool_gave_back(slot);
}

void Coordinator::pool_claim_swa(int64_t type, int64_t slot) {
  pool_for(type, "pool_claim_swa").claim_swa(slot);
  pool_took(slot);
}

// The vector forms are sized only for a batch that can succeed; otherwise the
// _into form throws before writing anything.
std::vector<int64_t> Coordinator::alloc_swa_n(int64_t n) {
  std::vector<int64_t> out(n >= 0 && n <= swa_free_.size() ? static_cast<size_t>(n) : 0);
  alloc_swa_into(n, out.data());
  return out;
}

void Coordinator::alloc_swa_into(int64_t n, int64_t* out) {
  require_batch_size(n, "alloc_swa_n");
  require<OutOfSlots>(n <= swa_free_.size(), "No free SWA slots available (", n, " requested, ", swa_free_.size(),
                      " free)");
  for (int64_t i = 0; i < n; ++i) out[i] = alloc_swa();
}

void Coordinator::free_swa_many(const int64_t* slots, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    check_swa_slot(slots[i], "free_swa_many");
    require<StateError>(swa_slot_is_held(slots[i]), "free_swa_many: SWA slot ", slots[i], " is not held by SWA");
  }
  require_distinct(slots, n, "free_swa_many");
  for (size_t i = 0; i < n; ++i) free_swa(slots[i]);
}

std::vector<int64_t> Coordinator::alloc_compress_n(int64_t type, int64_t n) {
  check_type(type, "alloc_compress_n");
  std::vector<int64_t> out(n >= 0 && n <= free_compress_blocks(type) ? static_cast<size_t>(n) : 0);
  alloc_compress_into(type, n, out.data());
  return out;
}

void Coordinator::alloc_compress_into(int64_t type, int64_t n, int64_t* out) {
  check_type(type, "alloc_compress_n");
  require_batch_size(n, "alloc_compress_n");
  const int64_t avail = free_compress_blocks(type);
  require<OutOfSlots>(n <= avail, "No free KV slots available (", n, " requested, ", avail, " free)");
  for (int64_t i = 0; i < n; ++i) out[i] = alloc_compress(type);
}

void Coordinator::free_compress_many(int64_t type, const int64_t* ids, size_t n) {
  check_type(type, "free_compress_many");
  const TypePool& p = pools_[static_cast<size_t>(type)];
  for (size_t i = 0; i < n; ++i)
    require<StateError>(p.compress_id_is_held(ids[i], "free_compress_many"), "free_compress_many: compress id ",
                        ids[i], " is not held");
  require_distinct(ids, n, "free_compress_many");
  for (size_t i = 0; i < n; ++i) free_compress(type, ids[i]);
}

int64_t Coordinator::slots_needed(int64_t type, int64_t blocks) const {
  const TypePool& p = pools_[static_cast<size_t>(type)];
  const int64_t beyond_own = blocks - p.free_own_compress_blocks();
  if (beyond_own <= 0) return 0;
  // Rounded up without beyond_own + bps - 1, which overflows for demands near INT64_MAX.
  return beyond_own / p.blocks_per_slot() + (beyond_own % p.blocks_per_slot() != 0);
}

bool Coordinator::can_allocate_jointly(int64_t n_swa, const std::vector<int64_t>& compress_demand,
                                       const std::vector<int64_t>& freeable_slots) const {
  // Every argument is checked before any is evaluated, so a bad one is an
  // error whatever the state, never a "no".
  require(static_cast<int64_t>(compress_demand.size()) == num_types(), "can_allocate_jointly: compress_demand has ",
          compress_demand.size(), " entries, expected one per compress type (", num_types(), ")");
  require(n_swa >= 0, "can_allocate_jointly: n_swa must be >= 0, got ", n_swa);
  for (int64_t t = 0; t < num_types(); ++t)
    require(compress_demand[static_cast<size_t>(t)] >= 0, "can_allocate_jointly: compress_demand[", t,
            "] must be >= 0, got ", compress_demand[static_cast<size_t>(t)]);
  for (int64_t slot : freeable_slots) {
    check_swa_slot(slot, "can_allocate_jointly");
    bool compress_only = true;  // freeing its compress blocks frees it in every pool
    for (const auto& p : pools_) {
      const SlotOwner o = p.owner(slot);
      compress_only &= o == SlotOwner::Free || o == SlotOwner::Compress;
    }
    require(swa_state_[static_cast<size_t>(slot)] == SwaState::Released && busy_[static_cast<size_t>(slot)] > 0 &&
                compress_only,
            "can_allocate_jointly: freeable slot ", slot, " is not a released slot compress is using");
  }
  const int64_t swa_demand = enabled() ? n_swa : 0;  // a disabled SWA space ignores SWA demand
  const int64_t swa_free = swa_free_.size() + static_cast<int64_t>(freeable_slots.size());
  if (swa_demand > swa_free) return false;  // also keeps the sums below far from overflow
  // The roles compete only for free slots SWA may take and every pool may
  // borrow: the released ones nobody has borrowed, and with
  // borrow_unreleased_swa the never-used ones too (lending one to a pool adds
  // it to every pool's shared room, so the pools never compete with each
  // other; a slot one pool borrowed is out of SWA's reach). Whatever the
  // order of the calls, SWA takes at most swa_takes_contested of them from
  // under each pool, and the pools together at most min(borrows, contested)
  // from under SWA.
  const int64_t lendable = lendable_slots();
  const int64_t contested = swa_free - unreleased_.size() + lendable;
  const int64_t swa_takes_contested = std::min(swa_demand, contested);
  int64_t borrows = 0;
  for (int64_t t = 0; t < num_types(); ++t) {
    const int64_t demand = compress_demand[static_cast<size_t>(t)];
    const TypePool& p = pools_[static_cast<size_t>(t)];
    if (!p.enabled() || demand == 0) continue;
    if (demand > p.num_compress_ids()) return false;  // more than the tensor holds
    // Freeing a slot adds to this pool's shared room only if the pool was in
    // it, and takes away the free blocks the pool had open there.
    int64_t gained = 0, open_lost = 0;
    for (int64_t slot : freeable_slots) {
      if (p.owner(slot) != SlotOwner::Compress) continue;
      ++gained;
      for (int64_t phys = slot * p.blocks_per_slot(); phys < (slot + 1) * p.blocks_per_slot(); ++phys)
        open_lost += !p.compress_id_is_held(phys);
    }
    const int64_t borrow = slots_needed(t, demand + open_lost);
    if (borrow > p.free_shared_slots() + lendable + gained - swa_takes_contested) return false;
    borrows += borrow;  // <= num_slots per type: no overflow
  }
  return swa_demand + std::min(borrows, contested) <= swa_free;
}

std::vector<int64_t> Coordinator::take_evicted_swa() {
  std::vector<int64_t> out(evicted_.begin(), evicted_.end());
  evicted_.clear();
  return out;
}

void Coordinator::check_invariants() const {
  for (const auto& p : pools_) p.check_invariants();
  for (int64_t s = 0; s < num_swa_base_; ++s) {
    const auto i = static_cast<size_t>(s);
    int32_t busy = 0;
    for (const auto& p : pools_) {
      const SlotOwner o = p.owner(s);
      // Reserved exactly while the SWA space holds it or never used it. Once
      // released: free, compress blocks, or an SWA block through the pool's methods.
      require<StateError>((o == SlotOwner::Reserved) == (swa_state_[i] != SwaState::Released), "shared slot ", s,
                          " reservation does not match its SWA state");
      busy += o == SlotOwner::Compress || o == SlotOwner::Swa;
    }
    require<StateError>(busy == busy_[i], "shared slot ", s, " busy count");
    const bool available = swa_state_[i] == SwaState::Available || (swa_state_[i] == SwaState::Released && busy == 0);
    require<StateError>(swa_free_.contains(s) == available, "shared slot ", s, " SWA free-list membership");
    require<StateError>(!cached_[i] || (swa_state_[i] == SwaState::Released && busy == 0), "shared slot ", s,
                        " is marked cached while not a free released slot");
    require<StateError>(unreleased_.contains(s) == (swa_state_[i] == SwaState::Available), "shared slot ", s,
                        " never-used list membership");
  }
  // unreleased_ lists the never-used slots in SWA's free-list order.
  std::vector<int64_t> in_order;
  for (int64_t s : swa_free_.to_vector())
    if (swa_state_[static_cast<size_t>(s)] == SwaState::Available) in_order.push_back(s);
  require<StateError>(in_order == unreleased_.to_vector(), "never-used list order");
  int64_t held = 0;
  for (auto st : swa_state_) held += st == SwaState::Held;
  require<StateError>(held == held_swa_, "held-SWA counter");
}

void Coordinator::write_state(StateWriter& w) const {
  for (int64_t v : {num_swa_base_, block_size_, num_types(), static_cast<int64_t>(borrow_unreleased_swa_)}) w.put(v);
  for (const auto& p : pools_) {
    w.put(p.k());
    w.put(p.num_slots());
  }
  for (const auto& p : pools_) p.write_state(w);
  for (int64_t s = 0; s < num_swa_base_; ++s) {
    w.put(static_cast<int64_t>(swa_state_[static_cast<size_t>(s)]));
    w.put(cached_[static_cast<size_t>(s)]);
  }
  w.put_vec(swa_free_.to_vector());
  w.put_vec(std::vector<int64_t>(evicted_.begin(), evicted_.end()));
  for (int64_t v : {counters_.swa_allocs, counters_.swa_frees, counters_.swa_claims, counters_.swa_evictions,
                    counters_.unreleased_borrows})
    w.put(v);
}

std::vector<int64_t> Coordinator::to_state() const {
  std::vector<int64_t> st;
  StateWriter w(st);
  begin_state(w, StateKind::Coordinator);
  write_state(w);
  return st;
}

Coordinator Coordinator::read_state(StateReader& r) {
  const int64_t base = r.next(), bs = r.next(), ntypes = r.in_range(0, 64, "type count");
  const bool borrow_unreleased = r.flag("borrow_unreleased_swa");
  std::vector<CompressTypeSpec> specs;
  for (int64_t t = 0; t < ntypes; ++t) {
    const int64_t k = r.next();
    specs.push_back({k, r.next()});
  }
  Coordinator c(base, specs, bs, borrow_unreleased);  // validates the sizes
  for (auto& p : c.pools_) p = TypePool::read_state(r);
  c.held_swa_ = 0;
  for (int64_t s = 0; s < base; ++s) {
    const auto state = static_cast<SwaState>(r.in_range(0, 2, "SWA slot state"));
    c.swa_state_[static_cast<size_t>(s)] = state;
    c.cached_[static_cast<size_t>(s)] = static_cast<uint8_t>(r.flag("SWA slot cached"));
    c.held_swa_ += state == SwaState::Held;
    int32_t busy = 0;
    for (const auto& p : c.pools_) busy += p.owner(s) == SlotOwner::Compress || p.owner(s) == SlotOwner::Swa;
    c.busy_[static_cast<size_t>(s)] = busy;
  }
  c.swa_free_ = SlotList(base);
  c.unreleased_ = SlotList(base);
  for (int64_t s : r.vec<int64_t>(base, "SWA free-list")) {
    r.check(s >= 0 && s < base && !c.swa_free_.contains(s), "bad SWA free-list member ", s);
    c.swa_free_.push_back(s);
    if (c.swa_state_[static_cast<size_t>(s)] == SwaState::Available) c.unreleased_.push_back(s);
  }
  // A slot may be evicted again before the queue is taken: no bound but the state's length.
  for (int64_t s : r.vec<int64_t>(std::numeric_limits<int64_t>::max(), "eviction queue")) {
    r.check(s >= 0 && s < base, "bad evicted slot ", s);
    c.evicted_.push_back(s);
  }
  for (int64_t* v : {&c.counters_.swa_allocs, &c.counters_.swa_frees, &c.counters_.swa_claims,
                     &c.counters_.swa_evictions, &c.counters_.unreleased_borrows})
    *v = r.next();
  try {
    c.check_invariants();
  } catch (const StateError& e) {
    throw InvalidArgument(r.what() + " is inconsistent: " + e.what());
  }
  return c;
}

Coordinator Coordinator::from_state(const std::vector<int64_t>& st) {
  StateReader r = open_state(st, StateKind::Coordinator);
  Coordinator c = read_state(r);
  r.finish();
  return c;
}

}  // namespace ukv
