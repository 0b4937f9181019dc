#include "classes/kv_manager_class.h"

#include "classes/tensor_args.h"
#include "core/manager/staged_tables.h"
#include "ops/core_errors.h"

namespace ukv::ops {
namespace {

std::optional<at::Device> parse_device(const std::string& device) {
  if (device.empty()) return std::nullopt;
  return at::Device(device);
}

at::Tensor to_tensor(const std::vector<int32_t>& v) {
  return at::tensor(at::ArrayRef<int32_t>(v), at::TensorOptions().dtype(at::kInt));
}

}  // namespace

template <typename F>
decltype(auto) KvManagerHolder::locked(F&& fn) {
  std::lock_guard<std::mutex> guard(mu_);
  return translate_core_errors(std::forward<F>(fn));
}

KvManagerHolder::KvManagerHolder(std::vector<int64_t> config, std::vector<int64_t> pools, std::string device)
    : device_(std::move(device)) {
  manager_ = translate_core_errors([&] {
    return std::make_unique<KvManager>(decode_record<ServeConfig>(config), decode_record<PoolSizes>(pools));
  });
  make_stager();
}

KvManagerHolder::KvManagerHolder(std::unique_ptr<KvManager> manager, std::string device)
    : manager_(std::move(manager)), device_(std::move(device)) {
  make_stager();
}

void KvManagerHolder::make_stager() {
  const auto& c = manager_->config();
  const StagedTablesShape shape = staged_tables_shape(c);
  const RowSpace* rows = manager_->row_space();
  stager_ = std::make_unique<TableStager>(shape.rows, shape.tables, shape.cols, rows ? rows->max_copies() : 0,
                                          parse_device(device_),
                                          StagedLayout{c.swa_page(), rows ? manager_->pools().envelope_rows : 0});
}

int64_t KvManagerHolder::can_allocate(const at::Tensor& tokens, int64_t salt, int64_t loaded_tokens) {
  const at::Tensor t = token_arg(tokens, "tokens");
  return locked([&] {
    return manager_->can_allocate_loaded(t.data_ptr<int32_t>(), t.numel(), loaded_tokens, static_cast<uint64_t>(salt));
  });
}

int64_t KvManagerHolder::allocate(int64_t seq_id, const at::Tensor& tokens, int64_t salt, int64_t loaded_tokens) {
  const at::Tensor t = token_arg(tokens, "tokens");
  return locked([&] {
    const auto s = static_cast<uint64_t>(salt);
    return loaded_tokens == 0 ? manager_->allocate(seq_id, t.data_ptr<int32_t>(), t.numel(), s)
                              : manager_->allocate_loaded(seq_id, t.data_ptr<int32_t>(), t.numel(), loaded_tokens, s);
  });
}

void KvManagerHolder::ensure_for_tokens(const at::Tensor& seq_ids, const at::Tensor& counts) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids"), n = int64_arg(counts, "counts");
  require_same_length(ids, "seq_ids", n, "counts");
  locked([&] { manager_->ensure_for_tokens(ids.data_ptr<int64_t>(), n.data_ptr<int64_t>(), ids.numel()); });
}

void KvManagerHolder::commit_prefill(const at::Tensor& seq_ids, const at::Tensor& counts, const at::Tensor& sampled) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids"), n = int64_arg(counts, "counts");
  const at::Tensor s = token_arg(sampled, "sampled", -1);
  require_same_length(ids, "seq_ids", n, "counts");
  require_same_length(ids, "seq_ids", s, "sampled");
  locked([&] {
    manager_->commit_prefill(ids.data_ptr<int64_t>(), n.data_ptr<int64_t>(), s.data_ptr<int32_t>(), ids.numel());
  });
}

int64_t KvManagerHolder::can_append(const at::Tensor& seq_ids, const at::Tensor& num_new_tokens) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids"), n = int64_arg(num_new_tokens, "num_new_tokens");
  require_same_length(ids, "seq_ids", n, "num_new_tokens");
  return locked([&] { return manager_->can_append(ids.data_ptr<int64_t>(), n.data_ptr<int64_t>(), ids.numel()); });
}

void KvManagerHolder::append(const at::Tensor& seq_ids, const at::Tensor& num_new_tokens) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids"), n = int64_arg(num_new_tokens, "num_new_tokens");
  require_same_length(ids, "seq_ids", n, "num_new_tokens");
  locked([&] { manager_->append(ids.data_ptr<int64_t>(), n.data_ptr<int64_t>(), ids.numel()); });
}

void KvManagerHolder::commit_decode(const at::Tensor& seq_ids, const at::Tensor& counts, const at::Tensor& tokens) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids"), n = int64_arg(counts, "counts");
  const at::Tensor t = token_arg(tokens, "tokens");
  require_same_length(ids, "seq_ids", n, "counts");
  // A loop, not sum().item(): this runs every decode step. Counts outside
  // [0, tokens left] are refused as they come, so the sum never wraps.
  int64_t total = 0;
  for (int64_t i = 0; i < n.numel(); ++i) {
    const int64_t count = n.data_ptr<int64_t>()[i];
    TORCH_CHECK_VALUE(count >= 0 && count <= t.numel() - total, "tokens must hold sum(counts) tokens (",
                      t.numel(), " given); counts[", i, "] = ", count, " after ", total);
    total += count;
  }
  TORCH_CHECK_VALUE(total == t.numel(), "tokens must hold sum(counts) = ", total, " tokens, got ", t.numel());
  locked([&] {
    manager_->commit_decode(ids.data_ptr<int64_t>(), n.data_ptr<int64_t>(), t.data_ptr<int32_t>(), ids.numel());
  });
}

void KvManagerHolder::deallocate(const at::Tensor& seq_ids) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids");
  locked([&] { manager_->deallocate(ids.data_ptr<int64_t>(), ids.numel()); });
}

void KvManagerHolder::clear_cache() { locked([&] { manager_->clear_cache(); }); }

bool KvManagerHolder::has_sequence(int64_t seq_id) { return locked([&] { return manager_->has_sequence(seq_id); }); }
void KvManagerHolder::set_whole_chunks(bool on) { locked([&] { manager_->set_whole_chunks(on); }); }
bool KvManagerHolder::whole_chunks() { return locked([&] { return manager_->whole_chunks(); }); }
int64_t KvManagerHolder::num_sequences() { return locked([&] { return manager_->num_sequences(); }); }
int64_t KvManagerHolder::num_computed(int64_t seq_id) { return locked([&] { return manager_->num_computed(seq_id); }); }
int64_t KvManagerHolder::num_tokens(int64_t seq_id) { return locked([&] { return manager_->num_tokens(seq_id); }); }
at::Tensor KvManagerHolder::logical_table(int64_t seq_id) {
  return locked([&] { return to_tensor(manager_->logical_table(seq_id)); });
}
at::Tensor KvManagerHolder::swa_table(int64_t seq_id) {
  return locked([&] { return to_tensor(manager_->swa_table(seq_id)); });
}
at::Tensor KvManagerHolder::phys_table(int64_t seq_id, int64_t type) {
  return locked([&] { return to_tensor(manager_->phys_table(seq_id, type)); });
}

at::Tensor KvManagerHolder::staged_swa_table(int64_t seq_id) {
  return locked([&] { return to_tensor(manager_->staged_swa_table(seq_id)); });
}

KvManagerHolder::SequenceDescription KvManagerHolder::describe_sequence(int64_t seq_id) {
  return locked([&] {
    const KvManager& m = *manager_;
    m.check_exportable(seq_id);
    const std::vector<CacheKey>& hashes = m.block_hashes(seq_id);
    const at::Tensor hash_tensor = keys_tensor(hashes, m.config().prefix_hash);
    const at::Tensor logical = to_tensor(m.logical_table(seq_id));
    at::Tensor phys = at::empty({m.config().num_phys_tables(), logical.numel()}, logical.options());
    for (int64_t t = 0; t < phys.size(0); ++t) phys[t].copy_(to_tensor(m.phys_table(seq_id, t)));
    const int64_t computed = m.num_computed(seq_id);
    return std::make_tuple(to_tensor(m.tokens(seq_id)), computed, m.transfer_swa_begin(computed), hash_tensor,
                           logical, to_tensor(m.staged_swa_table(seq_id)), phys,
                           static_cast<int64_t>(m.salt(seq_id)), m.generation(seq_id), m.cached_prefix(seq_id));
  });
}

int64_t KvManagerHolder::import_sequence(int64_t seq_id, const at::Tensor& tokens, int64_t num_computed,
                                         int64_t salt) {
  const at::Tensor t = token_arg(tokens, "tokens");
  return locked([&] {
    return manager_->import_sequence(seq_id, t.data_ptr<int32_t>(), t.numel(), num_computed,
                                     static_cast<uint64_t>(salt));
  });
}

namespace {

// The keys and the tokens of n units of `unit_tokens` tokens each, checked.
std::pair<std::vector<CacheKey>, at::Tensor> locate_args(const at::Tensor& hashes, const at::Tensor& tokens,
                                                         int64_t unit_tokens, PrefixHash kind) {
  const std::vector<CacheKey> h = keys_arg(hashes, kind, "hashes");
  const at::Tensor t = token_arg(tokens, "tokens");
  const auto n = static_cast<int64_t>(h.size());
  TORCH_CHECK(t.numel() == n * unit_tokens, "tokens must hold ", unit_tokens, " tokens per hash (", n * unit_tokens,
              "), got ", t.numel());
  return {h, t};
}

}  // namespace

at::Tensor KvManagerHolder::locate_blocks(const at::Tensor& hashes, const at::Tensor& tokens) {
  return locked([&] {
    const KvManager& m = *manager_;
    const auto [h, t] = locate_args(hashes, tokens, m.config().block_size, m.config().prefix_hash);
    const auto n = static_cast<int64_t>(h.size());
    at::Tensor out = at::empty({n, 1 + m.config().num_phys_tables()}, at::TensorOptions().dtype(at::kInt));
    m.locate_blocks(h.data(), t.data_ptr<int32_t>(), n, out.data_ptr<int32_t>());
    return out;
  });
}

at::Tensor KvManagerHolder::locate_pages(const at::Tensor& hashes, const at::Tensor& tokens) {
  return locked([&] {
    const KvManager& m = *manager_;
    const auto [h, t] = locate_args(hashes, tokens, m.config().swa_page(), m.config().prefix_hash);
    const auto n = static_cast<int64_t>(h.size());
    at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kInt));
    m.locate_pages(h.data(), t.data_ptr<int32_t>(), n, out.data_ptr<int32_t>());
    return out;
  });
}

void KvManagerHolder::stage(const at::Tensor& seq_ids) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids");
  locked([&] {
    stager_->wait_until_writable();
    const at::Tensor& host = stager_->host();
    auto* base = host.data_ptr<int32_t>();
    const int64_t table_stride = host.stride(1), row_stride = host.stride(0);
    StagingView view{base + kLogicalTable * table_stride, base + kSwaTable * table_stride, {}, row_stride};
    for (int64_t t = 0; t < manager_->config().num_phys_tables(); ++t)
      view.phys.push_back(base + phys_table_index(t) * table_stride);
    manager_->stage(ids.data_ptr<int64_t>(), ids.numel(), view);
    stage_copies();
  });
}

// The row copies since the last stage, grouped by phase, with each phase's count.
void KvManagerHolder::stage_copies() {
  const std::vector<RowCopy> copies = manager_->take_copies();
  auto* out = stager_->copies_host().data_ptr<int32_t>();
  auto* counts = stager_->counts_host().data_ptr<int32_t>();
  int64_t n = 0;
  for (int32_t phase = 0; phase < RowSpace::kMaxCopyPhases; ++phase) {
    counts[phase] = 0;
    for (const RowCopy& c : copies) {
      if (c.phase != phase) continue;
      out[3 * n] = c.src_row;
      out[3 * n + 1] = c.dst_row;
      out[3 * n + 2] = c.rows;
      ++n;
      ++counts[phase];
    }
  }
}

void KvManagerHolder::upload(int64_t rows) { locked([&] { stager_->upload(rows); }); }
void KvManagerHolder::mark_uploaded() { locked([&] { stager_->mark_uploaded(); }); }
void KvManagerHolder::invalidate_staging() { locked([&] { manager_->invalidate_staging(); }); }
at::Tensor KvManagerHolder::host_tables() { return locked([&] { return stager_->host(); }); }
at::Tensor KvManagerHolder::tables() { return locked([&] { return stager_->tables(); }); }
at::Tensor KvManagerHolder::row_copies() { return locked([&] { return stager_->copies(); }); }
at::Tensor KvManagerHolder::row_copy_counts() { return locked([&] { return stager_->copy_counts(); }); }

std::tuple<at::Tensor, at::Tensor> KvManagerHolder::take_events() {
  const KvEventBatch batch = locked([&] { return manager_->take_events(); });
  constexpr int64_t kFields = 10;
  const auto n = static_cast<int64_t>(batch.events.size());
  at::Tensor fields = at::empty({n, kFields}, at::TensorOptions().dtype(at::kLong));
  int64_t* row = fields.data_ptr<int64_t>();
  for (const KvEvent& e : batch.events) {
    for (int64_t v : {static_cast<int64_t>(e.kind), e.seq_no, static_cast<int64_t>(e.role), static_cast<int64_t>(e.hash.lo),
                      static_cast<int64_t>(e.parent_hash.lo), static_cast<int64_t>(e.has_parent),
                      static_cast<int64_t>(e.salt), e.num_tokens, static_cast<int64_t>(e.hash.hi),
                      static_cast<int64_t>(e.parent_hash.hi)})
      *row++ = v;
  }
  return {fields, to_tensor(batch.tokens)};
}

c10::Dict<std::string, int64_t> KvManagerHolder::stats() {
  return locked([&] {
    c10::Dict<std::string, int64_t> d;
    const auto& s = manager_->stats();
    d.insert("num_sequences", manager_->num_sequences());
    d.insert("free_logical_blocks", manager_->free_logical_blocks());
    d.insert("free_swa_slots", manager_->free_swa_slots());
    d.insert("held_swa_slots", manager_->held_swa_slots());
    d.insert("swa_reserved", manager_->swa_reserved());
    d.insert("reclaimable_slots", manager_->reclaimable_slots());
    d.insert("admissions", s.admissions);
    d.insert("admission_refusals", s.admission_refusals);
    d.insert("appends", s.appends);
    d.insert("append_refusals", s.append_refusals);
    d.insert("prefix_query_blocks", s.prefix_query_blocks);
    d.insert("compressed_hit_blocks", s.compressed_hit_blocks);
    d.insert("prefix_hit_blocks", s.prefix_hit_blocks);
    d.insert("reclaimed_slots", s.reclaimed_slots);
    d.insert("reclaimed_blocks", s.reclaimed_blocks);
    d.insert("compress_evictions", s.compress_evictions);
    d.insert("whole_chunks", s.whole_chunks);
    if (const RowSpace* r = manager_->row_space()) {
      const RowSpaceCounters& rc = r->counters();
      d.insert("live_envelopes", r->live_units(UnitKind::Envelope));
      d.insert("cached_envelopes", r->cached_units(UnitKind::Envelope));
      d.insert("live_swa_units", r->live_units(UnitKind::Swa));
      d.insert("cached_swa_units", r->cached_units(UnitKind::Swa));
      d.insert("unheld_rows", r->unheld_rows());
      d.insert("envelope_evictions", rc.evictions[0]);
      d.insert("swa_unit_evictions", rc.evictions[1]);
      d.insert("envelope_moves", rc.moves[0]);
      d.insert("swa_unit_moves", rc.moves[1]);
      d.insert("moved_rows", rc.moved_rows);
    }
    if (const Coordinator* c = manager_->coordinator()) {
      d.insert("swa_evictions", c->counters().swa_evictions);
      d.insert("unreleased_borrows", c->counters().unreleased_borrows);
      for (int64_t t = 0; t < c->num_types(); ++t) {
        const std::string p = "ratio" + std::to_string(manager_->config().compress_ratios[static_cast<size_t>(t)]) + "_";
        d.insert(p + "free_blocks", c->free_compress_blocks(t));
        d.insert(p + "borrows", c->pool(t).counters().borrows);
      }
    }
    return d;
  });
}

std::vector<int64_t> KvManagerHolder::config() { return locked([&] { return encode_record(manager_->config()); }); }
std::vector<int64_t> KvManagerHolder::pools() { return locked([&] { return encode_record(manager_->pools()); }); }

c10::Dict<std::string, int64_t> KvManagerHolder::quota_bounds() {
  return locked([&] {
    c10::Dict<std::string, int64_t> d;
    d.insert("tail_pages", manager_->tail_pages());
    d.insert("prefill_quota_bound", manager_->prefill_quota_bound());
    d.insert("decode_quota_bound", manager_->decode_quota_bound());
    d.insert("whole_chunk_pages", manager_->whole_chunk_pages());
    return d;
  });
}

void KvManagerHolder::check_invariants() { locked([&] { manager_->check_invariants(); }); }

std::tuple<std::vector<int64_t>, std::string> KvManagerHolder::get_state() {
  return locked([&] { return std::make_tuple(manager_->to_state(), device_); });
}

c10::intrusive_ptr<KvManagerHolder> KvManagerHolder::from_state(std::tuple<std::vector<int64_t>, std::string> state) {
  auto manager = translate_core_errors([&] { return KvManager::from_state(std::get<0>(state)); });
  return c10::make_intrusive<KvManagerHolder>(std::move(manager), std::get<1>(state));
}

std::tuple<std::tuple<std::string, at::Tensor>, std::tuple<std::string, std::string>> KvManagerHolder::obj_flatten() {
  auto [state, device] = get_state();
  return {{"state", at::tensor(at::ArrayRef<int64_t>(state), at::TensorOptions().dtype(at::kLong))},
          {"device", device}};
}

}  // namespace ukv::ops
