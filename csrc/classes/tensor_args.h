// Validation of the host-side tensor arguments of the torch classes: a 1-D
// CPU tensor of ids, counts or token ids. Errors name the argument.
#pragma once

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "core/hashing/cache_key.h"

namespace ukv::ops {

// int64 ids or counts (any strides; returned contiguous).
inline at::Tensor int64_arg(const at::Tensor& t, const char* arg) {
  // Python None arrives as an undefined tensor, which has no dtype to report.
  TORCH_CHECK_VALUE(t.defined(), arg, " must be a 1-D int64 CPU tensor, got None");
  TORCH_CHECK_VALUE(t.dim() == 1, arg, " must be a 1-D tensor, got ", t.dim(), " dims");
  TORCH_CHECK_VALUE(t.scalar_type() == at::kLong, arg, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor, got ", t.device());
  return t.contiguous();
}

// Token ids as int32 (int32 or int64 input), each in [min_value, int32 max].
// Plain loops, no ATen ops: this runs on every decode step, where a reduction
// plus .item() would cost more than the manager's own work.
inline at::Tensor token_arg(const at::Tensor& t, const char* arg, int64_t min_value = 0) {
  TORCH_CHECK_VALUE(t.defined(), arg, " must be a 1-D int32/int64 CPU tensor, got None");
  TORCH_CHECK_VALUE(t.dim() == 1, arg, " must be a 1-D tensor, got ", t.dim(), " dims");
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, arg,
                    " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor, got ", t.device());
  const at::Tensor in = t.contiguous();
  const int64_t n = in.numel();
  auto check = [&](int64_t v) {
    TORCH_CHECK_VALUE(v >= min_value && v <= std::numeric_limits<int32_t>::max(), arg, " values must be in [",
                      min_value, ", 2^31 - 1], got ", v);
  };
  if (in.scalar_type() == at::kInt) {
    const int32_t* p = in.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) check(p[i]);
    return in;
  }
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kInt));
  const int64_t* p = in.data_ptr<int64_t>();
  int32_t* q = out.data_ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    check(p[i]);
    q[i] = static_cast<int32_t>(p[i]);
  }
  return out;
}

// Prefix-cache keys: int64 [n] under xxh64 (the unsigned bits), [n, 2] under
// sha256 and blake2b (each key's lo and hi words).
inline std::vector<CacheKey> keys_arg(const at::Tensor& t, PrefixHash kind, const char* arg) {
  const bool wide = key_words(kind) == 2;
  TORCH_CHECK_VALUE(t.defined(), arg, " must be an int64 CPU tensor, got None");
  TORCH_CHECK_VALUE(t.dim() == (wide ? 2 : 1) && (!wide || t.size(1) == 2), arg, " must be ",
                    wide ? "[n, 2] (the lo and hi words of each " : "[n] (each ", prefix_hash_name(kind),
                    " key), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == at::kLong, arg, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor, got ", t.device());
  const at::Tensor c = t.contiguous();
  return keys_from_words(c.data_ptr<int64_t>(), static_cast<size_t>(c.numel()), kind, arg);
}

// The keys as keys_arg takes them.
inline at::Tensor keys_tensor(const std::vector<CacheKey>& keys, PrefixHash kind) {
  const std::vector<int64_t> words = keys_to_words(keys.data(), keys.size(), kind);
  at::Tensor out = at::tensor(at::ArrayRef<int64_t>(words), at::TensorOptions().dtype(at::kLong));
  return key_words(kind) == 2 ? out.view({-1, 2}) : out;
}

inline void require_same_length(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK_VALUE(a.numel() == b.numel(), a_name, " and ", b_name, " must have the same length, got ", a.numel(),
                    " and ", b.numel());
}

}  // namespace ukv::ops
