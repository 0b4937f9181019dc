// Planning the KV layout from a byte budget: how many SWA slots, logical
// compress blocks and rows per layer tensor fit, for the static split, the
// unified pool with upstream sizing (flag-on capacity == flag-off), and the
// unified pool with elastic sizing (the logical block space covers every
// compress block the tensors can physically hold, so slots SWA leaves idle
// serve compress). Per-logical-block side pools (the CSA indexer) are charged.
// Every row count comes from sizing.h, the source the allocator uses too.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ukv {

struct ModelKvSpec {
  std::vector<int64_t> compress_ratios;  // one per layer: 4 CSA, 128 HCA, 0 dense (MTP layers included)
  int64_t head_dim = 512;
  int64_t kv_elem_bytes = 1;             // fp8 1, bf16 2
  int64_t rope_head_dim = 0;             // separate rope plane (fp8 mode: 64); 0 = none
  int64_t rope_elem_bytes = 2;
  int64_t indexer_bytes_per_block = 0;   // per CSA (ratio 4) layer and logical block: 32 x 144 for V4
};

struct ServeSpec {
  int64_t block_size = 128;
  int64_t window = 128;
  int64_t mtp_k = 0;
  int64_t max_num_seqs = 256;
  // The SWA blocks one step's prefill chunks may span beyond the decode
  // windows: ceil(max_num_batched_tokens / block_size) when given, else
  // upstream's fixed 64 (8192 tokens at block 128), whatever the engine's
  // real token budget.
  std::optional<int64_t> max_num_batched_tokens;
  bool full_retain = false;       // SWA gets swa_budget_frac of the budget instead of the window formula
  double swa_budget_frac = 0.2;
};

enum class PlanMode : int64_t { StaticSplit = 0, UnifiedUpstream = 1, UnifiedElastic = 2 };

struct KvPlan {
  PlanMode mode;
  int64_t num_swa_blocks = 0;
  int64_t num_logical_blocks = 0;
  std::vector<int64_t> compress_ks;  // one per compress type, in ascending ratio order
  std::vector<int64_t> type_slots;   // unified: slots of each type's tensor; empty for the static split
  std::vector<int64_t> layer_rows;   // one per layer
  int64_t kv_bytes = 0, rope_bytes = 0, indexer_bytes = 0, total_bytes = 0;
  int64_t swa_block_bytes = 0;         // one SWA block across all layers
  int64_t compressed_block_bytes = 0;  // one logical block across all compressed layers + indexer
};

// Throws InvalidArgument when the inputs are out of domain or not even the
// SWA region fits the budget.
KvPlan plan_kv_layout(int64_t budget_bytes, const ModelKvSpec& model, const ServeSpec& serve, PlanMode mode);

}  // namespace ukv
