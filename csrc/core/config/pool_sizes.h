// PoolSizes: how many blocks and slots a KV manager's pools hold, the part of
// its configuration that a plan (kv_plan) derives from a byte budget rather
// than the engine's serving parameters (ServeConfig).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/record.h"
#include "core/config/serve_config.h"

namespace ukv {

struct PoolSizes {
  int64_t num_logical_blocks = 0;
  int64_t num_swa_blocks = 0;
  std::vector<int64_t> type_slots;
  int64_t total_rows = 0;
  int64_t envelope_rows = 0;
  int64_t swa_unit_rows = 0;

  // The fields, once, in their serialised order (core/config/record.h).
  template <class Self, class Visitor>
  static void visit_fields(Self& p, Visitor&& v) {
    v.integer("num_logical_blocks", p.num_logical_blocks,
              "logical compress blocks: the prefix-cache space shared by every compress layer and the indexer");
    v.integer("num_swa_blocks", p.num_swa_blocks, "slot layouts: SWA blocks, one slot each in every layer tensor");
    v.integers("type_slots", p.type_slots,
               "unified slot layouts: slots of each compress type's tensor; empty = slot_counts(num_swa_blocks, "
               "num_logical_blocks)");
    v.integer("total_rows", p.total_rows, "row_space: rows of the one row space (every plane)");
    v.integer("envelope_rows", p.envelope_rows,
              "row_space: rows of an envelope (every compress layer's rows and the indexer for one logical block)");
    v.integer("swa_unit_rows", p.swa_unit_rows, "row_space: rows of an SWA unit (one page of every layer)");
  }
};


// Ranges alone; validate(config, pools) checks them against a configuration.
void validate(const PoolSizes& p);
// Throws InvalidArgument naming the field; fills nothing in.
void validate(const ServeConfig& c, const PoolSizes& p);
// The pools as the manager uses them: type_slots resolved to the default slot
// counts when empty (unified slot layouts); in the row-space layout the
// logical blocks and SWA pages are what the row space holds of each kind
// (num_logical_blocks and num_swa_blocks given as 0 are derived).
PoolSizes resolved(const ServeConfig& c, const PoolSizes& p);

template <>
struct RecordTraits<PoolSizes> {
  static constexpr const char* name = "PoolSizes";
  static constexpr StateKind kind = StateKind::PoolSizes;
  static void validate(const PoolSizes& p) { ukv::validate(p); }
};

}  // namespace ukv
