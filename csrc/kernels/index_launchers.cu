// Launch configurations of the index kernels. Block sizes are multiples of 64
// so that every block is whole wavefronts on AMD CDNA as well as whole warps on
// NVIDIA. Compiled into the extension for GPU builds (setup.py) and on its own
// by `make gpu-compile-check` with nvcc and hipcc.
#include "kernels/index_launchers.h"

#include <algorithm>
#include <type_traits>

#include "core/common/ceil_div.h"
#include "kernels/csa_translate_pack.cuh"
#include "kernels/hca_decode_indices.cuh"
#include "kernels/index_metadata.cuh"
#include "kernels/paged_decode_indices.cuh"
#include "kernels/paged_prefill_indices.cuh"
#include "kernels/row_copies.cuh"
#include "kernels/row_transfer.cuh"
#include "kernels/swa_slot_mapping.cuh"

namespace ukv::kernels {
namespace {

// Blocks wanted in flight for a small batch, about two per multiprocessor on
// current data-centre GPUs; only used to split long per-token runs.
constexpr int32_t kTargetBlocks = 256;

// A grid dimension: the launch sizes fit int32 (token counts are int32).
int32_t blocks_of(int64_t a, int64_t b) { return static_cast<int32_t>(ceil_div(a, b)); }

// Whether every output's SWA rows are the slot layouts' (one row for all).
bool all_plain(const SwaRows (&rows)[3]) {
  return is_plain(rows[0]) && is_plain(rows[1]) && is_plain(rows[2]) && rows[1].page.value == rows[0].page.value &&
         rows[2].page.value == rows[0].page.value;
}

// Calls launch(std::integral_constant<SwaForm, F>) with the SwaForm of a
// call's SWA rows (the outputs share rows[0]'s page).
template <typename Launch>
gpu::Error with_swa_form(const SwaRows (&rows)[3], const Launch& launch) {
  if (all_plain(rows)) return launch(std::integral_constant<SwaForm, SwaForm::kPlain>{});
  if (is_pow2(rows[0].page) && is_pow2(rows[0].group) && is_pow2(rows[1].group) && is_pow2(rows[2].group))
    return launch(std::integral_constant<SwaForm, SwaForm::kPow2>{});
  return launch(std::integral_constant<SwaForm, SwaForm::kGeneral>{});
}

template <int kThreads, int kVectors, SkipSource kSource>
gpu::Error launch_csa_tiles(const CsaTranslatePackParams& p, gpu::Stream stream) {
  constexpr int32_t kTileCells = kThreads * kVectors * 4;
  const dim3 grid(p.num_tokens, blocks_of(p.topk_width, kTileCells));
  const bool compact = is_compact(p.table);
  const bool vector_rows = topk_rows_vectorizable(p, kTileCells);
  if (compact && vector_rows) {
    return gpu::launch(csa_translate_pack_kernel<kThreads, kVectors, true, true, kSource>, grid, kThreads, stream, p);
  }
  if (compact) {
    return gpu::launch(csa_translate_pack_kernel<kThreads, kVectors, true, false, kSource>, grid, kThreads, stream, p);
  }
  return gpu::launch(csa_translate_pack_kernel<kThreads, kVectors, false, false, kSource>, grid, kThreads, stream, p);
}

template <int kThreads, int kVectors>
gpu::Error launch_csa_tiles(const CsaTranslatePackParams& p, gpu::Stream stream) {
  switch (skip_source(p)) {
    case SkipSource::kPerToken: return launch_csa_tiles<kThreads, kVectors, SkipSource::kPerToken>(p, stream);
    case SkipSource::kPositionsI64: return launch_csa_tiles<kThreads, kVectors, SkipSource::kPositionsI64>(p, stream);
    default: return launch_csa_tiles<kThreads, kVectors, SkipSource::kPositionsI32>(p, stream);
  }
}

}  // namespace

// Tile shapes from launch sweeps on an H200 (figures here; the 64 x 4 / 128 x 2
// comparison is also in benchmarks/RESULTS.md, "Tried, not kept"): a
// single token spreads its row over four 64-thread blocks; up to 2048 tokens a
// block of 256 threads takes a whole row (the shortest path per thread:
// 1.92 us against 2.04 for 128 x 2 at T = 512, 4.04 against 4.52 at 2048);
// beyond, 128 threads of 8 cells each, which keep more bytes in flight per
// multiprocessor: the fastest shape at 4096 (6.73 us against 7.13 for 256 x 1
// and 7.44 for 64 x 4). At 8192, 64 x 4 is about 3% faster (18.4 against
// 19.0); where the two cross between 4096 and 8192 is not measured, so one
// threshold serves both.
gpu::Error launch_csa_translate_pack(const CsaTranslatePackParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0 || p.topk_width == 0) return gpu::kSuccess;
  if (p.num_tokens == 1) return launch_csa_tiles<64, 1>(p, stream);
  if (p.num_tokens <= 2048) return launch_csa_tiles<256, 1>(p, stream);
  return launch_csa_tiles<128, 2>(p, stream);
}

// One 64-thread group per token (a window is 128 cells), two groups per block:
// the fastest of the block shapes measured for T = 64 to 4096. From
// kManyDecodeTokens tokens on, the blocks outnumber what fits at once, and
// the row-space forms run capped to ten blocks a multiprocessor (45-46
// registers a thread against 64-72): on an H100, T = 4096 in 4.18 against
// 4.35 us. Below, every thread's path is the time, and the cap cost T = 512 7%.
constexpr int32_t kManyDecodeTokens = 2048;

gpu::Error launch_paged_decode_indices(const PagedDecodeParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 128;
  constexpr int kGroup = 64;
  const int32_t blocks = blocks_of(p.num_tokens, kThreads / kGroup);
  const bool many = p.num_tokens >= kManyDecodeTokens;
  return with_swa_form(p.swa_rows, [&](auto form) {
    if constexpr (form() != SwaForm::kPlain) {
      if (many) return gpu::launch(paged_decode_indices_kernel<kThreads, kGroup, form(), 10>, blocks, kThreads, stream, p);
    }
    return gpu::launch(paged_decode_indices_kernel<kThreads, kGroup, form(), 0>, blocks, kThreads, stream, p);
  });
}

namespace {
// A token's HCA run is cut into parts of at least one full pass of a group's
// vector stores, enough parts to fill about kTargetBlocks blocks.
template <int kThreads, int kGroup>
gpu::Error launch_hca_groups(const HcaDecodeParams& p, gpu::Stream stream) {
  const int64_t max_entries = static_cast<int64_t>(p.table.cols) * p.rows_per_block.value;
  const int32_t useful_parts = blocks_of(max_entries, 4 * kGroup);
  const int32_t wanted_parts = kTargetBlocks * (kThreads / kGroup) / p.num_tokens;
  const int32_t parts = std::max(1, std::min(useful_parts, wanted_parts));
  const int32_t blocks = blocks_of(static_cast<int64_t>(p.num_tokens) * parts, kThreads / kGroup);
  return gpu::launch(hca_decode_indices_kernel<kThreads, kGroup>, blocks, kThreads, stream, p, parts);
}
}  // namespace

// A few tokens: whole 256-thread blocks per part (the run is long, the batch
// short); more: 64-thread groups, four per block. Measured on an H200.
gpu::Error launch_hca_decode_indices(const HcaDecodeParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  if (p.num_tokens <= 64) return launch_hca_groups<256, 256>(p, stream);
  return launch_hca_groups<256, 64>(p, stream);
}

gpu::Error launch_paged_prefill_indices(const PagedPrefillParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 128;
  constexpr int kGroup = 64;
  const int32_t blocks = blocks_of(p.num_tokens, kThreads / kGroup);
  return with_swa_form(p.swa_rows, [&](auto form) {
    return gpu::launch(paged_prefill_indices_kernel<kThreads, kGroup, form()>, blocks, kThreads, stream, p);
  });
}

namespace {
// Blocks a metadata call spreads over, at most (about one per multiprocessor):
// past that, segments grow by whole passes instead, bounding the redundant
// segment-offset work at num_tokens * kMetadataMaxBlocks / 2 evaluations.
constexpr int32_t kMetadataMaxBlocks = 128;

struct MetadataGrid {
  int32_t threads;  // a power of two in [kMetadataMinThreads, kMetadataMaxThreads]
  int32_t segment;  // tokens per block, a multiple of threads
  int32_t blocks;
};

// The fewest threads that cover the tokens in one pass, then one segment of
// that many tokens per block; see index_metadata.cuh.
MetadataGrid metadata_grid(int32_t num_tokens) {
  int32_t threads = kMetadataMinThreads;
  while (threads < num_tokens && threads < kMetadataMaxThreads) threads *= 2;
  const int32_t passes = std::max(1, blocks_of(blocks_of(num_tokens, threads), kMetadataMaxBlocks));
  const int32_t segment = passes * threads;
  return {threads, segment, std::max(1, blocks_of(num_tokens, segment))};
}

// Returns launch(std::integral_constant<int, threads>, grid) for num_tokens' grid.
template <typename Launch>
gpu::Error launch_metadata(int32_t num_tokens, const Launch& launch) {
  const MetadataGrid g = metadata_grid(num_tokens);
  switch (g.threads) {
    case 128: return launch(std::integral_constant<int, 128>{}, g);
    case 256: return launch(std::integral_constant<int, 256>{}, g);
    case 512: return launch(std::integral_constant<int, 512>{}, g);
    default: return launch(std::integral_constant<int, kMetadataMaxThreads>{}, g);
  }
}
}  // namespace

gpu::Error launch_decode_index_metadata(const DecodeMetadataParams& p, gpu::Stream stream) {
  return launch_metadata(p.num_tokens, [&](auto threads, const MetadataGrid& g) {
    return gpu::launch(decode_index_metadata_kernel<threads()>, g.blocks, threads(), stream, p, g.segment);
  });
}

gpu::Error launch_prefill_index_metadata(const PrefillMetadataParams& p, gpu::Stream stream) {
  return launch_metadata(p.num_tokens, [&](auto threads, const MetadataGrid& g) {
    return gpu::launch(prefill_index_metadata_kernel<threads()>, g.blocks, threads(), stream, p, g.segment);
  });
}

gpu::Error launch_swa_slot_mapping(const SwaSlotMappingParams& p, gpu::Stream stream) {
  if (p.num_tokens == 0) return gpu::kSuccess;
  constexpr int kThreads = 128;
  return gpu::launch(swa_slot_mapping_kernel<kThreads>, blocks_of(p.num_tokens, kThreads), kThreads, stream, p);
}

// The row copies run on a grid that fills the GPU (copy_spans gives every
// block an equal share of the bytes), kCopyBlocksPerSm blocks a multiprocessor.
constexpr int32_t kCopyThreads = 256;

int32_t copy_grid() {
  const int sms = gpu::multiprocessor_count();
  return sms > 0 ? sms * kCopyBlocksPerSm : kTargetBlocks;
}

// One launch per phase (the counts are on the device: every phase is launched).
gpu::Error launch_apply_row_copies(const RowCopyParams& p, gpu::Stream stream) {
  if (p.max_copies == 0 || p.num_planes == 0) return gpu::kSuccess;
  for (int32_t phase = 0; phase < p.num_phases; ++phase) {
    const gpu::Error err =
        gpu::launch(apply_row_copies_kernel<kCopyThreads>, copy_grid(), kCopyThreads, stream, p, phase);
    if (err != gpu::kSuccess) return err;
  }
  return gpu::kSuccess;
}

gpu::Error launch_transfer_rows(const LayerRowTransferParams& p, gpu::Stream stream) {
  if (p.rows.max_runs == 0 || p.rows.num_tensors == 0 || p.num_layers == 0) return gpu::kSuccess;
  if (p.num_layers == 1)  // the smaller parameter block (the host folded the layer's offset into the buffer)
    return gpu::launch(transfer_rows_kernel<kCopyThreads>, copy_grid(), kCopyThreads, stream, p.rows);
  return gpu::launch(transfer_layer_rows_kernel<kCopyThreads>, copy_grid(), kCopyThreads, stream, p);
}

}  // namespace ukv::kernels
