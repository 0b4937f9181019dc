// Python methods of ukv_torch._C: a list of Python ints as an int64 tensor in
// one pass (int_lists.cpp).
#pragma once

#include <Python.h>

namespace ukv::python {

// The method table ({nullptr} terminated) of int64_tensor.
PyMethodDef* int_list_methods();

}  // namespace ukv::python
