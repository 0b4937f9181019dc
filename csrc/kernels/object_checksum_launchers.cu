// Launch configuration of the tier objects' checksum kernels. Compiled into the
// extension for GPU builds (setup.py) and on its own by `make gpu-compile-check`.
#include "kernels/object_checksum_launchers.h"

#include "core/common/ceil_div.h"
#include "kernels/object_checksums.cuh"

namespace ukv::kernels {

gpu::Error launch_object_checksums(const ObjectChecksumParams& p, gpu::Stream stream) {
  if (p.num_objects == 0) return gpu::kSuccess;
  if (p.num_chunks > 0) {
    const gpu::Error err = gpu::launch(object_sums_kernel<kChecksumThreads>, static_cast<unsigned>(p.num_chunks),
                                       kChecksumThreads, stream, p);
    if (err != gpu::kSuccess) return err;
  }
  constexpr int32_t kThreads = 64;
  return gpu::launch(object_checksums_kernel, static_cast<unsigned>(ceil_div(p.num_objects, kThreads)), kThreads,
                     stream, p);
}

}  // namespace ukv::kernels
