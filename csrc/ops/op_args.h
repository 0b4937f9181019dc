// Ops described once. An op's arguments are one list, UKV_<OP>_ARGS(X), of
// X(kind, name, default) entries in schema order; from it come
//   - the schema bindings.cpp registers (op_schema<Op>()),
//   - the struct of typed arguments its check function takes (Op::Args),
//   - the boxed kernel that fills that struct from the dispatcher's stack
//     (boxed_kernel<Op, Backend>),
// so no argument list is written twice in C++, and an order the checks and
// kernels disagree with cannot compile. The Python wrappers (ukv_torch/ops.py)
// and fake kernels (ukv_torch/_fake_ops.py) are checked against the registered
// schema when ukv_torch is imported.
//
// Kinds: In (Tensor), OptIn (Tensor?), OutA..OutE (Tensor(x!), written in
// place), OptOutB/OptOutC (Tensor(x!)?), InList (Tensor[]), OutListA (Tensor(a!)[]), Int (int),
// OptInt (int?) and OptInts (int[]?). Every entry after the first int-like
// one is keyword-only, as in the schemas.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ukv::ops {

struct In { using type = at::Tensor; static constexpr const char* schema = "Tensor"; };
struct OptIn { using type = std::optional<at::Tensor>; static constexpr const char* schema = "Tensor?"; };
struct OutA { using type = at::Tensor; static constexpr const char* schema = "Tensor(a!)"; };
struct OutB { using type = at::Tensor; static constexpr const char* schema = "Tensor(b!)"; };
struct OutC { using type = at::Tensor; static constexpr const char* schema = "Tensor(c!)"; };
struct OutD { using type = at::Tensor; static constexpr const char* schema = "Tensor(d!)"; };
struct OutE { using type = at::Tensor; static constexpr const char* schema = "Tensor(e!)"; };
struct OptOutB { using type = std::optional<at::Tensor>; static constexpr const char* schema = "Tensor(b!)?"; };
struct OptOutC { using type = std::optional<at::Tensor>; static constexpr const char* schema = "Tensor(c!)?"; };
struct InList { using type = std::vector<at::Tensor>; static constexpr const char* schema = "Tensor[]"; };
struct OutListA { using type = std::vector<at::Tensor>; static constexpr const char* schema = "Tensor(a!)[]"; };
struct Int { using type = int64_t; static constexpr const char* schema = "int"; };
struct OptInt { using type = std::optional<int64_t>; static constexpr const char* schema = "int?"; };
struct OptInts { using type = std::optional<std::vector<int64_t>>; static constexpr const char* schema = "int[]?"; };

// One argument of a schema: its text and whether it is int-like (the first
// one starts the keyword-only part).
struct SchemaArg {
  std::string text;
  bool is_int;
};

template <class Kind>
SchemaArg schema_arg(const char* name, const char* default_value) {
  std::string text = std::string(Kind::schema) + " " + name;
  if (*default_value) text += std::string("=") + default_value;
  return {text, std::is_same<Kind, Int>::value || std::is_same<Kind, OptInt>::value ||
                    std::is_same<Kind, OptInts>::value};
}

// "name(args) -> ()" with "*" before the first int argument.
std::string make_schema(const char* name, const std::vector<SchemaArg>& args);

// One stack entry as the kind's C++ type.
inline void read_arg(const c10::IValue& v, at::Tensor& out) { out = v.toTensor(); }
inline void read_arg(const c10::IValue& v, std::optional<at::Tensor>& out) {
  out = v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor());
}
inline void read_arg(const c10::IValue& v, int64_t& out) { out = v.toInt(); }
inline void read_arg(const c10::IValue& v, std::vector<at::Tensor>& out) { out = v.toTensorVector(); }
inline void read_arg(const c10::IValue& v, std::optional<int64_t>& out) {
  out = v.isNone() ? std::nullopt : std::optional<int64_t>(v.toInt());
}
inline void read_arg(const c10::IValue& v, std::optional<std::vector<int64_t>>& out) {
  out = v.isNone() ? std::nullopt : std::optional<std::vector<int64_t>>(v.toIntVector());
}

#define UKV_OP_ARG_MEMBER(kind, name, default_value) typename kind::type name;
#define UKV_OP_ARG_SCHEMA(kind, name, default_value) schema_arg<kind>(#name, default_value),
#define UKV_OP_ARG_COUNT(kind, name, default_value) +1
#define UKV_OP_ARG_READ(kind, name, default_value) read_arg(torch::jit::peek(*stack, i++, kNumArgs), name);
// In a function taking `a` (an Args): a local name for each argument.
#define UKV_OP_ARG_BIND(kind, name, default_value) const auto& name = a.name;

// Declares struct <Op> with name, Args (the typed arguments), kNumArgs,
// schema() and read(stack).
#define UKV_DESCRIBE_OP(Op, op_name, ARGS)                                       \
  struct Op {                                                                    \
    static constexpr const char* name = op_name;                                 \
    struct Args {                                                                \
      ARGS(UKV_OP_ARG_MEMBER)                                                    \
      static constexpr size_t kNumArgs = 0 ARGS(UKV_OP_ARG_COUNT);              \
      void read(torch::jit::Stack* stack) {                                      \
        size_t i = 0;                                                            \
        ARGS(UKV_OP_ARG_READ)                                                    \
      }                                                                          \
    };                                                                           \
    static std::string schema() { return make_schema(name, {ARGS(UKV_OP_ARG_SCHEMA)}); } \
  };

// The kernel of an op returning nothing: the arguments off the stack, then
// Backend::run(check(args), anchor) as the index ops do (index_ops.h).
template <class Op, void (*Run)(const typename Op::Args&)>
void boxed_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  typename Op::Args args;
  args.read(stack);
  Run(args);
  torch::jit::drop(*stack, Op::Args::kNumArgs);
}

}  // namespace ukv::ops
