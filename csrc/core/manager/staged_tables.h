// The staged tables: the per-step block tables a KvManager writes for the
// kernels, one int32 tensor [max_num_seqs, tables, columns]. Table 0 is the
// logical table, 1 the SWA table (a column per SWA page), then the physical
// compress tables: one per compress type, in ServeConfig.compress_ratios
// order, or in the row-space layout the one envelope table every compress
// type reads. Every part of ukv_torch that addresses a table goes through
// these functions.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/serve_config.h"

namespace ukv {

constexpr int64_t kLogicalTable = 0;
constexpr int64_t kSwaTable = 1;
// The physical table of compress type t.
constexpr int64_t phys_table_index(int64_t type) { return 2 + type; }

struct StagedTablesShape {
  int64_t rows, tables, cols;
};

StagedTablesShape staged_tables_shape(const ServeConfig& c);

// "logical", "swa", a compress ratio ("4", "128") or, in the row-space
// layout, "envelope"; InvalidArgument otherwise.
int64_t staged_table_index(const ServeConfig& c, const std::string& name);

}  // namespace ukv
