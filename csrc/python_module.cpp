// ukv_torch._C is a plain shared library of torch registrations (bindings.cpp
// and the TORCH_LIBRARY_IMPL blocks beside the kernels). Python only needs an
// importable module object so that `import ukv_torch._C` runs the static
// registrars; it exposes nothing itself.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "ukv_torch registrations (use torch.ops.ukv / torch.classes.ukv)", -1, nullptr};
  return PyModule_Create(&module);
}
