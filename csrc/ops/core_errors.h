// Translation of the torch-free core's exceptions into torch errors, so that
// Python sees ValueError for bad arguments and RuntimeError for state errors
// and exhaustion, with the core's message unchanged.
#pragma once

#include <c10/util/Exception.h>

#include <utility>

#include "core/common/errors.h"

namespace ukv::ops {

template <typename F>
decltype(auto) translate_core_errors(F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const ukv::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const ukv::StateError& e) {
    TORCH_CHECK(false, e.what());
  } catch (const ukv::OutOfSlots& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace ukv::ops
