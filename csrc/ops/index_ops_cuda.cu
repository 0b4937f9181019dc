// GPU implementations of the index-building ops: validate (shared with the
// CPU path), then one launch on the current stream of the outputs' device. No
// allocation, no host synchronisation, grids from shapes only, so every op can
// be captured in a CUDA/HIP graph. On ROCm torch hipifies this file and the
// dispatch key stays CUDA.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "kernels/index_launchers.h"
#include "ops/index_ops.h"

namespace ukv::ops {
namespace {

using namespace ukv::kernels;

gpu::Error launch(const CsaTranslatePackParams& p, gpu::Stream s) { return launch_csa_translate_pack(p, s); }
gpu::Error launch(const PagedDecodeParams& p, gpu::Stream s) { return launch_paged_decode_indices(p, s); }
gpu::Error launch(const HcaDecodeParams& p, gpu::Stream s) { return launch_hca_decode_indices(p, s); }
gpu::Error launch(const PagedPrefillParams& p, gpu::Stream s) { return launch_paged_prefill_indices(p, s); }
gpu::Error launch(const DecodeMetadataParams& p, gpu::Stream s) { return launch_decode_index_metadata(p, s); }
gpu::Error launch(const PrefillMetadataParams& p, gpu::Stream s) { return launch_prefill_index_metadata(p, s); }
gpu::Error launch(const SwaSlotMappingParams& p, gpu::Stream s) { return launch_swa_slot_mapping(p, s); }
gpu::Error launch(const RowCopyParams& p, gpu::Stream s) { return launch_apply_row_copies(p, s); }
gpu::Error launch(const LayerRowTransferParams& p, gpu::Stream s) { return launch_transfer_rows(p, s); }

struct CudaBackend {
  static constexpr c10::DeviceType kDeviceType = c10::DeviceType::CUDA;

  template <class Params>
  static void run(const Params& p, const at::Tensor& anchor) {
    const c10::cuda::CUDAGuard device_guard(anchor.device());
    const gpu::Error err = launch(p, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == gpu::kSuccess, "ukv index kernel launch failed: ", gpu::error_string(err));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(ukv, CUDA, m) { register_index_ops<CudaBackend>(m); }

}  // namespace ukv::ops
