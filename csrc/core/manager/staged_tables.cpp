#include "core/manager/staged_tables.h"

#include "core/common/errors.h"

namespace ukv {

StagedTablesShape staged_tables_shape(const ServeConfig& c) {
  return {c.max_num_seqs, phys_table_index(c.num_phys_tables()), c.table_cols()};
}

int64_t staged_table_index(const ServeConfig& c, const std::string& name) {
  if (name == "logical") return kLogicalTable;
  if (name == "swa") return kSwaTable;
  if (c.row_space() && name == "envelope") return phys_table_index(0);
  for (int64_t t = 0; t < c.num_types(); ++t)  // row space: every compress type reads the envelope table
    if (name == std::to_string(c.compress_ratios[static_cast<size_t>(t)])) return phys_table_index(c.row_space() ? 0 : t);
  std::string known = c.row_space() ? "'logical', 'swa', 'envelope'" : "'logical', 'swa'";
  for (int64_t r : c.compress_ratios) known += ", " + std::to_string(r);
  throw InvalidArgument("table must be one of " + known + " (compress tables are named by their ratio), got '" +
                        name + "'");
}

}  // namespace ukv
