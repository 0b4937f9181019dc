// Host launchers of the index kernels: raw parameters, a stream, no torch.
// Each enqueues one kernel (none when there is no work; apply_row_copies one
// per copy phase), allocates
// nothing and never synchronises, so it can be captured in a CUDA/HIP graph.
// Grids depend only on the sizes in the parameters (the captured maximum);
// real counts are read by the kernels from device memory. The returned error is
// the launch status (kSuccess when nothing was launched).
#pragma once

#include "kernels/compat.h"
#include "kernels/index_params.h"

namespace ukv::kernels {

gpu::Error launch_csa_translate_pack(const CsaTranslatePackParams& p, gpu::Stream stream);
gpu::Error launch_paged_decode_indices(const PagedDecodeParams& p, gpu::Stream stream);
gpu::Error launch_hca_decode_indices(const HcaDecodeParams& p, gpu::Stream stream);
gpu::Error launch_paged_prefill_indices(const PagedPrefillParams& p, gpu::Stream stream);
gpu::Error launch_decode_index_metadata(const DecodeMetadataParams& p, gpu::Stream stream);
gpu::Error launch_prefill_index_metadata(const PrefillMetadataParams& p, gpu::Stream stream);
gpu::Error launch_swa_slot_mapping(const SwaSlotMappingParams& p, gpu::Stream stream);
// One launch per copy phase (the only op that enqueues more than one kernel).
gpu::Error launch_apply_row_copies(const RowCopyParams& p, gpu::Stream stream);
// gather_rows and scatter_rows (p.rows.to_buffer says which), every layer in one launch.
gpu::Error launch_transfer_rows(const LayerRowTransferParams& p, gpu::Stream stream);

}  // namespace ukv::kernels
