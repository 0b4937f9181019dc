// The eager fast path of the index ops (ukv_torch/ops.py). A call through
// torch.ops spends most of its host time in Python: the OpOverload frame and
// the schema-driven conversion of every argument (with keyword matching), about
// 3 us on a 2-core server CPU against ~0.3 us for an ATen in-place op. This
// converts positional arguments straight to IValues and makes the same boxed
// dispatcher call, so every dispatch key (autograd fallback, tracing, dispatch
// modes, profiling) still applies.
//
// What only the Python path can do, it keeps: a call whose tensors are not
// exactly torch.Tensor (subclasses, FakeTensor, proxies), made under a
// TorchFunctionMode, or whose arguments do not fit the schema, returns False,
// and the wrapper repeats it through torch.ops, which also raises its errors.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "eager_calls.h"

namespace ukv::python {
namespace {

// Handles resolved once per op; a deque so that handed-out indices stay valid.
struct Registry {
  std::mutex mutex;
  std::deque<c10::OperatorHandle> ops;
};

Registry& registry() {
  static Registry r;
  return r;
}

// One argument as the schema's type wants it, or nullopt when only the
// torch.ops path can take it.
std::optional<c10::IValue> to_ivalue(PyObject* obj, const c10::TypePtr& type) {
  const bool optional = type->kind() == c10::TypeKind::OptionalType;
  if (optional && obj == Py_None) return c10::IValue();
  const c10::TypePtr& inner = optional ? type->castRaw<c10::OptionalType>()->getElementType() : type;
  switch (inner->kind()) {
    case c10::TypeKind::TensorType:
      if (!THPVariable_CheckExact(obj)) return std::nullopt;
      return c10::IValue(THPVariable_Unpack(obj));
    case c10::TypeKind::IntType: {
      if (!PyLong_CheckExact(obj)) return std::nullopt;
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
      if (overflow != 0) return std::nullopt;
      return c10::IValue(static_cast<int64_t>(v));
    }
    default:
      return std::nullopt;
  }
}

PyObject* resolve(PyObject* /*self*/, PyObject* name) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(PyUnicode_Check(name), "eager_op_handle: expected an op name such as 'ukv::csa_translate_pack'");
  const std::string qualified = PyUnicode_AsUTF8(name);
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "");
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.ops.push_back(op);
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(r.ops.size() - 1));
  END_HANDLE_TH_ERRORS
}

const c10::OperatorHandle& op_at(Py_ssize_t index) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  TORCH_CHECK_INDEX(index >= 0 && index < static_cast<Py_ssize_t>(r.ops.size()), "eager_call: no op handle ",
                    index);
  return r.ops[static_cast<size_t>(index)];
}

// eager_call(handle, args_tuple) -> bool: True when the op ran here.
PyObject* call(PyObject* /*self*/, PyObject* py_args) {
  HANDLE_TH_ERRORS
  Py_ssize_t handle = 0;
  PyObject* args = nullptr;
  if (!PyArg_ParseTuple(py_args, "nO!", &handle, &PyTuple_Type, &args)) return nullptr;
  const c10::OperatorHandle& op = op_at(handle);
  const auto& schema_args = op.schema().arguments();
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (at::impl::torch_function_mode_enabled() || n != static_cast<Py_ssize_t>(schema_args.size())) Py_RETURN_FALSE;
  torch::jit::Stack stack;
  stack.reserve(schema_args.size());
  for (Py_ssize_t i = 0; i < n; ++i) {
    std::optional<c10::IValue> v = to_ivalue(PyTuple_GET_ITEM(args, i), schema_args[static_cast<size_t>(i)].type());
    if (!v) Py_RETURN_FALSE;
    stack.push_back(std::move(*v));
  }
  {
    const pybind11::gil_scoped_release no_gil;
    op.callBoxed(stack);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"eager_op_handle", resolve, METH_O, "eager_op_handle(qualified_name) -> int: a handle for eager_call"},
    {"eager_call", call, METH_VARARGS,
     "eager_call(handle, args) -> bool: run the op on positional args; False = use torch.ops instead"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyMethodDef* eager_call_methods() { return methods; }

}  // namespace ukv::python
