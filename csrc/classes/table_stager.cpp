#include "classes/table_stager.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#ifdef UKV_WITH_GPU
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace ukv::ops {
namespace {

bool capturing() {
#ifdef UKV_WITH_GPU
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

}  // namespace

TableStager::TableStager(int64_t max_num_seqs, int64_t num_tables, int64_t max_blocks_per_seq,
                         std::optional<at::Device> device)
    : device_opt_(device) {
  const std::vector<int64_t> shape = {max_num_seqs, num_tables, max_blocks_per_seq};
  const bool on_device = device.has_value() && !device->is_cpu();
  host_ = at::zeros(shape, at::TensorOptions().dtype(at::kInt).pinned_memory(on_device));
  if (on_device) device_ = at::zeros(shape, at::TensorOptions().dtype(at::kInt).device(*device));
}

void TableStager::wait_until_writable() {
  if (uploaded_) uploaded_->synchronize();
}

void TableStager::record_on_current_stream() {
  const at::Device device = device_.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  if (!uploaded_) uploaded_.emplace(device.type());
  uploaded_->record(impl.getStream(device));
}

void TableStager::upload(int64_t rows) {
  TORCH_CHECK_VALUE(rows >= 0 && rows <= host_.size(0), "upload: rows must be in [0, max_num_seqs=", host_.size(0),
                    "], got ", rows);
  if (!device_.defined() || rows == 0) return;
  device_.narrow(0, 0, rows).copy_(host_.narrow(0, 0, rows), /*non_blocking=*/true);
  if (!capturing()) record_on_current_stream();
}

void TableStager::mark_uploaded() {
  if (device_.defined()) record_on_current_stream();
}

}  // namespace ukv::ops
