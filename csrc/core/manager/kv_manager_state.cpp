// KvManager: the invariant check and the serialised state.
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {

void KvManager::check_invariants() const {
  if (coord_) coord_->check_invariants();
  if (rows_) rows_->check_invariants();
  logical_.check_invariants();
  if (swa_) swa_->check_invariants();
  std::vector<int64_t> logical_refs(static_cast<size_t>(pools_.num_logical_blocks), 0);
  std::vector<int64_t> swa_refs(static_cast<size_t>(swa_ ? pools_.num_swa_blocks : 0), 0);
  int64_t quotas = 0, extras = 0, unbound = 0;
  for (const auto& [id, s] : seqs_) {
    const size_t len = s.logical.size();
    require<StateError>(s.swa.size() == len * static_cast<size_t>(ppb_), "sequence ", id,
                        ": SWA pages not aligned with the logical blocks");
    require<StateError>(static_cast<int64_t>(len) <= serve_.max_blocks_per_seq, "sequence ", id, " exceeds max_blocks_per_seq");
    require<StateError>(static_cast<int64_t>(len) * serve_.block_size >= s.num_computed, "sequence ", id,
                        ": computed tokens not covered by blocks");
    require<StateError>(s.num_computed >= 0 && s.num_computed <= static_cast<int64_t>(s.tokens.size()), "sequence ",
                        id, ": computed outside [0, known]");
    int64_t held = 0;
    // Row space: a block the model writes or has written has a live envelope;
    // the others have one (a cached block taken at admission) or a reservation.
    const int64_t written = blocks_for(s.num_computed + std::max(s.ensured, s.scheduled));
    for (size_t i = 0; i < len; ++i) {
      const int32_t b = s.logical[i];
      ++logical_refs[static_cast<size_t>(b)];
      if (!rows_) continue;
      const bool bound = rows_->is_bound(UnitKind::Envelope, b);
      require<StateError>(!rows_->is_cached(UnitKind::Envelope, b), "sequence ", id, ": logical block ", b,
                          " is cached in the row space");
      require<StateError>(bound || static_cast<int64_t>(i) >= written, "sequence ", id, ": logical block ", b,
                          " holds written positions but no envelope");
      unbound += !bound;
    }
    for (size_t j = 0; j < s.swa.size(); ++j) {
      if (s.swa[j] < 0) continue;
      require<StateError>(swa_ != nullptr, "sequence ", id, " holds SWA pages without an SWA pool");
      ++swa_refs[static_cast<size_t>(s.swa[j])];
      ++held;
      require<StateError>(static_cast<int64_t>(j) >= s.swa_freed_upto, "sequence ", id, ": SWA page ", j,
                          " below the freed window");
    }
    require<StateError>(held == s.swa_held, "sequence ", id, ": SWA held counter");
    require<StateError>(held <= s.swa_quota + s.extra_pages, "sequence ", id, " holds ", held,
                        " SWA pages, over its quota ", s.swa_quota, " and ", s.extra_pages, " pages below the chunk's window");
    require<StateError>(s.hashes.size() <= len, "sequence ", id, ": more hashes than blocks");
    check_hash_chain(id, s);
    quotas += s.swa_quota;
    extras += s.extra_pages;
  }
  for (int64_t b = 0; b < pools_.num_logical_blocks; ++b)
    require<StateError>(logical_refs[static_cast<size_t>(b)] == logical_.ref(b), "logical block ", b, " ref ",
                        logical_.ref(b), " != table occurrences ", logical_refs[static_cast<size_t>(b)]);
  for (int64_t b = 0; b < static_cast<int64_t>(swa_refs.size()); ++b)
    require<StateError>(swa_refs[static_cast<size_t>(b)] + swa_->is_pinned(b) == swa_->ref(b), "SWA block ", b,
                        " ref ", swa_->ref(b), " != table occurrences + pin");
  require<StateError>(extra_pages_ == extras, "pages below chunks' windows: ", extra_pages_, " counted, ", extras,
                      " held");
  require<StateError>(swa_reserved_ == quotas + checkpoint_reserve() + chunk_reserve(extras), "SWA reservation total");
  require<StateError>(envelopes_reserved_ == unbound, "row space: ", envelopes_reserved_,
                      " envelopes reserved for ", unbound, " blocks without one");
  if (rows_) return check_row_space_invariants();
  if (swa_)
    require<StateError>(swa_->free_slots() + swa_->held_slots() >= swa_reserved_, "SWA capacity ",
                        swa_->free_slots() + swa_->held_slots(), " below the promised ", swa_reserved_);
  if (!coord_) return;
  std::vector<int32_t> live(static_cast<size_t>(pools_.num_swa_blocks), 0);
  for (int64_t b = 0; b < pools_.num_logical_blocks; ++b) {
    for (int64_t t = 0; t < num_types(); ++t) {
      const int32_t p = logical_.binding(t, b);
      if (p < 0) continue;
      require<StateError>(owner_of_phys_[static_cast<size_t>(t)][static_cast<size_t>(p)] == b, "type ", t,
                          " phys ", p, " reverse map");
      require<StateError>(coord_->pool(t).compress_id_is_held(p), "type ", t, " phys ", p,
                          " bound to logical block ", b, " but not held in its pool");
      const int64_t slot = shared_slot_of(t, p);
      if (slot >= 0 && logical_.ref(b) > 0) ++live[static_cast<size_t>(slot)];
    }
  }
  for (int64_t t = 0; t < num_types(); ++t) {
    const TypePool& pool = coord_->pool(t);
    int64_t bound = 0;
    for (int32_t owner : owner_of_phys_[static_cast<size_t>(t)]) bound += owner >= 0;
    require<StateError>(bound == pool.num_compress_ids() - pool.free_compress_blocks() -
                                     pool.held_slots(SlotOwner::Reserved) * pool.blocks_per_slot(),
                        "type ", t, ": held compress blocks are not all bound (leak)");
  }
  for (int64_t slot = 0; slot < pools_.num_swa_blocks; ++slot) {
    require<StateError>(live[static_cast<size_t>(slot)] == live_in_slot_[static_cast<size_t>(slot)], "shared slot ",
                        slot, " live-binding count");
    const bool reclaimable = coord_->compress_busy(slot) && live[static_cast<size_t>(slot)] == 0;
    require<StateError>(reclaimable == reclaimable_.contains(slot), "shared slot ", slot, " reclaimable membership");
  }
}

// The row space holds an envelope for every cached (free, hashed) block and
// none for other free blocks; and the promise holds: the live blocks'
// envelopes (bound or reserved) and the reserved SWA pages fit the rows.
void KvManager::check_row_space_invariants() const {
  for (int64_t b = 0; b < pools_.num_logical_blocks; ++b) {
    const bool bound = rows_->is_bound(UnitKind::Envelope, b), free = logical_.ref(b) == 0;
    require<StateError>(rows_->is_cached(UnitKind::Envelope, b) == (free && bound), "logical block ", b,
                        " is cached in the row space iff it is free and holds an envelope");
    require<StateError>(!(free && bound) || logical_.has_hash(b), "cached logical block ", b, " has no content");
    require<StateError>(unbound_free_.contains(b) == (free && !bound), "logical block ", b,
                        " unbound-free membership");
  }
  require<StateError>(capacity_ok(0, 0), "row space: the live envelopes and the ", swa_reserved_,
                      " reserved SWA pages exceed the ", pools_.total_rows, " rows");
}

void KvManager::check_hash_chain(int64_t id, const Sequence& s) const {
  require<StateError>(s.hashes.size() * static_cast<size_t>(serve_.block_size) <= s.tokens.size(), "sequence ", id,
                      ": hashes of blocks beyond its tokens");
  for (size_t i = 0; i < s.hashes.size(); ++i) {
    const CacheKey h = block_key(s.tokens.data() + i * static_cast<size_t>(serve_.block_size),
                                 i > 0 ? &s.hashes[i - 1] : nullptr, s.salt);
    // What a state saved under another prefix_hash (or tampered with) shows.
    require<StateError>(h == s.hashes[i], "sequence ", id, ": block ", i, "'s key is not the prefix_hash=",
                        prefix_hash_name(serve_.prefix_hash), " key of its tokens");
  }
}

// ------------------------------------------------------------ serialization --

void KvManager::write_sequence(StateWriter& w, int64_t id, const Sequence& s) const {
  w.put(id);
  w.put_vec(s.tokens);
  for (int64_t v : {s.num_prompt, s.num_computed, s.swa_written_lo, s.swa_freed_upto, s.swa_quota, s.scheduled,
                    s.extra_pages, s.ensured, s.write_lo})
    w.put(v);
  w.put_vec(s.logical);
  for (int32_t b : s.swa) w.put(b);
  w.put(static_cast<int64_t>(s.hashes.size()));
  for (const CacheKey& h : s.hashes) write_key(w, h);
  w.put(static_cast<int64_t>(s.salt));
  w.put(s.generation);
  w.put(s.cached);
}

std::vector<int64_t> KvManager::to_state() const {
  std::vector<int64_t> st;
  StateWriter w(st);
  begin_state(w, StateKind::KvManager);
  ServeConfig::visit_fields(serve_, RecordWriter{w});
  PoolSizes::visit_fields(pools_, RecordWriter{w});
  if (coord_) {
    coord_->write_state(w);
    w.put_vec(reclaimable_.to_vector());
  }
  if (rows_) {
    rows_->write_state(w);
    w.put_vec(unbound_free_.to_vector());
    w.put(step_decode_copies_);
  }
  logical_.write_state(w);
  if (swa_) swa_->write_state(w);
  std::vector<int64_t> ids;
  for (const auto& kv : seqs_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());  // canonical order
  w.put(static_cast<int64_t>(ids.size()));
  for (int64_t id : ids) write_sequence(w, id, seqs_.at(id));
  events_.write_state(w);
  for (int64_t v : {stats_.admissions, stats_.admission_refusals, stats_.appends, stats_.append_refusals,
                    stats_.prefix_query_blocks, stats_.compressed_hit_blocks, stats_.prefix_hit_blocks,
                    stats_.reclaimed_slots, stats_.reclaimed_blocks, stats_.compress_evictions, stats_.whole_chunks})
    w.put(v);
  w.put(load_moves_);
  w.put(whole_chunks_ ? 1 : 0);
  return st;
}

void KvManager::read_sequence(StateReader& r) {
  const int64_t id = r.next();
  r.check(!has_sequence(id), "sequence ", id, " appears twice");
  Sequence s;
  s.tokens = r.vec<int32_t>(serve_.max_blocks_per_seq * serve_.block_size + 1 + serve_.mtp_k, "token");
  s.num_prompt = r.next();
  s.num_computed = r.next();
  s.swa_written_lo = r.next();
  s.swa_freed_upto = r.next();
  s.swa_quota = r.next();
  s.scheduled = r.in_range(0, 1 + serve_.mtp_k, "scheduled count");
  s.extra_pages = r.in_range(0, pools_.num_swa_blocks, "extra page count");
  s.ensured = r.in_range(0, static_cast<int64_t>(s.tokens.size()), "ensured count");
  s.write_lo = r.in_range(0, static_cast<int64_t>(s.tokens.size()), "write start");
  for (int64_t b : r.vec<int64_t>(serve_.max_blocks_per_seq, "block")) {
    r.check(b >= 0 && b < pools_.num_logical_blocks, "bad logical block ", b);
    s.logical.push_back(static_cast<int32_t>(b));
  }
  for (size_t i = 0; i < s.logical.size() * static_cast<size_t>(ppb_); ++i) {
    const auto w = static_cast<int32_t>(r.in_range(-1, pools_.num_swa_blocks - 1, "SWA block"));
    s.swa.push_back(w);
    s.swa_held += w >= 0;
  }
  const int64_t nh = r.count(static_cast<int64_t>(s.logical.size()), "hash");
  for (int64_t i = 0; i < nh; ++i) s.hashes.push_back(read_key(r));
  s.salt = static_cast<uint64_t>(r.next());
  s.generation = r.in_range(1, std::numeric_limits<int64_t>::max(), "generation");
  s.cached = r.in_range(0, s.num_computed, "cached prefix");
  swa_reserved_ += s.swa_quota + s.extra_pages;  // chunk_reserve with whole chunks off (from_state turns them on)
  extra_pages_ += s.extra_pages;
  if (rows_)  // the row space's state says which blocks are bound
    for (int32_t b : s.logical) envelopes_reserved_ += !rows_->is_bound(UnitKind::Envelope, b);
  seqs_.emplace(id, std::move(s));
}

std::unique_ptr<KvManager> KvManager::from_state(const std::vector<int64_t>& st) {
  StateReader r = open_state(st, StateKind::KvManager);
  ServeConfig serve;
  ServeConfig::visit_fields(serve, RecordReader{r});
  PoolSizes pools;
  PoolSizes::visit_fields(pools, RecordReader{r});
  auto m = std::make_unique<KvManager>(serve, pools);  // validates both
  if (m->coord_) {
    *m->coord_ = Coordinator::read_state(r);
    r.check(m->coord_->borrow_unreleased_swa() == (serve.layout == KvLayout::Elastic),
            "the coordinator's borrow_unreleased_swa disagrees with the layout");
    m->install_evict_listener();
    m->reclaimable_ = SlotList(pools.num_swa_blocks);
    for (int64_t slot : r.vec<int64_t>(pools.num_swa_blocks, "reclaimable slot")) {
      r.check(slot >= 0 && slot < pools.num_swa_blocks && !m->reclaimable_.contains(slot), "bad reclaimable slot");
      m->reclaimable_.push_back(slot);
    }
  }
  if (m->rows_) {
    *m->rows_ = RowSpace::read_state(r);
    m->install_evict_listener();
    m->unbound_free_ = SlotList(pools.num_logical_blocks);
    for (int64_t b : r.vec<int64_t>(pools.num_logical_blocks, "unbound free block")) {
      r.check(b >= 0 && b < pools.num_logical_blocks && !m->unbound_free_.contains(b), "bad unbound free block ", b);
      m->unbound_free_.push_back(b);
    }
    m->step_decode_copies_ = r.in_range(0, m->rows_->pending_copies(), "decode copy count");
  }
  m->logical_.read_state(r);
  if (m->swa_) m->swa_->read_state(r);
  const int64_t nseqs = r.count(std::numeric_limits<int64_t>::max(), "sequence");
  for (int64_t k = 0; k < nseqs; ++k) m->read_sequence(r);
  m->events_.read_state(r);
  auto& sx = m->stats_;
  for (int64_t* f : {&sx.admissions, &sx.admission_refusals, &sx.appends, &sx.append_refusals, &sx.prefix_query_blocks,
                     &sx.compressed_hit_blocks, &sx.prefix_hit_blocks, &sx.reclaimed_slots, &sx.reclaimed_blocks,
                     &sx.compress_evictions, &sx.whole_chunks})
    *f = r.next();
  m->load_moves_ = r.next();
  r.check(m->load_moves_ >= 0 && (m->rows_ ? m->load_moves_ <= prefill_copy_share(serve, pools) : m->load_moves_ == 0),
          "bad count of pending copies made by loads ", m->load_moves_);
  m->whole_chunks_ = r.in_range(0, 1, "whole chunks flag") == 1;
  m->swa_reserved_ += m->chunk_reserve(m->extra_pages_) - m->extra_pages_;
  r.finish();
  if (m->coord_) {  // derived maps: reverse bindings and live counts per shared slot
    for (int64_t b = 0; b < pools.num_logical_blocks; ++b)
      for (int64_t t = 0; t < m->num_types(); ++t) {
        const int32_t p = m->logical_.binding(t, b);
        if (p < 0) continue;
        r.check(p < m->coord_->pool(t).num_compress_ids(), "bad binding ", p);
        m->owner_of_phys_[static_cast<size_t>(t)][static_cast<size_t>(p)] = static_cast<int32_t>(b);
        const int64_t slot = m->shared_slot_of(t, p);
        if (slot >= 0 && m->logical_.ref(b) > 0) ++m->live_in_slot_[static_cast<size_t>(slot)];
      }
  }
  try {
    m->check_invariants();
  } catch (const StateError& e) {
    throw InvalidArgument(r.what() + " is inconsistent: " + e.what());
  }
  return m;
}

}  // namespace ukv
