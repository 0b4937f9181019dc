// swa_slot_mapping: the SWA row each new token's KV is written at, through
// the SWA table and one layer class's row constants (SwaRows), for an
// engine's SWA writer: -1 for a padding token and for a position whose page
// the sequence does not hold (a prefill chunk writes only the positions the
// manager gave pages, see KvManager::ensure_for_tokens), which the writer
// skips. One thread per token.
#pragma once

#include <cstdint>

#include "kernels/compat.h"
#include "kernels/index_formulas.h"

namespace ukv::kernels {

template <int kThreads>
__global__ void swa_slot_mapping_kernel(SwaSlotMappingParams p) {
  gpu::after_prior_kernels();
  const int32_t t = static_cast<int32_t>(blockIdx.x) * kThreads + static_cast<int32_t>(threadIdx.x);
  if (t < p.num_tokens) p.out[t] = swa_slot_of(p, t);
}

}  // namespace ukv::kernels
