// Several work items per block, kGroup threads each. Per-token work in the
// index kernels is often a few hundred cells, too little for a whole block:
// with one token per block most of a multiprocessor's resident threads would
// idle while each token waits on its dependent loads. kGroup is a multiple of
// 64, so that a group is whole warps on NVIDIA and a whole wavefront on AMD
// CDNA, and threads of a group never need to synchronise with another group.
#pragma once

#include <cstdint>

#include "kernels/compat.h"

namespace ukv::kernels {

struct ThreadGroup {
  int32_t item;  // which work item this thread's group serves
  int32_t lane;  // this thread's index inside its group
};

template <int kThreads, int kGroup>
UKV_DEVICE ThreadGroup thread_group() {
  static_assert(kGroup % 64 == 0 && kThreads % kGroup == 0, "groups must be whole wavefronts and tile the block");
  const int32_t tid = threadIdx.x;
  return {static_cast<int32_t>(blockIdx.x) * (kThreads / kGroup) + tid / kGroup, tid % kGroup};
}

}  // namespace ukv::kernels
