// ukv_torch._C is a shared library of torch registrations (bindings.cpp and
// the TORCH_LIBRARY_IMPL blocks beside the kernels); importing it runs the
// static registrars. Its only Python methods are the eager fast path of the
// index ops (eager_calls.cpp); everything else is torch.ops.ukv / torch.classes.ukv.
#include <Python.h>

#include "eager_calls.h"

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "ukv_torch registrations (use torch.ops.ukv / torch.classes.ukv)",
                               -1, ukv::python::eager_call_methods()};
  return PyModule_Create(&module);
}
