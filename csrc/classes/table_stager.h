// TableStager: the persistent staging buffers of the KV manager's per-step
// tables, at fixed addresses so a captured CUDA/HIP graph can read them.
//
// tables: [max_num_seqs, num_tables, columns] int32 (core/manager/staged_tables.h).
// copies: [max_copies, 3] int32 row copies (src_row, dst_row, rows) grouped
//         by phase, and copy_counts [RowSpace::kMaxCopyPhases] int32, the
//         copies of each phase: the row-space layout's moves, which
//         ukv.apply_row_copies applies before the step reads the rows.
// Each is pinned on the host when a device is given, with a device mirror.
//
// Row-major [seq, table, column] makes rows 0..n-1 of every table one
// contiguous range, so the tables' upload is a single non-blocking copy. The
// host never rewrites pinned memory while a copy may still read it: stage()
// first waits for the event recorded after the last upload.
// While it lives, both table buffers are registered with their layout
// (ops/staged_layouts.h), so the index ops check the constants they are
// given against the tables they read.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <optional>

#include "ops/staged_layouts.h"

namespace ukv::ops {

class TableStager {
 public:
  TableStager(int64_t max_num_seqs, int64_t num_tables, int64_t columns, int64_t max_copies,
              std::optional<at::Device> device, StagedLayout layout);
  ~TableStager();
  TableStager(const TableStager&) = delete;  // the registration names this object's buffers
  TableStager& operator=(const TableStager&) = delete;

  const at::Tensor& host() const { return host_; }
  // The tables kernels read: the device mirror, or the host buffer without a device.
  const at::Tensor& tables() const { return device_.defined() ? device_ : host_; }
  const at::Tensor& copies_host() const { return copies_host_; }
  const at::Tensor& counts_host() const { return counts_host_; }
  const at::Tensor& copies() const { return copies_device_.defined() ? copies_device_ : copies_host_; }
  const at::Tensor& copy_counts() const { return counts_device_.defined() ? counts_device_ : counts_host_; }
  std::optional<at::Device> device() const { return device_opt_; }

  // Blocks until no upload still reads the host buffer.
  void wait_until_writable();
  // Copies rows [0, rows) of the tables, and the copy list, host -> device on
  // the current stream (non-blocking).
  // Outside graph capture it records the event stage() waits on; inside a
  // capture the caller calls mark_uploaded() after each replay instead.
  void upload(int64_t rows);
  void mark_uploaded();

 private:
  void record_on_current_stream();

  std::optional<at::Device> device_opt_;
  at::Tensor host_, device_;
  at::Tensor copies_host_, copies_device_, counts_host_, counts_device_;
  std::optional<c10::Event> uploaded_;
};

}  // namespace ukv::ops
