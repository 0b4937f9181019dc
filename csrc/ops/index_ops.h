// Dispatcher entry points of the index-building ops, written once for every
// backend: each is a boxed kernel (op_args.h) that validates its arguments
// with the op's check function (index_checks.h) and hands the raw parameters
// to Backend::run(params, anchor), where anchor is the first output, which
// fixes the device. Backend supplies kDeviceType, the device type its tensors
// must be on. A backend file (index_ops_cpu.cpp, index_ops_cuda.cu) supplies
// the run overloads and calls register_index_ops<Backend> from its
// TORCH_LIBRARY_IMPL block. The schemas come from index_op_args.h.
#pragma once

#include <torch/library.h>

#include "ops/index_checks.h"
#include "ops/index_op_args.h"

namespace ukv::ops {

inline const at::Tensor& anchor(const CsaTranslatePack::Args& a) { return a.kv_indices; }
inline const at::Tensor& anchor(const PagedDecodeIndices::Args& a) { return a.swa_indices; }
inline const at::Tensor& anchor(const HcaDecodeIndices::Args& a) { return a.hca_indices; }
inline const at::Tensor& anchor(const PagedPrefillIndices::Args& a) { return a.hca_indices; }
inline const at::Tensor& anchor(const DecodeIndexMetadata::Args& a) { return a.swa_indptr; }
inline const at::Tensor& anchor(const PrefillIndexMetadata::Args& a) { return a.extend_indptr; }
inline const at::Tensor& anchor(const SwaSlotMapping::Args& a) { return a.slot_mapping; }
inline const at::Tensor& anchor(const ApplyRowCopies::Args& a) { return a.copies; }
inline const at::Tensor& anchor(const GatherRows::Args& a) { return a.buffer; }
inline const at::Tensor& anchor(const ScatterRows::Args& a) { return a.buffer; }

template <class Backend, class Op>
void run_index_op(const typename Op::Args& a) {
  Backend::run(check(Backend::kDeviceType, a), anchor(a));
}

template <class Backend, class Op>
void register_index_op(torch::Library& m) {
  m.impl(Op::name, torch::CppFunction::makeFromBoxedFunction<&boxed_kernel<Op, &run_index_op<Backend, Op>>>());
}

template <class Backend>
void register_index_ops(torch::Library& m) {
  register_index_op<Backend, CsaTranslatePack>(m);
  register_index_op<Backend, PagedDecodeIndices>(m);
  register_index_op<Backend, HcaDecodeIndices>(m);
  register_index_op<Backend, PagedPrefillIndices>(m);
  register_index_op<Backend, DecodeIndexMetadata>(m);
  register_index_op<Backend, PrefillIndexMetadata>(m);
  register_index_op<Backend, SwaSlotMapping>(m);
  register_index_op<Backend, ApplyRowCopies>(m);
  register_index_op<Backend, GatherRows>(m);
  register_index_op<Backend, ScatterRows>(m);
}

}  // namespace ukv::ops
