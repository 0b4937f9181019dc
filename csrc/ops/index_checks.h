// Input validation of the index-building ops: one function per op, shared by
// the CPU and the GPU implementation. Each checks dtype, device, dimensions,
// sizes, strides and scalar ranges, and returns the raw kernel parameters.
// device_type is the backend's (CPU or CUDA): a tensor elsewhere is refused by
// name, rather than read through a pointer of the wrong kind.
// Data values are not inspected on the GPU (that would need a host sync); the
// kernels are written so that no value can make them access memory out of
// bounds (csrc/kernels/index_formulas.h). On the host the row-copy and
// row-run lists are checked entry by entry (host_list_checks.h).
//
// A failure names the op, the argument and the expectation: TypeError for a
// wrong dtype, RuntimeError for a wrong device, ValueError for the rest.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/index_params.h"
#include "ops/index_op_args.h"

namespace ukv::ops {

kernels::CsaTranslatePackParams check(c10::DeviceType device_type, const CsaTranslatePack::Args& a);
kernels::PagedDecodeParams check(c10::DeviceType device_type, const PagedDecodeIndices::Args& a);
kernels::HcaDecodeParams check(c10::DeviceType device_type, const HcaDecodeIndices::Args& a);
kernels::PagedPrefillParams check(c10::DeviceType device_type, const PagedPrefillIndices::Args& a);
kernels::DecodeMetadataParams check(c10::DeviceType device_type, const DecodeIndexMetadata::Args& a);
kernels::PrefillMetadataParams check(c10::DeviceType device_type, const PrefillIndexMetadata::Args& a);
kernels::SwaSlotMappingParams check(c10::DeviceType device_type, const SwaSlotMapping::Args& a);
kernels::RowCopyParams check(c10::DeviceType device_type, const ApplyRowCopies::Args& a);
kernels::LayerRowTransferParams check(c10::DeviceType device_type, const GatherRows::Args& a);
kernels::LayerRowTransferParams check(c10::DeviceType device_type, const ScatterRows::Args& a);

}  // namespace ukv::ops
