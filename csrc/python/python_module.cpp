// ukv_torch._C is a shared library of torch registrations (bindings.cpp and
// the TORCH_LIBRARY_IMPL blocks beside the kernels); importing it runs the
// static registrars. Its only Python methods are fast paths around the Python
// binding layers: eager index-op calls (eager_calls.cpp), allocator batch
// calls (batch_calls.cpp) and int lists as tensors (int_lists.cpp); everything
// else is torch.ops.ukv / torch.classes.ukv.
#include <Python.h>

#include <vector>

#include "python/batch_calls.h"
#include "python/eager_calls.h"
#include "python/int_lists.h"

namespace {

std::vector<PyMethodDef>& module_methods() {
  static std::vector<PyMethodDef> all;
  for (PyMethodDef* table :
       {ukv::python::eager_call_methods(), ukv::python::batch_call_methods(), ukv::python::int_list_methods()})
    for (PyMethodDef* m = table; m->ml_name != nullptr; ++m) all.push_back(*m);
  all.push_back({nullptr, nullptr, 0, nullptr});
  return all;
}

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "ukv_torch registrations (use torch.ops.ukv / torch.classes.ukv)",
                               -1, module_methods().data()};
  return PyModule_Create(&module);
}
