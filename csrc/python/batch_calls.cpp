// The allocator's batch methods straight from CPython (ukv_torch.BatchCalls).
// A torchbind method call from Python costs ~1.6 us whatever it does (method
// lookup, schema matching, IValue boxing), several times the core's work for a
// 16-block batch. Here a capsule holds the holder itself, arguments are read
// with the C API, and the call is the holder's own locked batch method: the
// same validation, all-or-nothing behaviour, errors and thread safety as the
// torchbind methods, at ~0.1 us per call.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <string>

#include "python/batch_calls.h"
#include "classes/allocator_classes.h"
#include "classes/tensor_args.h"

namespace ukv::python {
namespace {

using ops::BatchRole;
using ops::CoordinatorHolder;
using ops::TypePoolHolder;

constexpr const char* kCapsuleName = "ukv_torch.BatchTarget";

// One of the two holders, kept alive by the capsule.
struct BatchTarget {
  c10::intrusive_ptr<TypePoolHolder> pool;
  c10::intrusive_ptr<CoordinatorHolder> coordinator;

  std::vector<int64_t> alloc_n(BatchRole role, int64_t type, int64_t n) const {
    return pool ? pool->alloc_n(role, type, n) : coordinator->alloc_n(role, type, n);
  }
  void alloc_into(BatchRole role, int64_t type, int64_t n, int64_t* out) const {
    pool ? pool->alloc_into(role, type, n, out) : coordinator->alloc_into(role, type, n, out);
  }
  void free_many(BatchRole role, int64_t type, const int64_t* ids, int64_t n) const {
    pool ? pool->free_many(role, type, ids, n) : coordinator->free_many(role, type, ids, n);
  }
};

void destroy_target(PyObject* capsule) {
  delete static_cast<BatchTarget*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

// batch_target(script_object) -> capsule
PyObject* make_target(PyObject* /*self*/, PyObject* obj) {
  HANDLE_TH_ERRORS
  const c10::IValue value = torch::jit::toIValue(obj, c10::AnyType::get());
  TORCH_CHECK_TYPE(value.isObject(), "BatchCalls: expected a torch.classes.ukv.TypePool or Coordinator, got ",
                   Py_TYPE(obj)->tp_name);
  const std::string name = value.toObjectRef().type()->name()->qualifiedName();
  auto target = std::make_unique<BatchTarget>();
  if (name == "__torch__.torch.classes.ukv.TypePool") {
    target->pool = value.toCustomClass<TypePoolHolder>();
  } else if (name == "__torch__.torch.classes.ukv.Coordinator") {
    target->coordinator = value.toCustomClass<CoordinatorHolder>();
  } else {
    TORCH_CHECK_TYPE(false, "BatchCalls: expected a torch.classes.ukv.TypePool or Coordinator, got ", name);
  }
  PyObject* capsule = PyCapsule_New(target.get(), kCapsuleName, destroy_target);
  if (capsule != nullptr) target.release();
  return capsule;
  END_HANDLE_TH_ERRORS
}

struct Call {
  const BatchTarget* target;
  BatchRole role;
  int64_t type;
};

// The common leading arguments (capsule, role, type).
bool parse_call(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t expected, const char* fn, Call* call) {
  if (nargs != expected) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", fn, expected, nargs);
    return false;
  }
  auto* target = static_cast<BatchTarget*>(PyCapsule_GetPointer(args[0], kCapsuleName));
  if (target == nullptr) return false;
  const long long role = PyLong_AsLongLong(args[1]);
  const long long type = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) return false;
  if (role != 0 && role != 1) {
    PyErr_Format(PyExc_ValueError, "%s: role must be 0 (SWA) or 1 (compress), got %lld", fn, role);
    return false;
  }
  *call = {target, static_cast<BatchRole>(role), static_cast<int64_t>(type)};
  return true;
}

// batch_alloc(capsule, role, type, n) -> int64 tensor of n new ids
PyObject* alloc(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Call call{};
  if (!parse_call(args, nargs, 4, "batch_alloc", &call)) return nullptr;
  const long long n = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return nullptr;
  const std::vector<int64_t> ids = call.target->alloc_n(call.role, call.type, n);
  at::Tensor out = at::empty({static_cast<int64_t>(ids.size())}, at::TensorOptions().dtype(at::kLong));
  if (!ids.empty()) std::memcpy(out.data_ptr<int64_t>(), ids.data(), ids.size() * sizeof(int64_t));
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

// batch_alloc_into(capsule, role, type, out) -> None: out.numel() new ids into
// the caller's int64 tensor (a persistent buffer saves the tensor allocation,
// which costs more than a small batch itself)
PyObject* alloc_into(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Call call{};
  if (!parse_call(args, nargs, 4, "batch_alloc_into", &call)) return nullptr;
  TORCH_CHECK_TYPE(THPVariable_Check(args[3]), "out must be a 1-D int64 CPU tensor, got ", Py_TYPE(args[3])->tp_name);
  const at::Tensor& out = THPVariable_Unpack(args[3]);
  TORCH_CHECK_VALUE(out.dim() == 1 && out.scalar_type() == at::kLong && out.device().is_cpu() && out.is_contiguous(),
                    "out must be a contiguous 1-D int64 CPU tensor, got ", out.scalar_type(), " ", out.sizes(), " on ",
                    out.device(), out.is_contiguous() ? "" : " (not contiguous)");
  call.target->alloc_into(call.role, call.type, out.numel(), out.data_ptr<int64_t>());
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// batch_free(capsule, role, type, ids) -> None
PyObject* free_ids(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Call call{};
  if (!parse_call(args, nargs, 4, "batch_free", &call)) return nullptr;
  TORCH_CHECK_TYPE(THPVariable_Check(args[3]), "ids must be a 1-D int64 CPU tensor, got ", Py_TYPE(args[3])->tp_name);
  const at::Tensor ids = ops::int64_arg(THPVariable_Unpack(args[3]), "ids");
  call.target->free_many(call.role, call.type, ids.data_ptr<int64_t>(), ids.numel());
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"batch_target", make_target, METH_O, "batch_target(torch.classes.ukv.TypePool | Coordinator) -> capsule"},
    {"batch_alloc", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(alloc)), METH_FASTCALL,
     "batch_alloc(target, role, type, n) -> int64 tensor of n new ids (all or nothing)"},
    {"batch_alloc_into", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(alloc_into)), METH_FASTCALL,
     "batch_alloc_into(target, role, type, out) -> None: fill out with new ids (all or nothing)"},
    {"batch_free", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(free_ids)), METH_FASTCALL,
     "batch_free(target, role, type, ids) -> None (validated first)"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyMethodDef* batch_call_methods() { return methods; }

}  // namespace ukv::python
