// The eager fast path of the index ops (ukv_torch/ops.py). A call through
// torch.ops spends most of its host time in Python: the OpOverload frame and
// the schema-driven conversion of every argument (with keyword matching), about
// 3 us on a 2-core server CPU against ~0.3 us for an ATen in-place op. This
// converts positional arguments straight to IValues and makes the same boxed
// dispatcher call, so every dispatch key (autograd fallback, tracing, dispatch
// modes, profiling) still applies.
//
// The GIL is released for calls that compute on the CPU and kept for device
// calls, which only enqueue a kernel (computes_on_host below).
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

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python/eager_calls.h"

namespace ukv::python {
namespace {

// An op's handle, resolved once and owned by the capsule that carries it.
constexpr const char* kCapsuleName = "ukv_torch.EagerOp";

void destroy_handle(PyObject* capsule) {
  delete static_cast<c10::OperatorHandle*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

std::optional<int64_t> to_int(PyObject* obj) {
  if (!PyLong_CheckExact(obj)) return std::nullopt;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0) return std::nullopt;
  return static_cast<int64_t>(v);
}

// A list or tuple of exact ints (int[]) or exact tensors (Tensor[]).
std::optional<c10::IValue> to_list(PyObject* obj, c10::TypeKind element) {
  if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj)) return std::nullopt;
  PyObject* seq = obj;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  if (element == c10::TypeKind::IntType) {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      const std::optional<int64_t> v = to_int(items[i]);
      if (!v) return std::nullopt;
      out.push_back(*v);
    }
    return c10::IValue(out);
  }
  if (element == c10::TypeKind::TensorType) {
    std::vector<at::Tensor> out;
    out.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!THPVariable_CheckExact(items[i])) return std::nullopt;
      out.push_back(THPVariable_Unpack(items[i]));
    }
    return c10::IValue(out);
  }
  return std::nullopt;
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
      const std::optional<int64_t> v = to_int(obj);
      if (!v) return std::nullopt;
      return c10::IValue(*v);
    }
    case c10::TypeKind::ListType:
      return to_list(obj, inner->castRaw<c10::ListType>()->getElementType()->kind());
    default:
      return std::nullopt;
  }
}

// Whether the call does its work on the CPU (the CPU kernels: up to
// milliseconds for a large prefill), so that other Python threads should run
// meanwhile. A device call only enqueues a kernel, and releasing and retaking
// the GIL around that costs about half a microsecond, a tenth of the call;
// the ops check that every tensor is on one device, so the first decides.
bool computes_on_host(const torch::jit::Stack& stack) {
  for (const c10::IValue& v : stack) {
    if (v.isTensor()) return v.toTensor().is_cpu();
    if (v.isTensorList() && !v.toTensorList().empty()) return v.toTensorList().get(0).is_cpu();
  }
  return true;
}

PyObject* resolve(PyObject* /*self*/, PyObject* name) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(PyUnicode_Check(name), "eager_op_handle: expected an op name such as 'ukv::csa_translate_pack'");
  const std::string qualified = PyUnicode_AsUTF8(name);
  auto op = std::make_unique<c10::OperatorHandle>(
      c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), ""));
  PyObject* capsule = PyCapsule_New(op.get(), kCapsuleName, destroy_handle);
  if (capsule != nullptr) op.release();
  return capsule;
  END_HANDLE_TH_ERRORS
}

// eager_call(handle, args_tuple) -> bool: True when the op ran here. A
// METH_FASTCALL function, so that the call itself builds no argument tuple.
PyObject* call(PyObject* /*self*/, PyObject* const* py_args, Py_ssize_t num_args) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(num_args == 2 && PyTuple_Check(py_args[1]), "eager_call(handle, args): expected 2 arguments, ",
                   "the second a tuple");
  auto* op = static_cast<const c10::OperatorHandle*>(PyCapsule_GetPointer(py_args[0], kCapsuleName));
  if (op == nullptr) {
    PyErr_Clear();
    TORCH_CHECK_TYPE(false, "eager_call: the handle must come from eager_op_handle, got ", Py_TYPE(py_args[0])->tp_name);
  }
  PyObject* args = py_args[1];
  const auto& schema_args = op->schema().arguments();
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (at::impl::torch_function_mode_enabled() || n != static_cast<Py_ssize_t>(schema_args.size())) Py_RETURN_FALSE;
  torch::jit::Stack stack;
  stack.reserve(schema_args.size());
  for (Py_ssize_t i = 0; i < n; ++i) {
    std::optional<c10::IValue> v = to_ivalue(PyTuple_GET_ITEM(args, i), schema_args[static_cast<size_t>(i)].type());
    if (!v) Py_RETURN_FALSE;
    stack.push_back(std::move(*v));
  }
  if (computes_on_host(stack)) {
    const pybind11::gil_scoped_release no_gil;
    op->callBoxed(stack);
  } else {
    op->callBoxed(stack);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"eager_op_handle", resolve, METH_O, "eager_op_handle(qualified_name) -> capsule: a handle for eager_call"},
    {"eager_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
     "eager_call(handle, args) -> bool: run the op on positional args; False = use torch.ops instead"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyMethodDef* eager_call_methods() { return methods; }

}  // namespace ukv::python
