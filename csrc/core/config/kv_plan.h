// Planning the KV layout from a byte budget: how many SWA slots, logical
// compress blocks and rows per layer tensor fit, for each layout of
// ServeConfig: the static split, the unified pool with upstream sizing
// (flag-on capacity == flag-off), and the unified pool with elastic sizing
// (the logical block space covers every compress block the tensors can
// physically hold, so slots SWA leaves idle serve compress). Per-logical-block
// side pools (the CSA indexer) are charged. Every row count comes from
// sizing.h, the source the allocator uses too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/pool_sizes.h"
#include "core/config/record.h"
#include "core/config/serve_config.h"

namespace ukv {

// The model's KV shapes, per layer and per row.
struct ModelKvSpec {
  std::vector<int64_t> layer_ratios;     // one per layer: 4 CSA, 128 HCA, 0 dense (MTP layers included)
  int64_t head_dim = 512;
  int64_t kv_elem_bytes = 1;             // fp8 1, bf16 2
  int64_t rope_head_dim = 64;            // separate rope plane (fp8 mode); 0 = none
  int64_t rope_elem_bytes = 2;
  int64_t indexer_bytes_per_block = 32 * 144;  // per CSA (ratio 4) layer and logical block

  template <class Self, class Visitor>
  static void visit_fields(Self& m, Visitor&& v) {
    v.integers("layer_ratios", m.layer_ratios,
               "compress ratio of every layer, MTP/draft layers included: 4 CSA, 128 HCA, 0 dense");
    v.integer("head_dim", m.head_dim, "latent (NoPE) row width in elements");
    v.integer("kv_elem_bytes", m.kv_elem_bytes, "bytes per NoPE element: fp8 1, bf16 2");
    v.integer("rope_head_dim", m.rope_head_dim, "width of the separate RoPE plane (fp8 mode); 0 = none");
    v.integer("rope_elem_bytes", m.rope_elem_bytes, "bytes per RoPE element");
    v.integer("indexer_bytes_per_block", m.indexer_bytes_per_block,
              "CSA indexer bytes per CSA layer and logical block (32 entries x 144 bytes for V4); 0 = none");
  }
};

// What a byte budget holds under one configuration: the pools the manager
// gets and the rows of every layer tensor (sizing.h, as the pools use).
struct KvPlan {
  ServeConfig config;
  ModelKvSpec model;
  PoolSizes pools;
  int64_t budget_bytes = 0;
  std::vector<int64_t> layer_rows;   // one per layer
  int64_t kv_bytes = 0, rope_bytes = 0, indexer_bytes = 0, total_bytes = 0;
  int64_t swa_block_bytes = 0;         // one SWA block (page) across all layers
  int64_t compressed_block_bytes = 0;  // one logical block across all compressed layers + indexer
  // Where each layer's rows are (row_space: relative to the layer's base row
  // in the planes; slot layouts: in the layer's own tensor). See
  // layer_index_constants() for the meaning of each list.
  int64_t swa_base_row = 0;
  std::vector<int64_t> layer_base_rows;
  std::vector<int64_t> layer_compress_bases;
  std::vector<int64_t> layer_block_strides;
  std::vector<int64_t> layer_swa_rows;  // kSwaRowFields per layer
  std::vector<int64_t> layer_indexer_planes;
  std::vector<int64_t> layer_indexer_offsets;

  template <class Self, class Visitor>
  static void visit_fields(Self& p, Visitor&& v) {
    v.record("config", p.config, "the serving parameters the plan was made for");
    v.record("model", p.model, "the model's KV shapes");
    v.record("pools", p.pools, "the manager's pools (KvManager(plan) takes them)");
    v.integer("budget_bytes", p.budget_bytes, "the byte budget planned for");
    v.integers("layer_rows", p.layer_rows, "rows of every layer's unified_kv tensor");
    v.integer("kv_bytes", p.kv_bytes, "bytes of the NoPE planes");
    v.integer("rope_bytes", p.rope_bytes, "bytes of the RoPE planes");
    v.integer("indexer_bytes", p.indexer_bytes, "bytes of the CSA indexer pool");
    v.integer("total_bytes", p.total_bytes, "all of it: never more than budget_bytes");
    v.integer("swa_block_bytes", p.swa_block_bytes, "bytes of one SWA block across all layers");
    v.integer("compressed_block_bytes", p.compressed_block_bytes,
              "bytes of one logical block across all compressed layers and the indexer");
    v.integer("swa_base_row", p.swa_base_row, "row_space: the first row of the SWA units' lattice");
    v.integers("layer_base_rows", p.layer_base_rows,
               "row_space: each layer's base row in the planes (its tensor is the planes from there; 0 in the slot "
               "layouts, where each layer has its own tensor)");
    v.integers("layer_compress_bases", p.layer_compress_bases,
               "each compress layer's compress_base (index ops, bind_compress_view); 0 for dense layers");
    v.integers("layer_block_strides", p.layer_block_strides,
               "each compress layer's rows between consecutive compress blocks: k in the slot layouts, the envelope "
               "in row_space (block_stride of the index ops); 0 for dense layers");
    v.integers("layer_swa_rows", p.layer_swa_rows,
               "each layer's SWA row constants, 5 per layer: page tokens, unit rows, offset, group, group stride "
               "(swa_rows of the index ops)");
    v.integers("layer_indexer_planes", p.layer_indexer_planes,
               "row_space: the plane (0 NoPE, 1 RoPE) holding each CSA layer's indexer rows inside the envelope; "
               "-1 for other layers and in the slot layouts (a separate indexer pool)");
    v.integers("layer_indexer_offsets", p.layer_indexer_offsets,
               "row_space: byte offset of each CSA layer's indexer block from its envelope's first byte in that plane");
  }
};

// The SWA row of position a of a sequence, for one layer class:
//   id = table[a / page]; q = a % page;
//   row = id * unit_rows + offset + (q / group) * group_stride + q % group.
// The slot layouts are page = unit_rows = group = group_stride = block_size,
// offset 0: row = id * block_size + a % block_size.
constexpr int64_t kSwaRowFields = 5;

void validate(const ModelKvSpec& m);
// Bytes of one row in each plane.
int64_t nope_row_bytes(const ModelKvSpec& m);
int64_t rope_row_bytes(const ModelKvSpec& m);
// Throws InvalidArgument when the inputs are out of domain or not even the
// SWA region fits the budget.
KvPlan plan_kv_layout(int64_t budget_bytes, const ModelKvSpec& model, const ServeConfig& config);

template <>
struct RecordTraits<ModelKvSpec> {
  static constexpr const char* name = "ModelKvSpec";
  static constexpr StateKind kind = StateKind::ModelKvSpec;
  static void validate(const ModelKvSpec& m) { ukv::validate(m); }
};

template <>
struct RecordTraits<KvPlan> {
  static constexpr const char* name = "KvPlan";
  static constexpr StateKind kind = StateKind::KvPlan;
  static void validate(const KvPlan&) {}  // made by plan_kv_layout, read back only
};

}  // namespace ukv
