// Host launchers of the tier objects' checksum kernels: raw parameters, a
// stream, no torch. Two launches (the payload sums, then one thread per
// object); the sums must be zeroed before. Neither allocates nor synchronises.
#pragma once

#include "kernels/compat.h"
#include "kernels/object_checksum.h"

namespace ukv::kernels {

gpu::Error launch_object_checksums(const ObjectChecksumParams& p, gpu::Stream stream);

}  // namespace ukv::kernels
