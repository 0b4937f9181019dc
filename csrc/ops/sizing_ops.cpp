#include "ops/sizing_ops.h"

#include "core/sizing.h"
#include "ops/core_errors.h"

namespace ukv::ops {
namespace {
Layout layout_of(bool unified) { return unified ? Layout::Unified : Layout::StaticSplit; }
}  // namespace

std::vector<int64_t> slot_counts(int64_t num_swa_blocks, int64_t num_compress_blocks, std::vector<int64_t> ks,
                                 int64_t block_size) {
  return translate_core_errors([&] { return ukv::slot_counts(num_swa_blocks, num_compress_blocks, ks, block_size); });
}

int64_t layer_rows(int64_t compress_ratio, int64_t num_swa_blocks, int64_t num_compress_blocks, int64_t block_size,
                   bool unified) {
  return translate_core_errors([&] {
    return ukv::layer_rows(layout_of(unified), compress_ratio, num_swa_blocks, num_compress_blocks, block_size);
  });
}

int64_t layer_rows_for_slots(int64_t compress_ratio, int64_t type_slots, int64_t num_swa_blocks,
                             int64_t block_size) {
  return translate_core_errors(
      [&] { return ukv::layer_rows_for_slots(compress_ratio, type_slots, num_swa_blocks, block_size); });
}

int64_t compress_base_row(bool unified, int64_t num_swa_blocks, int64_t block_size) {
  return translate_core_errors([&] { return ukv::compress_base_row(layout_of(unified), num_swa_blocks, block_size); });
}

}  // namespace ukv::ops

#include "core/kv_plan.h"

namespace ukv::ops {

std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>> plan_kv_layout(
    int64_t budget_bytes, std::vector<int64_t> compress_ratios, int64_t head_dim, int64_t kv_elem_bytes,
    int64_t rope_head_dim, int64_t rope_elem_bytes, int64_t indexer_bytes_per_block, int64_t block_size,
    int64_t window, int64_t mtp_k, int64_t max_num_seqs, std::optional<int64_t> max_num_batched_tokens,
    bool full_retain, double swa_budget_frac, std::string mode) {
  PlanMode plan_mode;
  if (mode == "static") plan_mode = PlanMode::StaticSplit;
  else if (mode == "upstream") plan_mode = PlanMode::UnifiedUpstream;
  else if (mode == "elastic") plan_mode = PlanMode::UnifiedElastic;
  else TORCH_CHECK_VALUE(false, "mode must be 'static', 'upstream' or 'elastic', got '", mode, "'");
  const ModelKvSpec model{std::move(compress_ratios), head_dim, kv_elem_bytes, rope_head_dim, rope_elem_bytes,
                          indexer_bytes_per_block};
  const ServeSpec serve{block_size, window, mtp_k, max_num_seqs, max_num_batched_tokens, full_retain, swa_budget_frac};
  const KvPlan p = translate_core_errors([&] { return ukv::plan_kv_layout(budget_bytes, model, serve, plan_mode); });
  return {{p.num_swa_blocks, p.num_logical_blocks, p.kv_bytes, p.rope_bytes, p.indexer_bytes, p.total_bytes,
           p.swa_block_bytes, p.compressed_block_bytes},
          p.compress_ks, p.type_slots, p.layer_rows};
}

}  // namespace ukv::ops
