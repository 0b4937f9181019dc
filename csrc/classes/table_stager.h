// TableStager: the persistent staging buffers of the KV manager's per-step
// tables, at fixed addresses so a captured CUDA/HIP graph can read them.
//
// host:   [max_num_seqs, num_tables, max_blocks_per_seq] int32, pinned when a
//         device is given; table 0 = logical, 1 = SWA, 2.. = one per compress type.
// device: the same shape on the device (a mirror), or undefined without one.
//
// Row-major [seq, table, block] makes rows 0..n-1 of every table one
// contiguous range, so an upload is a single non-blocking copy. The host never
// rewrites the pinned buffer while a copy may still read it: stage() first
// waits for the event recorded after the last upload.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <optional>

namespace ukv::ops {

class TableStager {
 public:
  TableStager(int64_t max_num_seqs, int64_t num_tables, int64_t max_blocks_per_seq, std::optional<at::Device> device);

  const at::Tensor& host() const { return host_; }
  // The tables kernels read: the device mirror, or the host buffer without a device.
  const at::Tensor& tables() const { return device_.defined() ? device_ : host_; }
  std::optional<at::Device> device() const { return device_opt_; }

  // Blocks until no upload still reads the host buffer.
  void wait_until_writable();
  // Copies rows [0, rows) host -> device on the current stream (non-blocking).
  // Outside graph capture it records the event stage() waits on; inside a
  // capture the caller calls mark_uploaded() after each replay instead.
  void upload(int64_t rows);
  void mark_uploaded();

 private:
  void record_on_current_stream();

  std::optional<at::Device> device_opt_;
  at::Tensor host_, device_;
  std::optional<c10::Event> uploaded_;
};

}  // namespace ukv::ops
