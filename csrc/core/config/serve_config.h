// ServeConfig: the serving parameters, defined once.
//
// Planning (kv_plan), the KV manager, tensor allocation and the distributed
// helpers all take this one struct, so no parameter is given twice and no two
// parts can disagree. Its fields are listed once, in visit_fields(): the
// serialised form (state_io), the description the Python class is built from
// (ukv_torch.ServeConfig) and the validation all follow that list.
//
// Compress types are named by their compress ratio (4 = CSA, 128 = HCA);
// rows per block (k = block_size / ratio) are derived, never given.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/record.h"
#include "core/hashing/cache_key.h"

namespace ukv {

// How the KV memory is laid out (docs/design.md):
//   Static:   upstream's static split (flag off): private SWA and compress regions.
//   Upstream: option-2 unified pool, upstream sizing (flag-on capacity == flag-off).
//   Elastic:  option-2 whose logical block space covers every compress block the
//             tensors can hold; compress borrows SWA slots SWA never used.
//   RowSpace: one row space for all layers: compress envelopes and SWA pages of
//             swa_page_tokens share it, either kind usable by the other.
enum class KvLayout : int64_t { Static = 0, Upstream = 1, Elastic = 2, RowSpace = 3 };

// The prefill-chunk term of the slot layouts' SWA pool: upstream's fixed 64
// blocks, or the blocks max_num_batched_tokens spans.
enum class SwaSizing : int64_t { Upstream = 0, Step = 1 };

struct ServeConfig {
  int64_t block_size = 128;
  int64_t swa_page_tokens = 0;
  int64_t window = 128;
  int64_t mtp_k = 0;
  std::vector<int64_t> compress_ratios = {4, 128};
  int64_t max_num_seqs = 256;
  int64_t max_blocks_per_seq = 1024;
  int64_t max_num_batched_tokens = 8192;
  KvLayout layout = KvLayout::Elastic;
  SwaSizing swa_sizing = SwaSizing::Upstream;
  bool enable_prefix_caching = true;
  bool full_retain = false;
  int64_t retention_interval = 0;
  double checkpoint_frac = 0.5;
  double swa_budget_frac = 0.2;
  PrefixHash prefix_hash = PrefixHash::Xxh64;

  // Tokens per SWA page (swa_page_tokens, or block_size when it is 0).
  int64_t swa_page() const { return swa_page_tokens > 0 ? swa_page_tokens : block_size; }
  int64_t pages_per_block() const { return block_size / swa_page(); }
  int64_t num_types() const { return static_cast<int64_t>(compress_ratios.size()); }
  // Rows per block of each compress type, in compress_ratios order.
  std::vector<int64_t> compress_ks() const;
  int64_t type_of_ratio(int64_t ratio) const;  // -1 when no type has this ratio
  bool unified() const { return layout != KvLayout::Static; }
  bool row_space() const { return layout == KvLayout::RowSpace; }
  // Physical compress tables a sequence has: one per type, or one envelope
  // table in the row-space layout.
  int64_t num_phys_tables() const { return row_space() ? 1 : num_types(); }
  // Columns of the staged tables: the longest sequence in SWA pages (>= blocks).
  int64_t table_cols() const { return max_blocks_per_seq * pages_per_block(); }

  // The fields, once, in their serialised order (core/config/record.h).
  template <class Self, class Visitor>
  static void visit_fields(Self& c, Visitor&& v) {
    v.integer("block_size", c.block_size, "tokens per logical block: the compress block and the prefix-cache unit");
    v.integer("swa_page_tokens", c.swa_page_tokens,
              "tokens per SWA page; 0 = block_size. Smaller pages (row_space only) cut each sequence's window "
              "footprint; every compress type's k must divide it");
    v.integer("window", c.window, "sliding window in tokens; 0 = no SWA pool");
    v.integer("mtp_k", c.mtp_k, "speculative (draft) tokens per decode step");
    v.integers("compress_ratios", c.compress_ratios,
               "compress ratio of each compress type, ascending (4 = CSA, 128 = HCA); each divides block_size");
    v.integer("max_num_seqs", c.max_num_seqs, "rows of the staged tables: sequences one step may stage");
    v.integer("max_blocks_per_seq", c.max_blocks_per_seq, "the longest sequence, in blocks (table columns)");
    v.integer("max_num_batched_tokens", c.max_num_batched_tokens, "tokens one step may schedule");
    v.choice("layout", c.layout, {"static", "upstream", "elastic", "row_space"}, "how KV memory is laid out");
    v.choice("swa_sizing", c.swa_sizing, {"upstream", "step"},
             "slot layouts: the SWA pool's prefill-chunk term, upstream's fixed 64 blocks or the blocks "
             "max_num_batched_tokens spans");
    v.flag("enable_prefix_caching", c.enable_prefix_caching, "reuse cached prefix blocks across requests");
    v.flag("full_retain", c.full_retain, "SWA holds whole prefill chunks (sparse checkpoints need it)");
    v.integer("retention_interval", c.retention_interval, "tokens between sparse SWA checkpoints (full_retain); 0 = none");
    v.real("checkpoint_frac", c.checkpoint_frac, "fraction of the SWA pool checkpoints may pin");
    v.real("swa_budget_frac", c.swa_budget_frac, "full_retain plans: the SWA pool's share of the byte budget");
    v.choice("prefix_hash", c.prefix_hash, {"xxh64", "sha256", "blake2b"},
             "the prefix cache's block hash: xxh64 (64 bits, what upstream-compatible routers compute) or 128 "
             "bits of sha256 or blake2b (collision resistant); KV events carry it");
  }
};


// Throws InvalidArgument naming the field and what it must be.
void validate(const ServeConfig& c);

template <>
struct RecordTraits<ServeConfig> {
  static constexpr const char* name = "ServeConfig";
  static constexpr StateKind kind = StateKind::ServeConfig;
  static void validate(const ServeConfig& c) { ukv::validate(c); }
};

}  // namespace ukv
