// The records of the core (ServeConfig, PoolSizes, ModelKvSpec, KvPlan) as
// dispatcher ops: their field descriptions, from which ukv_torch builds its
// Python classes, their defaults, and their validation. A record crosses into
// Python and back in its serialised form (core/config/record.h).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ukv::ops {

// (names, kinds, docs, choices): choices is the comma-joined names of a
// choice field, empty for the others.
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, std::vector<std::string>>
record_fields(const std::string& record);
std::vector<int64_t> record_defaults(const std::string& record);
// Decodes and validates; a ValueError names the field.
void validate_record(const std::string& record, const std::vector<int64_t>& encoded);

// plan_kv_layout on serialised records: (budget, ModelKvSpec, ServeConfig) -> KvPlan.
std::vector<int64_t> plan_kv_layout(int64_t budget_bytes, const std::vector<int64_t>& model,
                                    const std::vector<int64_t>& config);

// The staged tables of a manager with this (serialised) ServeConfig.
std::vector<int64_t> staged_tables_shape(const std::vector<int64_t>& config);
int64_t staged_table_index(const std::vector<int64_t>& config, const std::string& table);

}  // namespace ukv::ops
