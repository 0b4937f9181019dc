// The one TORCH_LIBRARY(ukv, m): every torch class and every op schema of
// ukv_torch, in one readable place. Kernels attach per backend with
// TORCH_LIBRARY_IMPL(ukv, CPU|CUDA, m) next to their code in csrc/ops/.
#include <torch/library.h>

#include "ops/sizing_ops.h"

TORCH_LIBRARY(ukv, m) {
  // ---- sizing (no tensors; one C++ source for pools and tensors) ----------
  m.def("slot_counts(int num_swa_blocks, int num_compress_blocks, int[] ks, int block_size=128) -> int[]",
        &ukv::ops::slot_counts);
  m.def("layer_rows(int compress_ratio, int num_swa_blocks, int num_compress_blocks, int block_size=128, "
        "bool unified=True) -> int",
        &ukv::ops::layer_rows);
  m.def("layer_rows_for_slots(int compress_ratio, int type_slots, int num_swa_blocks, int block_size=128) -> int",
        &ukv::ops::layer_rows_for_slots);
  m.def("compress_base_row(bool unified, int num_swa_blocks, int block_size=128) -> int",
        &ukv::ops::compress_base_row);
}
