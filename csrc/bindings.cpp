// The one TORCH_LIBRARY(ukv, m): every torch class and every op schema of
// ukv_torch, in one readable place. Kernels attach per backend with
// TORCH_LIBRARY_IMPL(ukv, CPU|CUDA, m) next to their code in csrc/ops/.
#include <torch/library.h>

TORCH_LIBRARY(ukv, m) {
}
