// GPU implementations of seal_objects / verify_objects: validate on the host
// (ops/object_checksum_ops.h), copy the objects' descriptors to the device
// through pinned memory (no host sync), zero the sums, launch on the current
// stream.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstring>

#include "kernels/object_checksum_launchers.h"
#include "ops/object_checksum_ops.h"

namespace ukv::ops {
namespace {

// The spans, then the chunk prefix, in one device tensor that lives until the kernels ran.
at::Tensor device_descriptors(const CheckedObjects& c, const at::Device& device) {
  const size_t span_bytes = c.spans.size() * sizeof(kernels::ObjectSpan);
  const size_t total = span_bytes + c.chunk_starts.size() * sizeof(int64_t);
  at::Tensor host = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  auto* bytes = static_cast<uint8_t*>(host.data_ptr());
  std::memcpy(bytes, c.spans.data(), span_bytes);
  std::memcpy(bytes + span_bytes, c.chunk_starts.data(), c.chunk_starts.size() * sizeof(int64_t));
  return host.to(device, /*non_blocking=*/true);  // the pinned block is kept until the copy ran
}

void run(at::Tensor& buffer, const CheckedObjects& c, uint8_t* ok) {
  const c10::cuda::CUDAGuard guard(buffer.device());
  const int64_t n = static_cast<int64_t>(c.spans.size());
  if (n == 0) return;
  const at::Tensor descriptors = device_descriptors(c, buffer.device());
  const at::Tensor sums = at::zeros({n, 2}, buffer.options().dtype(at::kLong));
  kernels::ObjectChecksumParams p{};
  p.buffer = static_cast<uint8_t*>(buffer.data_ptr());
  p.spans = reinterpret_cast<const kernels::ObjectSpan*>(descriptors.data_ptr());
  p.chunk_starts = reinterpret_cast<const int64_t*>(static_cast<const uint8_t*>(descriptors.data_ptr()) +
                                                    n * sizeof(kernels::ObjectSpan));
  p.sums = reinterpret_cast<unsigned long long*>(sums.data_ptr());
  p.ok = ok;
  p.num_objects = static_cast<int32_t>(n);
  p.num_chunks = c.chunk_starts.back();
  const gpu::Error err = kernels::launch_object_checksums(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == gpu::kSuccess, "ukv object checksum kernel launch failed: ", gpu::error_string(err));
}

void seal_objects_cuda(at::Tensor& buffer, const at::Tensor& objects) {
  run(buffer, check_objects("seal_objects", c10::DeviceType::CUDA, buffer, objects, true), nullptr);
}

at::Tensor verify_objects_cuda(const at::Tensor& buffer, const at::Tensor& objects) {
  const CheckedObjects c = check_objects("verify_objects", c10::DeviceType::CUDA, buffer, objects, false);
  at::Tensor ok = at::empty({static_cast<int64_t>(c.spans.size())}, buffer.options().dtype(at::kBool));
  at::Tensor target = buffer;  // read only: the verify kernel writes `ok` alone
  run(target, c, reinterpret_cast<uint8_t*>(ok.data_ptr()));
  return ok;
}

}  // namespace

TORCH_LIBRARY_IMPL(ukv, CUDA, m) {
  m.impl("seal_objects", &seal_objects_cuda);
  m.impl("verify_objects", &verify_objects_cuda);
}

}  // namespace ukv::ops
