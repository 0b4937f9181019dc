// Python methods of ukv_torch._C: the allocator's batch methods called
// straight from CPython (batch_calls.cpp).
#pragma once

#include <Python.h>

namespace ukv::python {

// The method table ({nullptr} terminated) of batch_target / batch_alloc / batch_free.
PyMethodDef* batch_call_methods();

}  // namespace ukv::python
