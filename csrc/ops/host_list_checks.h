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
// Scatter targets of several layers: tensor k of two layers may not start at
// the same address (every run naming k would write the same bytes for both).
// Views of one plane at different base rows, as the row space's layers are,
// pass: on the host check_host_runs compares the bytes the runs write, and on
// the device keeping them apart is the caller's, as for one layer's runs.
void check_distinct_targets(const char* op, const char* tensors_name, const kernels::LayerRowTransferParams& p);

}  // namespace ukv::ops
