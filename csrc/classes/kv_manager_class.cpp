#include "classes/kv_manager_class.h"

#include <functional>
#include <map>

#include "ops/core_errors.h"
#include "classes/tensor_args.h"

namespace ukv::ops {
namespace {

// Integer options of KvManagerConfig by name; unknown names are refused.
const std::map<std::string, std::function<void(KvManagerConfig&, int64_t)>>& option_setters() {
  static const std::map<std::string, std::function<void(KvManagerConfig&, int64_t)>> setters = {
      {"block_size", [](KvManagerConfig& c, int64_t v) { c.block_size = v; }},
      {"window", [](KvManagerConfig& c, int64_t v) { c.window = v; }},
      {"mtp_k", [](KvManagerConfig& c, int64_t v) { c.mtp_k = v; }},
      {"max_num_batched_tokens", [](KvManagerConfig& c, int64_t v) { c.max_num_batched_tokens = v; }},
      {"enable_prefix_caching", [](KvManagerConfig& c, int64_t v) { c.enable_prefix_caching = v != 0; }},
      {"unified", [](KvManagerConfig& c, int64_t v) { c.unified = v != 0; }},
      {"num_logical_blocks", [](KvManagerConfig& c, int64_t v) { c.num_logical_blocks = v; }},
      {"num_swa_blocks", [](KvManagerConfig& c, int64_t v) { c.num_swa_blocks = v; }},
      {"full_retain", [](KvManagerConfig& c, int64_t v) { c.full_retain = v != 0; }},
      {"retention_interval", [](KvManagerConfig& c, int64_t v) { c.retention_interval = v; }},
      {"max_num_seqs", [](KvManagerConfig& c, int64_t v) { c.max_num_seqs = v; }},
      {"max_blocks_per_seq", [](KvManagerConfig& c, int64_t v) { c.max_blocks_per_seq = v; }},
      {"borrow_unreleased_swa", [](KvManagerConfig& c, int64_t v) { c.borrow_unreleased_swa = v != 0; }},
  };
  return setters;
}

KvManagerConfig make_config(const c10::Dict<std::string, int64_t>& options, std::vector<int64_t> ks,
                            std::vector<int64_t> type_slots, double checkpoint_frac) {
  KvManagerConfig c;
  for (const auto& entry : options) {
    const auto it = option_setters().find(entry.key());
    if (it == option_setters().end()) {
      std::string known;
      for (const auto& kv : option_setters()) known += (known.empty() ? "" : ", ") + kv.first;
      TORCH_CHECK_VALUE(false, "KvManager: unknown option '", entry.key(), "' (known: ", known, ")");
    }
    it->second(c, entry.value());
  }
  c.compress_ks = std::move(ks);
  c.type_slots = std::move(type_slots);
  c.checkpoint_frac = checkpoint_frac;
  return c;
}

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

KvManagerHolder::KvManagerHolder(c10::Dict<std::string, int64_t> options, std::vector<int64_t> compress_ks,
                                 std::vector<int64_t> type_slots, double checkpoint_frac, std::string device)
    : device_(std::move(device)) {
  const KvManagerConfig cfg = make_config(options, std::move(compress_ks), std::move(type_slots), checkpoint_frac);
  manager_ = translate_core_errors([&] { return std::make_unique<KvManager>(cfg); });
  make_stager();
}

KvManagerHolder::KvManagerHolder(std::unique_ptr<KvManager> manager, std::string device)
    : manager_(std::move(manager)), device_(std::move(device)) {
  make_stager();
}

void KvManagerHolder::make_stager() {
  const auto& c = manager_->config();
  stager_ = std::make_unique<TableStager>(c.max_num_seqs, 2 + manager_->num_types(), c.max_blocks_per_seq,
                                          parse_device(device_));
}

int64_t KvManagerHolder::can_allocate(const at::Tensor& tokens) {
  const at::Tensor t = token_arg(tokens, "tokens");
  return locked([&] { return manager_->can_allocate(t.data_ptr<int32_t>(), t.numel()); });
}

int64_t KvManagerHolder::allocate(int64_t seq_id, const at::Tensor& tokens) {
  const at::Tensor t = token_arg(tokens, "tokens");
  return locked([&] { return manager_->allocate(seq_id, t.data_ptr<int32_t>(), t.numel()); });
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

int64_t KvManagerHolder::can_append(const at::Tensor& seq_ids, int64_t num_new_tokens) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids");
  return locked([&] { return manager_->can_append(ids.data_ptr<int64_t>(), ids.numel(), num_new_tokens); });
}

void KvManagerHolder::append(const at::Tensor& seq_ids, int64_t num_new_tokens) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids");
  locked([&] { manager_->append(ids.data_ptr<int64_t>(), ids.numel(), num_new_tokens); });
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

void KvManagerHolder::stage(const at::Tensor& seq_ids) {
  const at::Tensor ids = int64_arg(seq_ids, "seq_ids");
  locked([&] {
    stager_->wait_until_writable();
    const at::Tensor& host = stager_->host();
    auto* base = host.data_ptr<int32_t>();
    const int64_t table_stride = host.stride(1), row_stride = host.stride(0);
    StagingView view{base, base + table_stride, {}, row_stride};
    for (int64_t t = 0; t < manager_->num_types(); ++t) view.phys.push_back(base + (2 + t) * table_stride);
    manager_->stage(ids.data_ptr<int64_t>(), ids.numel(), view);
  });
}

void KvManagerHolder::upload(int64_t rows) { locked([&] { stager_->upload(rows); }); }
void KvManagerHolder::mark_uploaded() { locked([&] { stager_->mark_uploaded(); }); }
void KvManagerHolder::invalidate_staging() { locked([&] { manager_->invalidate_staging(); }); }
at::Tensor KvManagerHolder::host_tables() { return locked([&] { return stager_->host(); }); }
at::Tensor KvManagerHolder::tables() { return locked([&] { return stager_->tables(); }); }

std::vector<std::tuple<int64_t, int64_t, int64_t, bool>> KvManagerHolder::take_events() {
  return locked([&] {
    std::vector<std::tuple<int64_t, int64_t, int64_t, bool>> out;
    for (const auto& e : manager_->take_events())
      out.emplace_back(static_cast<int64_t>(e.kind), static_cast<int64_t>(e.block_hash),
                       static_cast<int64_t>(e.parent_hash), e.has_parent);
    return out;
  });
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
    if (const Coordinator* c = manager_->coordinator()) {
      d.insert("swa_evictions", c->counters().swa_evictions);
      d.insert("unreleased_borrows", c->counters().unreleased_borrows);
      for (int64_t t = 0; t < c->num_types(); ++t) {
        const std::string p = "type" + std::to_string(t) + "_";
        d.insert(p + "free_blocks", c->free_compress_blocks(t));
        d.insert(p + "borrows", c->pool(t).counters().borrows);
      }
    }
    return d;
  });
}

c10::Dict<std::string, int64_t> KvManagerHolder::config() {
  return locked([&] {
    const auto& c = manager_->config();
    c10::Dict<std::string, int64_t> d;
    d.insert("block_size", c.block_size);
    d.insert("window", c.window);
    d.insert("mtp_k", c.mtp_k);
    d.insert("max_num_batched_tokens", c.max_num_batched_tokens);
    d.insert("enable_prefix_caching", c.enable_prefix_caching);
    d.insert("unified", c.unified);
    d.insert("num_logical_blocks", c.num_logical_blocks);
    d.insert("num_swa_blocks", c.num_swa_blocks);
    d.insert("full_retain", c.full_retain);
    d.insert("retention_interval", c.retention_interval);
    d.insert("max_num_seqs", c.max_num_seqs);
    d.insert("max_blocks_per_seq", c.max_blocks_per_seq);
    d.insert("borrow_unreleased_swa", c.borrow_unreleased_swa);
    d.insert("tail_blocks", manager_->tail_blocks());
    d.insert("prefill_quota_bound", manager_->prefill_quota_bound());
    d.insert("decode_quota_bound", manager_->decode_quota_bound());
    return d;
  });
}

std::vector<int64_t> KvManagerHolder::compress_ks() { return locked([&] { return manager_->config().compress_ks; }); }
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
