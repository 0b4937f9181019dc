// Validation of the host-side tensor arguments of the torch classes: a 1-D
// CPU tensor of ids, counts or token ids. Errors name the argument.
#pragma once

#include <ATen/ATen.h>

#include <limits>

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
inline at::Tensor token_arg(const at::Tensor& t, const char* arg, int64_t min_value = 0) {
  TORCH_CHECK_VALUE(t.defined(), arg, " must be a 1-D int32/int64 CPU tensor, got None");
  TORCH_CHECK_VALUE(t.dim() == 1, arg, " must be a 1-D tensor, got ", t.dim(), " dims");
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, arg,
                    " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, " must be a CPU tensor, got ", t.device());
  if (t.numel() > 0) {
    const auto [lo, hi] = at::aminmax(t);
    TORCH_CHECK_VALUE(lo.item<int64_t>() >= min_value && hi.item<int64_t>() <= std::numeric_limits<int32_t>::max(),
                      arg, " values must be in [", min_value, ", 2^31 - 1], got [", lo.item<int64_t>(), ", ",
                      hi.item<int64_t>(), "]");
  }
  return t.to(at::kInt).contiguous();
}

inline void require_same_length(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK_VALUE(a.numel() == b.numel(), a_name, " and ", b_name, " must have the same length, got ", a.numel(),
                    " and ", b.numel());
}

}  // namespace ukv::ops
