// seal_objects and verify_objects: the checksums of KV tier objects
// (kernels/object_checksum.h) over a byte buffer on the CPU or a GPU.
//
// `objects` is a host int64 [n, 7] tensor, a row per object: its offset in
// the buffer, then the 6 header words the checksum covers (word 1: the
// payload's bytes). seal_objects writes each object's header and checksum in
// front of its payload; verify_objects answers, per object, whether the
// buffer holds that header and the payload's checksum (a bool [n] tensor on
// the buffer's device). They allocate (descriptors, sums), so they are not
// for graph capture: the tiers call them between steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/object_checksum.h"

namespace ukv::ops {

struct CheckedObjects {
  std::vector<kernels::ObjectSpan> spans;
  std::vector<int64_t> chunk_starts;  // [n + 1]: each object's first chunk of the payload, then the total
};

// The one validation of both ops, on the host, before anything is read or
// written: names the argument and the expectation (TypeError, RuntimeError
// for a device, ValueError for the rest). `seal` also refuses overlapping objects.
CheckedObjects check_objects(const char* op, c10::DeviceType device_type, const at::Tensor& buffer,
                             const at::Tensor& objects, bool seal);

}  // namespace ukv::ops
