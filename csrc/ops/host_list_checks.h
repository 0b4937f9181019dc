// Row-copy and row-run lists handed over on the host are checked entry by
// entry before anything is copied: an entry outside its tensors, or entries
// that write the same rows (or bytes) or overwrite rows another entry of the
// same phase reads, are refused naming the entry. A list on the device is not
// read by the host (that would synchronise): there the kernels skip an entry
// outside the tensors, and overlapping writes are the caller's to avoid.
#pragma once

#include "kernels/index_params.h"

namespace ukv::ops {

void check_host_copies(const kernels::RowCopyParams& p);
void check_host_runs(const char* op, const kernels::LayerRowTransferParams& p);
// Scatter targets of several layers: no two of them may share memory (each
// layer's runs write the same rows of its own tensors).
void check_disjoint_tensors(const char* op, const char* tensors_name, const kernels::LayerRowTransferParams& p);

}  // namespace ukv::ops
