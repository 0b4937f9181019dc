#include "core/manager/kv_events.h"

#include <limits>

namespace ukv {

KvEvent& KvEventLog::push(KvEventKind kind, KvRole role) {
  KvEvent e;
  e.kind = kind;
  e.role = role;
  e.seq_no = next_seq_no_++;
  pending_.events.push_back(e);
  return pending_.events.back();
}

void KvEventLog::stored(KvRole role, const CacheKey& hash, bool has_parent, const CacheKey& parent,
                        const int32_t* tokens, int64_t n, uint64_t salt) {
  KvEvent& e = push(KvEventKind::Stored, role);
  e.hash = hash;
  e.has_parent = has_parent;
  e.parent_hash = has_parent ? parent : CacheKey{};
  e.salt = salt;
  e.token_begin = static_cast<int64_t>(pending_.tokens.size());
  e.num_tokens = n;
  pending_.tokens.insert(pending_.tokens.end(), tokens, tokens + n);
}

void KvEventLog::removed(KvRole role, const CacheKey& hash) { push(KvEventKind::Removed, role).hash = hash; }

void KvEventLog::all_cleared() { push(KvEventKind::AllCleared, KvRole::Compress); }

KvEventBatch KvEventLog::take() {
  KvEventBatch out;
  out.events.swap(pending_.events);
  out.tokens.swap(pending_.tokens);
  return out;
}

void KvEventLog::write_state(StateWriter& w) const {
  w.put(next_seq_no_);
  w.put(static_cast<int64_t>(pending_.events.size()));
  for (const KvEvent& e : pending_.events) {
    for (int64_t v : {static_cast<int64_t>(e.kind), static_cast<int64_t>(e.role), e.seq_no}) w.put(v);
    write_key(w, e.hash);
    write_key(w, e.parent_hash);
    for (int64_t v : {static_cast<int64_t>(e.has_parent), static_cast<int64_t>(e.salt), e.token_begin, e.num_tokens})
      w.put(v);
  }
  w.put_vec(pending_.tokens);
}

void KvEventLog::read_state(StateReader& r) {
  next_seq_no_ = r.in_range(0, std::numeric_limits<int64_t>::max(), "next event sequence number");
  const int64_t n = r.count(next_seq_no_, "event");
  KvEventBatch batch;
  for (int64_t k = 0; k < n; ++k) {
    KvEvent e;
    e.kind = static_cast<KvEventKind>(r.in_range(0, 2, "event kind"));
    e.role = static_cast<KvRole>(r.in_range(0, 1, "event role"));
    e.seq_no = r.in_range(0, next_seq_no_ - 1, "event sequence number");
    e.hash = read_key(r);
    e.parent_hash = read_key(r);
    e.has_parent = r.flag("has_parent");
    e.salt = static_cast<uint64_t>(r.next());
    e.token_begin = r.next();
    e.num_tokens = r.next();
    batch.events.push_back(e);
  }
  batch.tokens = r.vec<int32_t>(std::numeric_limits<int32_t>::max(), "event token");
  for (const KvEvent& e : batch.events)
    r.check(e.token_begin >= 0 && e.num_tokens >= 0 &&
                e.token_begin + e.num_tokens <= static_cast<int64_t>(batch.tokens.size()),
            "event ", e.seq_no, " names tokens outside the event token buffer");
  pending_ = std::move(batch);
}

}  // namespace ukv
