#include "ops/record_ops.h"

#include <c10/util/Exception.h>

#include "core/config/kv_plan.h"
#include "core/manager/staged_tables.h"
#include "ops/core_errors.h"

namespace ukv::ops {
namespace {

// Calls fn.template operator()<R>() for the record named `record`.
template <typename F>
decltype(auto) with_record(const std::string& record, F&& fn) {
  if (record == RecordTraits<ServeConfig>::name) return fn(ServeConfig{});
  if (record == RecordTraits<PoolSizes>::name) return fn(PoolSizes{});
  if (record == RecordTraits<ModelKvSpec>::name) return fn(ModelKvSpec{});
  if (record == RecordTraits<KvPlan>::name) return fn(KvPlan{});
  TORCH_CHECK_VALUE(false, "unknown record '", record, "' (known: ServeConfig, PoolSizes, ModelKvSpec, KvPlan)");
}

}  // namespace

std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, std::vector<std::string>>
record_fields(const std::string& record) {
  return with_record(record, [](auto tag) {
    std::vector<std::string> names, kinds, docs, choices;
    for (const auto& f : describe_record<decltype(tag)>()) {
      names.push_back(f.name);
      kinds.push_back(f.kind);
      docs.push_back(f.doc);
      std::string joined;
      for (const auto& c : f.choices) joined += (joined.empty() ? "" : ",") + c;
      choices.push_back(joined);
    }
    return std::make_tuple(names, kinds, docs, choices);
  });
}

std::vector<int64_t> record_defaults(const std::string& record) {
  return with_record(record, [](auto tag) { return encode_record(tag); });
}

void validate_record(const std::string& record, const std::vector<int64_t>& encoded) {
  with_record(record, [&](auto tag) {
    translate_core_errors([&] { decode_record<decltype(tag)>(encoded); });
    return 0;
  });
}

std::vector<int64_t> plan_kv_layout(int64_t budget_bytes, const std::vector<int64_t>& model,
                                    const std::vector<int64_t>& config) {
  return translate_core_errors([&] {
    return encode_record(
        ukv::plan_kv_layout(budget_bytes, decode_record<ModelKvSpec>(model), decode_record<ServeConfig>(config)));
  });
}

std::vector<int64_t> staged_tables_shape(const std::vector<int64_t>& config) {
  return translate_core_errors([&] {
    const StagedTablesShape s = ukv::staged_tables_shape(decode_record<ServeConfig>(config));
    return std::vector<int64_t>{s.rows, s.tables, s.cols};
  });
}

int64_t staged_table_index(const std::vector<int64_t>& config, const std::string& table) {
  return translate_core_errors([&] { return ukv::staged_table_index(decode_record<ServeConfig>(config), table); });
}

}  // namespace ukv::ops
