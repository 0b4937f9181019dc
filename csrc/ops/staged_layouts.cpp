#include "ops/staged_layouts.h"

#include <mutex>
#include <unordered_map>

namespace ukv::ops {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, StagedLayout> layouts;
};

Registry& registry() {
  static Registry r;  // lives as long as the library: stagers unregister in their destructors
  return r;
}

}  // namespace

void register_staged_tables(const void* storage, StagedLayout layout) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.layouts[storage] = layout;
}

void unregister_staged_tables(const void* storage) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.layouts.erase(storage);
}

std::optional<StagedLayout> staged_layout(const void* storage) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.layouts.find(storage);
  if (it == r.layouts.end()) return std::nullopt;
  return it->second;
}

}  // namespace ukv::ops
