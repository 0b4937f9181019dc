// Launch configurations of the index kernels. Block sizes are multiples of 64
// so that every block is whole wavefronts on AMD CDNA as well as whole warps on
// NVIDIA. Compiled into the extension for GPU builds (setup.py) and on its own
// by `make gpu-compile-check` with nvcc and hipcc.
#include "kernels/index_launchers.h"

#include <algorithm>
#include <type_traits>

#include "kernels/csa_translate_pack.cuh"
#include "kernels/hca_decode_indices.cuh"
#include "kernels/index_metadata.cuh"
#include "kernels/paged_decode_indices.cuh"
#include "kernels/paged_prefill_indices.cuh"

namespace ukv::kernels {
namespace {

// Up to this many tokens a call is latency-bound: csa_translate_pack then uses
// small tiles (several blocks per token) so that a token's lanes are spread
// over more multiprocessors.
constexpr int32_t kSmallBatchTokens = 512;
// Blocks wanted in flight for a small batch, about two per multiprocessor on
// current data-centre GPUs; only used to split long per-token runs.
constexpr int32_t kTargetBlocks = 256;

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

template <int kThreads, int kVectors>
gpu::Error launch_csa_tiles(const CsaTranslatePackParams& p, gpu::Stream stream) {
  const dim3 grid(p.num_tokens, ceil_div(p.topk_width, kThreads * kVectors * 4));
  csa_translate_pack_kernel<kThreads, kVectors><<<grid, kThreads, 0, stream>>>(p);
  return gpu::last_launch_error();
}

}  // namespace

gpu::Error launch_csa_translate_pack(const CsaTranslatePackParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0 || p.topk_width == 0) return gpu::kSuccess;
  if (p.num_tokens <= kSmallBatchTokens) return launch_csa_tiles<64, 1>(p, stream);
  // Large batches are bandwidth-bound: 8 cells (two 16-byte loads) per thread
  // keep more bytes in flight per multiprocessor.
  return launch_csa_tiles<128, 2>(p, stream);
}

gpu::Error launch_paged_decode_indices(const PagedDecodeParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 256;
  constexpr int kGroup = 64;
  paged_decode_indices_kernel<kThreads, kGroup><<<ceil_div(p.num_tokens, kThreads / kGroup), kThreads, 0, stream>>>(p);
  return gpu::last_launch_error();
}

gpu::Error launch_hca_decode_indices(const HcaDecodeParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 256;
  constexpr int kGroup = 64;
  // A part of at least one full pass of the group's vector stores.
  const int64_t max_entries = static_cast<int64_t>(p.table.cols) * p.rows_per_block.value;
  const int32_t useful_parts = ceil_div(max_entries, 4 * kGroup);
  const int32_t wanted_parts = kTargetBlocks * (kThreads / kGroup) / p.num_tokens;
  const int32_t parts = std::max(1, std::min(useful_parts, wanted_parts));
  const int32_t blocks = ceil_div(static_cast<int64_t>(p.num_tokens) * parts, kThreads / kGroup);
  hca_decode_indices_kernel<kThreads, kGroup><<<blocks, kThreads, 0, stream>>>(p, parts);
  return gpu::last_launch_error();
}

gpu::Error launch_paged_prefill_indices(const PagedPrefillParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 256;
  constexpr int kGroup = 64;
  paged_prefill_indices_kernel<kThreads, kGroup><<<ceil_div(p.num_tokens, kThreads / kGroup), kThreads, 0, stream>>>(p);
  return gpu::last_launch_error();
}

namespace {
// Blocks a metadata call spreads over, at most (about one per multiprocessor):
// past that, segments grow by whole passes instead, bounding the redundant
// segment-offset work at num_tokens * kMetadataMaxBlocks / 2 evaluations.
constexpr int32_t kMetadataMaxBlocks = 128;

struct MetadataGrid {
  int32_t threads;  // a power of two in [kMetadataRakers, kMetadataMaxThreads]
  int32_t segment;  // tokens per block, a multiple of threads
  int32_t blocks;
};

// The fewest threads that cover the tokens in one pass, then one segment of
// that many tokens per block; see index_metadata.cuh.
MetadataGrid metadata_grid(int32_t num_tokens) {
  int32_t threads = kMetadataRakers;
  while (threads < num_tokens && threads < kMetadataMaxThreads) threads *= 2;
  const int32_t passes = std::max(1, ceil_div(ceil_div(num_tokens, threads), kMetadataMaxBlocks));
  const int32_t segment = passes * threads;
  return {threads, segment, std::max(1, ceil_div(num_tokens, segment))};
}

// Calls launch(std::integral_constant<int, threads>, grid) for num_tokens' grid.
template <typename Launch>
gpu::Error launch_metadata(int32_t num_tokens, const Launch& launch) {
  const MetadataGrid g = metadata_grid(num_tokens);
  switch (g.threads) {
    case 128: launch(std::integral_constant<int, 128>{}, g); break;
    case 256: launch(std::integral_constant<int, 256>{}, g); break;
    case 512: launch(std::integral_constant<int, 512>{}, g); break;
    default: launch(std::integral_constant<int, kMetadataMaxThreads>{}, g); break;
  }
  return gpu::last_launch_error();
}
}  // namespace

gpu::Error launch_decode_index_metadata(const DecodeMetadataParams& p, gpu::Stream stream) {
  return launch_metadata(p.num_tokens, [&](auto threads, const MetadataGrid& g) {
    decode_index_metadata_kernel<threads()><<<g.blocks, threads(), 0, stream>>>(p, g.segment);
  });
}

gpu::Error launch_prefill_index_metadata(const PrefillMetadataParams& p, gpu::Stream stream) {
  return launch_metadata(p.num_tokens, [&](auto threads, const MetadataGrid& g) {
    prefill_index_metadata_kernel<threads()><<<g.blocks, threads(), 0, stream>>>(p, g.segment);
  });
}

}  // namespace ukv::kernels
