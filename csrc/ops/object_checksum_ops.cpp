// Validation and the CPU implementation of seal_objects / verify_objects.
#include "ops/object_checksum_ops.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "core/common/ceil_div.h"

namespace ukv::ops {

using kernels::kChecksumChunkBytes;
using kernels::kObjectHeaderBytes;
using kernels::kObjectSignedWords;
using kernels::ObjectSpan;

CheckedObjects check_objects(const char* op, c10::DeviceType device_type, const at::Tensor& buffer,
                             const at::Tensor& objects, bool seal) {
  TORCH_CHECK(buffer.device().type() == device_type, op, ": buffer must be on ", device_type, ", got ",
              buffer.device());
  TORCH_CHECK_TYPE(buffer.scalar_type() == at::kByte, op, ": buffer must be uint8, got ", buffer.scalar_type());
  TORCH_CHECK_VALUE(buffer.dim() == 1 && (buffer.numel() <= 1 || buffer.stride(0) == 1), op,
                    ": buffer must be a contiguous 1-D tensor, got ", buffer.sizes(), " with strides ",
                    buffer.strides());
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(buffer.data_ptr()) % 16 == 0, op,
                    ": buffer must start on a 16-byte boundary (a slice of a tier staging buffer at an object's "
                    "offset is)");
  TORCH_CHECK(objects.device().is_cpu(), op, ": objects must be a host (cpu) tensor, got ", objects.device());
  TORCH_CHECK_TYPE(objects.scalar_type() == at::kLong, op, ": objects must be int64, got ", objects.scalar_type());
  TORCH_CHECK_VALUE(objects.dim() == 2 && objects.size(1) == 1 + kObjectSignedWords && objects.is_contiguous() &&
                        objects.size(0) <= std::numeric_limits<int32_t>::max(),
                    op, ": objects must be a contiguous [n, 7] tensor (offset, then the 6 signed header words), got ",
                    objects.sizes(), " with strides ", objects.strides());
  const int64_t n = objects.size(0), size = buffer.numel();
  const int64_t* rows = objects.data_ptr<int64_t>();
  CheckedObjects out;
  out.spans.resize(static_cast<size_t>(n));
  out.chunk_starts.resize(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    ObjectSpan& s = out.spans[static_cast<size_t>(i)];
    s.offset = rows[i * 7];
    std::memcpy(s.header, rows + i * 7 + 1, sizeof(s.header));
    const uint64_t payload = kernels::payload_bytes(s);
    TORCH_CHECK_VALUE(s.offset >= 0 && s.offset % 16 == 0, op, ": objects[", i,
                      "]: the offset must be >= 0 and a multiple of 16, got ", s.offset);
    TORCH_CHECK_VALUE(payload <= static_cast<uint64_t>(size) &&
                          s.offset <= size - kObjectHeaderBytes - static_cast<int64_t>(payload),
                      op, ": objects[", i, "]: the object (64-byte header and ", payload,
                      " payload bytes) at offset ", s.offset, " must lie inside the buffer of ", size, " bytes");
    out.chunk_starts[static_cast<size_t>(i) + 1] =
        out.chunk_starts[static_cast<size_t>(i)] + ceil_div(static_cast<int64_t>(payload), kChecksumChunkBytes);
  }
  TORCH_CHECK_VALUE(out.chunk_starts.back() <= std::numeric_limits<int32_t>::max(), op,
                    ": the payloads must be below 2^31 chunks of 64 KiB in all");
  if (seal) {  // the headers written must not land in another object
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const ObjectSpan& s : out.spans)
      ranges.emplace_back(s.offset, s.offset + kObjectHeaderBytes + static_cast<int64_t>(kernels::payload_bytes(s)));
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      TORCH_CHECK_VALUE(ranges[i].first >= ranges[i - 1].second, op,
                        ": objects must not overlap, got one at offset ", ranges[i].first,
                        " inside the one that starts at ", ranges[i - 1].first);
  }
  return out;
}

namespace {

// Every chunk's lanes in parallel (as the GPU's blocks), then per object in order.
std::vector<kernels::ChecksumLanes> payload_lanes(const uint8_t* buffer, const CheckedObjects& c) {
  const int64_t chunks = c.chunk_starts.back();
  std::vector<kernels::ChecksumLanes> per_chunk(static_cast<size_t>(chunks), {0, 0});
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    size_t o = static_cast<size_t>(std::upper_bound(c.chunk_starts.begin(), c.chunk_starts.end(), begin) -
                                   c.chunk_starts.begin()) - 1;
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      while (c.chunk_starts[o + 1] <= chunk) ++o;
      const ObjectSpan& s = c.spans[o];
      const uint8_t* payload = buffer + s.offset + kObjectHeaderBytes;
      const uint64_t bytes = kernels::payload_bytes(s);
      const uint64_t first = static_cast<uint64_t>(chunk - c.chunk_starts[o]) * kChecksumChunkBytes;
      const uint64_t last = std::min<uint64_t>(first + kChecksumChunkBytes, bytes);
      kernels::ChecksumLanes lanes{0, 0};
      for (uint64_t at = first; at < last; at += 8) {
        uint64_t word = 0;
        if (last - at >= 8) std::memcpy(&word, payload + at, 8);  // little-endian hosts
        else word = kernels::partial_word(payload + at, last - at);
        kernels::add_word(lanes, word, kObjectSignedWords + at / 8);
      }
      per_chunk[static_cast<size_t>(chunk)] = lanes;
    }
  });
  std::vector<kernels::ChecksumLanes> per_object(c.spans.size(), {0, 0});
  for (size_t o = 0; o < c.spans.size(); ++o)
    for (int64_t chunk = c.chunk_starts[o]; chunk < c.chunk_starts[o + 1]; ++chunk) {
      per_object[o].a += per_chunk[static_cast<size_t>(chunk)].a;
      per_object[o].b += per_chunk[static_cast<size_t>(chunk)].b;
    }
  return per_object;
}

void seal_objects_cpu(at::Tensor& buffer, const at::Tensor& objects) {
  const CheckedObjects c = check_objects("seal_objects", c10::DeviceType::CPU, buffer, objects, true);
  auto* bytes = static_cast<uint8_t*>(buffer.data_ptr());
  const std::vector<kernels::ChecksumLanes> lanes = payload_lanes(bytes, c);
  for (size_t o = 0; o < c.spans.size(); ++o) {
    uint64_t checksum[2];
    kernels::finish_checksum(c.spans[o], lanes[o], checksum);
    std::memcpy(bytes + c.spans[o].offset, c.spans[o].header, sizeof(c.spans[o].header));
    std::memcpy(bytes + c.spans[o].offset + kernels::kObjectChecksumOffset, checksum, sizeof(checksum));
  }
}

at::Tensor verify_objects_cpu(const at::Tensor& buffer, const at::Tensor& objects) {
  const CheckedObjects c = check_objects("verify_objects", c10::DeviceType::CPU, buffer, objects, false);
  const auto* bytes = static_cast<const uint8_t*>(buffer.data_ptr());
  const std::vector<kernels::ChecksumLanes> lanes = payload_lanes(bytes, c);
  at::Tensor ok = at::empty({static_cast<int64_t>(c.spans.size())}, buffer.options().dtype(at::kBool));
  bool* out = ok.data_ptr<bool>();
  for (size_t o = 0; o < c.spans.size(); ++o) {
    uint64_t checksum[2];
    kernels::finish_checksum(c.spans[o], lanes[o], checksum);
    const uint8_t* header = bytes + c.spans[o].offset;
    out[o] = std::memcmp(header, c.spans[o].header, sizeof(c.spans[o].header)) == 0 &&
             std::memcmp(header + kernels::kObjectChecksumOffset, checksum, sizeof(checksum)) == 0;
  }
  return ok;
}

}  // namespace

TORCH_LIBRARY_IMPL(ukv, CPU, m) {
  m.impl("seal_objects", &seal_objects_cpu);
  m.impl("verify_objects", &verify_objects_cpu);
}

}  // namespace ukv::ops
