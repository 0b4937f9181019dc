#include "core/slots/type_pool.h"

#include <algorithm>

#include "core/slots/batch.h"
#include "core/common/ceil_div.h"
#include "core/common/errors.h"
#include "core/config/sizing.h"

namespace ukv {

const char* slot_owner_name(SlotOwner owner) {
  switch (owner) {
    case SlotOwner::Free: return "free";
    case SlotOwner::Reserved: return "reserved";
    case SlotOwner::Swa: return "SWA";
    case SlotOwner::Compress: return "compress";
  }
  return "?";
}

namespace {
constexpr int64_t kWordBits = 64;

int64_t validated_blocks_per_slot(int64_t k, int64_t block_size) {
  require(block_size > 0, "block_size must be > 0, got ", block_size);
  require(k >= 0, "k must be >= 0 (0 = SWA-only pool), got ", k);
  if (k == 0) return 0;
  require(k <= block_size && block_size % k == 0, "k (rows per compress block) must divide block_size ",
          block_size, ", got ", k);
  return block_size / k;
}
}  // namespace

TypePool::TypePool(int64_t num_slots, int64_t k, int64_t block_size, int64_t shared_slots)
    : num_slots_(num_slots), k_(k), block_size_(block_size), shared_slots_(shared_slots),
      blocks_per_slot_(validated_blocks_per_slot(k, block_size)) {
  require(num_slots >= 0, "num_slots must be >= 0, got ", num_slots);
  require(num_slots <= kMaxRows / block_size, "num_slots ", num_slots, " x block_size ", block_size,
          " rows exceed the int32 row limit");
  require(shared_slots >= 0 && shared_slots <= num_slots, "shared_slots must be in [0, num_slots=", num_slots,
          "], got ", shared_slots);
  words_per_slot_ = ceil_div(blocks_per_slot_, kWordBits);
  owner_.assign(static_cast<size_t>(num_slots), SlotOwner::Free);
  own_free_ = SlotList(num_slots);
  shared_free_ = SlotList(num_slots);
  open_ = SlotList(num_slots);
  free_subs_.assign(static_cast<size_t>(num_slots * words_per_slot_), 0);
  used_subs_.assign(static_cast<size_t>(num_slots), 0);
  for (int64_t s = 0; s < num_slots; ++s) free_list_of(s).push_back(s);
  held_[static_cast<size_t>(SlotOwner::Free)] = num_slots;
}

void TypePool::check_slot(int64_t slot, const char* what) const {
  require(slot >= 0 && slot < num_slots_, what, ": slot ", slot, " out of range [0, ", num_slots_, ")");
}

void TypePool::check_compress_id(int64_t phys, const char* what) const {
  require(blocks_per_slot_ > 0, what, ": this pool has no compress role (k = 0)");
  require(phys >= 0 && phys < num_compress_ids(), what, ": compress id ", phys, " out of range [0, ",
          num_compress_ids(), ")");
}

SlotOwner TypePool::owner_of(int64_t slot, const char* what) const {
  check_slot(slot, what);
  return owner_[static_cast<size_t>(slot)];
}

SlotOwner TypePool::owner(int64_t slot) const { return owner_of(slot, "owner"); }

bool TypePool::slot_is_free(int64_t slot) const { return owner_of(slot, "slot_is_free") == SlotOwner::Free; }

bool TypePool::is_free_swa(int64_t slot) const { return owner_of(slot, "is_free_swa") == SlotOwner::Free; }

void TypePool::take_free_slot(int64_t slot, SlotOwner to) {
  free_list_of(slot).erase(slot);
  owner_[static_cast<size_t>(slot)] = to;
  --held_[static_cast<size_t>(SlotOwner::Free)];
  ++held_[static_cast<size_t>(to)];
}

void TypePool::put_free_slot(int64_t slot) {
  --held_[static_cast<size_t>(owner_[static_cast<size_t>(slot)])];
  owner_[static_cast<size_t>(slot)] = SlotOwner::Free;
  ++held_[static_cast<size_t>(SlotOwner::Free)];
  free_list_of(slot).push_back(slot);
}

bool TypePool::reserve_slot(int64_t slot) {
  if (owner_of(slot, "reserve_slot") != SlotOwner::Free) return false;
  take_free_slot(slot, SlotOwner::Reserved);
  return true;
}

void TypePool::release_slot(int64_t slot) {
  const SlotOwner o = owner_of(slot, "release_slot");
  if (o == SlotOwner::Free) return;
  require<StateError>(o == SlotOwner::Reserved, "release_slot: slot ", slot, " is held by ", slot_owner_name(o),
                      ", not reserved");
  put_free_slot(slot);
}

bool TypePool::has_free_swa(int64_t n) const { return !enabled() || free_slots() >= n; }

int64_t TypePool::alloc_swa() {
  SlotList& from = shared_free_.empty() ? own_free_ : shared_free_;
  require<OutOfSlots>(!from.empty(), "No free KV slots available");  // upstream pool text
  const int64_t slot = from.front();
  take_free_slot(slot, SlotOwner::Swa);
  ++counters_.swa_allocs;
  return slot;
}

void TypePool::free_swa(int64_t slot) {
  const SlotOwner o = owner_of(slot, "free_swa");
  require<StateError>(o == SlotOwner::Swa, "free_swa: slot ", slot, " is ", slot_owner_name(o),
                      ", not held by SWA (double free?)");
  put_free_slot(slot);
  ++counters_.swa_frees;
}

void TypePool::claim_swa(int64_t slot) {
  const SlotOwner o = owner_of(slot, "claim_swa");
  require<StateError>(o == SlotOwner::Free, "claim_swa: slot ", slot, " is ", slot_owner_name(o), ", not free");
  take_free_slot(slot, SlotOwner::Swa);
  ++counters_.swa_allocs;
}

// The vector forms are sized only for a batch that can succeed; otherwise the
// _into form throws before writing anything.
std::vector<int64_t> TypePool::alloc_swa_n(int64_t n) {
  std::vector<int64_t> out(n >= 0 && n <= free_slots() ? static_cast<size_t>(n) : 0);
  alloc_swa_into(n, out.data());
  return out;
}

void TypePool::alloc_swa_into(int64_t n, int64_t* out) {
  require_batch_size(n, "alloc_swa_n");
  require<OutOfSlots>(n <= free_slots(), "No free KV slots available (", n, " requested, ", free_slots(), " free)");
  for (int64_t i = 0; i < n; ++i) out[i] = alloc_swa();
}

void TypePool::free_swa_many(const int64_t* slots, size_t n) {
  for (size_t i = 0; i < n; ++i)
    require<StateError>(owner_of(slots[i], "free_swa_many") == SlotOwner::Swa, "free_swa_many: slot ", slots[i],
                        " is not held by SWA");
  require_distinct(slots, n, "free_swa_many");
  for (size_t i = 0; i < n; ++i) free_swa(slots[i]);
}

std::vector<int64_t> TypePool::alloc_compress_n(int64_t n) {
  std::vector<int64_t> out(n >= 0 && n <= free_compress_blocks() ? static_cast<size_t>(n) : 0);
  alloc_compress_into(n, out.data());
  return out;
}

void TypePool::alloc_compress_into(int64_t n, int64_t* out) {
  require_batch_size(n, "alloc_compress_n");
  require(n == 0 || blocks_per_slot_ > 0, "alloc_compress_n: this pool has no compress role (k = 0)");
  require<OutOfSlots>(n <= free_compress_blocks(), "No free KV slots available (", n, " requested, ",
                      free_compress_blocks(), " free)");
  for (int64_t i = 0; i < n; ++i) out[i] = alloc_compress();
}

void TypePool::free_compress_many(const int64_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i)
    require<StateError>(compress_id_is_held(ids[i], "free_compress_many"), "free_compress_many: compress id ", ids[i],
                        " is not held");
  require_distinct(ids, n, "free_compress_many");
  for (size_t i = 0; i < n; ++i) free_compress(ids[i]);
}

bool TypePool::has_free_compress(int64_t n) const {
  return !enabled() || blocks_per_slot_ == 0 || free_compress_blocks() >= n;
}

bool TypePool::sub_is_free(int64_t slot, int64_t sub) const {
  const uint64_t word = free_subs_[static_cast<size_t>(slot * words_per_slot_ + sub / kWordBits)];
  return (word >> (sub % kWordBits)) & 1u;
}

void TypePool::set_sub_free(int64_t slot, int64_t sub, bool is_free) {
  uint64_t& word = free_subs_[static_cast<size_t>(slot * words_per_slot_ + sub / kWordBits)];
  const uint64_t bit = uint64_t{1} << (sub % kWordBits);
  word = is_free ? (word | bit) : (word & ~bit);
}

int64_t TypePool::first_free_sub(int64_t slot) const {
  for (int64_t w = 0; w < words_per_slot_; ++w) {
    const uint64_t word = free_subs_[static_cast<size_t>(slot * words_per_slot_ + w)];
    if (word != 0) return w * kWordBits + __builtin_ctzll(word);
  }
  return -1;
}

bool TypePool::compress_id_is_held(int64_t phys, const char* what) const {
  check_compress_id(phys, what);
  const int64_t slot = phys / blocks_per_slot_;
  return owner_[static_cast<size_t>(slot)] == SlotOwner::Compress && !sub_is_free(slot, phys % blocks_per_slot_);
}

int64_t TypePool::alloc_compress(int64_t* opened_slot) {
  require(blocks_per_slot_ > 0, "alloc_compress: this pool has no compress role (k = 0)");
  if (opened_slot) *opened_slot = -1;
  if (!open_.empty()) {
    const int64_t slot = open_.front();
    const int64_t sub = first_free_sub(slot);
    set_sub_free(slot, sub, false);
    --open_free_blocks_;
    if (++used_subs_[static_cast<size_t>(slot)] == blocks_per_slot_) open_.erase(slot);
    ++counters_.compress_allocs;
    return slot * blocks_per_slot_ + sub;
  }
  // Own region first; borrow the longest-free shared slot only when it is empty.
  SlotList& from = own_free_.empty() ? shared_free_ : own_free_;
  require<OutOfSlots>(!from.empty(), "No free KV slots available");
  const int64_t slot = from.front();
  if (&from == &shared_free_) ++counters_.borrows;
  take_free_slot(slot, SlotOwner::Compress);
  for (int64_t sub = 1; sub < blocks_per_slot_; ++sub) set_sub_free(slot, sub, true);
  used_subs_[static_cast<size_t>(slot)] = 1;
  open_free_blocks_ += blocks_per_slot_ - 1;
  if (blocks_per_slot_ > 1) open_.push_back(slot);
  ++counters_.compress_allocs;
  if (opened_slot) *opened_slot = slot;
  return slot * blocks_per_slot_;
}

bool TypePool::free_compress(int64_t phys) {
  check_compress_id(phys, "free_compress");
  const int64_t slot = phys / blocks_per_slot_, sub = phys % blocks_per_slot_;
  const SlotOwner o = owner_[static_cast<size_t>(slot)];
  require<StateError>(o == SlotOwner::Compress && !sub_is_free(slot, sub), "free_compress: compress id ", phys,
                      " is not held (slot ", slot, " is ", slot_owner_name(o),
                      o == SlotOwner::Compress ? ", block already free: double free?)" : ")");
  ++counters_.compress_frees;
  int32_t& used = used_subs_[static_cast<size_t>(slot)];
  if (--used == 0) {
    // Whole slot free again: close it and return it to the free list.
    if (open_.contains(slot)) open_.erase(slot);
    open_free_blocks_ -= blocks_per_slot_ - 1;
    for (int64_t w = 0; w < words_per_slot_; ++w) free_subs_[static_cast<size_t>(slot * words_per_slot_ + w)] = 0;
    put_free_slot(slot);
    return true;
  }
  set_sub_free(slot, sub, true);
  ++open_free_blocks_;
  if (!open_.contains(slot)) open_.push_back(slot);
  return false;
}

void TypePool::check_invariants() const {
  int64_t counts[4] = {0, 0, 0, 0};
  int64_t open_free = 0;
  for (int64_t s = 0; s < num_slots_; ++s) {
    const SlotOwner o = owner_[static_cast<size_t>(s)];
    ++counts[static_cast<size_t>(o)];
    const bool listed_own = own_free_.contains(s), listed_shared = shared_free_.contains(s);
    require<StateError>((o == SlotOwner::Free) == (listed_own || listed_shared), "slot ", s, " free-list membership");
    require<StateError>(!listed_own || s >= shared_slots_, "slot ", s, " on the wrong free list");
    require<StateError>(!listed_shared || s < shared_slots_, "slot ", s, " on the wrong free list");
    int64_t free_subs = 0;
    for (int64_t sub = 0; sub < blocks_per_slot_; ++sub) free_subs += sub_is_free(s, sub);
    if (o == SlotOwner::Compress) {
      require<StateError>(used_subs_[static_cast<size_t>(s)] + free_subs == blocks_per_slot_ &&
                              used_subs_[static_cast<size_t>(s)] > 0,
                          "slot ", s, " sub-block counts");
      require<StateError>(open_.contains(s) == (free_subs > 0), "slot ", s, " open-list membership");
      open_free += free_subs;
    } else {
      require<StateError>(free_subs == 0 && used_subs_[static_cast<size_t>(s)] == 0 && !open_.contains(s),
                          "slot ", s, " holds sub-blocks but is ", slot_owner_name(o));
    }
  }
  for (size_t i = 0; i < 4; ++i) require<StateError>(counts[i] == held_[i], "owner counter ", i);
  require<StateError>(open_free == open_free_blocks_, "open free-block counter");
}

void TypePool::write_state(StateWriter& w) const {
  for (int64_t v : {num_slots_, k_, block_size_, shared_slots_}) w.put(v);
  for (SlotOwner o : owner_) w.put(static_cast<int64_t>(o));
  for (const SlotList* list : {&own_free_, &shared_free_, &open_}) w.put_vec(list->to_vector());
  for (uint64_t word : free_subs_) w.put(static_cast<int64_t>(word));
  for (int64_t v : {counters_.swa_allocs, counters_.swa_frees, counters_.compress_allocs, counters_.compress_frees,
                    counters_.borrows})
    w.put(v);
}

std::vector<int64_t> TypePool::to_state() const {
  std::vector<int64_t> st;
  StateWriter w(st);
  begin_state(w, StateKind::TypePool);
  write_state(w);
  return st;
}

TypePool TypePool::read_state(StateReader& r) {
  const int64_t n = r.next(), k = r.next(), bs = r.next(), shared = r.next();
  TypePool p(n, k, bs, shared);  // validates the sizes
  for (int64_t s = 0; s < n; ++s) p.owner_[static_cast<size_t>(s)] = static_cast<SlotOwner>(r.in_range(0, 3, "slot owner"));
  for (SlotList* list : {&p.own_free_, &p.shared_free_, &p.open_}) {
    *list = SlotList(n);
    for (int64_t id : r.vec<int64_t>(n, "free-list")) {
      r.check(id >= 0 && id < n && !list->contains(id), "bad list member ", id);
      list->push_back(id);
    }
  }
  for (auto& word : p.free_subs_) word = static_cast<uint64_t>(r.next());
  for (int64_t* c : {&p.counters_.swa_allocs, &p.counters_.swa_frees, &p.counters_.compress_allocs,
                     &p.counters_.compress_frees, &p.counters_.borrows})
    *c = r.next();
  // Derived counters, then a full consistency check of what was loaded.
  std::fill(std::begin(p.held_), std::end(p.held_), 0);
  p.open_free_blocks_ = 0;
  for (int64_t s = 0; s < n; ++s) {
    ++p.held_[static_cast<size_t>(p.owner_[static_cast<size_t>(s)])];
    if (p.owner_[static_cast<size_t>(s)] != SlotOwner::Compress) continue;
    int64_t free_subs = 0;
    for (int64_t sub = 0; sub < p.blocks_per_slot_; ++sub) free_subs += p.sub_is_free(s, sub);
    p.used_subs_[static_cast<size_t>(s)] = static_cast<int32_t>(p.blocks_per_slot_ - free_subs);
    p.open_free_blocks_ += free_subs;
  }
  try {
    p.check_invariants();
  } catch (const StateError& e) {
    throw InvalidArgument(r.what() + " is inconsistent: " + e.what());
  }
  return p;
}

TypePool TypePool::from_state(const std::vector<int64_t>& st) {
  StateReader r = open_state(st, StateKind::TypePool);
  TypePool p = read_state(r);
  r.finish();
  return p;
}

}  // namespace ukv
