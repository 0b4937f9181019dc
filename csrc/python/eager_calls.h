// Python methods of ukv_torch._C: the eager fast path of the index ops
// (eager_calls.cpp).
#pragma once

#include <Python.h>

namespace ukv::python {

// The method table ({nullptr} terminated) of eager_op_handle / eager_call.
PyMethodDef* eager_call_methods();

}  // namespace ukv::python
