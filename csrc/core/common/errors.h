// Error types of the torch-free core. The ATen/torchbind glue translates them:
// InvalidArgument -> ValueError-like TORCH_CHECK failures, StateError and
// OutOfSlots -> RuntimeError (the Python drop-ins re-raise OutOfSlots as
// ukv_torch.OutOfSlots). Every throwing operation leaves its object unchanged.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ukv {

// A caller passed a value outside the documented domain (bad constructor
// argument, id out of range, wrong length).
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A well-formed request that contradicts the current state: double free,
// freeing an id the caller does not hold, claiming a slot that is not free.
struct StateError : std::logic_error {
  using std::logic_error::logic_error;
};

// The pool has no room for the request. Messages keep the upstream texts
// ("No free SWA slots available", "No free KV slots available") at the start.
struct OutOfSlots : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

template <typename E = InvalidArgument, typename... Args>
inline void require(bool ok, Args&&... args) {
  if (!ok) throw E(detail::concat(std::forward<Args>(args)...));
}

}  // namespace ukv
