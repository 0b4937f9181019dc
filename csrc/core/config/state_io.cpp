#include "core/config/state_io.h"

namespace ukv {

const char* state_kind_name(StateKind kind) {
  switch (kind) {
    case StateKind::TypePool: return "TypePool";
    case StateKind::Coordinator: return "Coordinator";
    case StateKind::KvManager: return "KvManager";
    case StateKind::ServeConfig: return "ServeConfig";
    case StateKind::PoolSizes: return "PoolSizes";
    case StateKind::ModelKvSpec: return "ModelKvSpec";
    case StateKind::KvPlan: return "KvPlan";
  }
  return "unknown";
}

void begin_state(StateWriter& w, StateKind kind) {
  w.put(kStateMagic);
  w.put(static_cast<int64_t>(kind));
  w.put(kStateVersion);
}

StateReader open_state(const std::vector<int64_t>& state, StateKind kind) {
  StateReader r(state, std::string(state_kind_name(kind)) + " state");
  require(!state.empty() && state[0] == kStateMagic, r.what(),
          " has no format header: it was written by an older ukv_torch, whose states this build does not read; "
          "create the object afresh");
  r.next();
  const int64_t found = r.next();
  r.check(found == static_cast<int64_t>(kind), "this is a state of kind ", found, ", not of a ", state_kind_name(kind));
  const int64_t version = r.next();
  r.check(version == kStateVersion, "format version ", version, " is not the version ", kStateVersion,
          " this build reads; create the object afresh");
  return r;
}

}  // namespace ukv
