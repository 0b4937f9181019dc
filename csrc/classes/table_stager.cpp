#include "classes/table_stager.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "core/row_space/row_space.h"

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

TableStager::TableStager(int64_t max_num_seqs, int64_t num_tables, int64_t columns, int64_t max_copies,
                         std::optional<at::Device> device, StagedLayout layout)
    : device_opt_(device) {
  const bool on_device = device.has_value() && !device->is_cpu();
  const auto host_buffer = [&](std::vector<int64_t> shape) {
    return at::zeros(shape, at::TensorOptions().dtype(at::kInt).pinned_memory(on_device));
  };
  const auto device_buffer = [&](std::vector<int64_t> shape) {
    return on_device ? at::zeros(shape, at::TensorOptions().dtype(at::kInt).device(*device)) : at::Tensor();
  };
  host_ = host_buffer({max_num_seqs, num_tables, columns});
  device_ = device_buffer({max_num_seqs, num_tables, columns});
  copies_host_ = host_buffer({max_copies, 3});
  copies_device_ = device_buffer({max_copies, 3});
  counts_host_ = host_buffer({RowSpace::kMaxCopyPhases});
  counts_device_ = device_buffer({RowSpace::kMaxCopyPhases});
  for (const at::Tensor* t : {&host_, &device_})
    if (t->defined() && t->storage().data() != nullptr) register_staged_tables(t->storage().data(), layout);
}

TableStager::~TableStager() {
  for (const at::Tensor* t : {&host_, &device_})
    if (t->defined() && t->storage().data() != nullptr) unregister_staged_tables(t->storage().data());
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
  if (!device_.defined()) return;
  if (rows > 0) device_.narrow(0, 0, rows).copy_(host_.narrow(0, 0, rows), /*non_blocking=*/true);
  if (copies_host_.size(0) > 0) copies_device_.copy_(copies_host_, /*non_blocking=*/true);
  counts_device_.copy_(counts_host_, /*non_blocking=*/true);
  if (!capturing()) record_on_current_stream();
}

void TableStager::mark_uploaded() {
  if (device_.defined()) record_on_current_stream();
}

}  // namespace ukv::ops
