#include "ops/index_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <string>

#include "core/common/errors.h"
#include "core/config/sizing.h"
#include "ops/host_list_checks.h"
#include "ops/staged_layouts.h"

namespace ukv::ops {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Checks the arguments of one op call; every message starts with the op name.
// Every tensor must be on the backend's device type, and all on one device
// (the first tensor checked fixes which).
class ArgChecker {
 public:
  ArgChecker(const char* op, c10::DeviceType device_type) : op_(op), device_(device_type) {}

  // A contiguous int32 vector of exactly `len` elements.
  int32_t* vector(const at::Tensor& t, const char* name, int64_t len) {
    int32_vector(t, name);
    TORCH_CHECK_VALUE(t.size(0) == len, op_, ": ", name, " must have ", len, " elements, got ", t.size(0));
    return t.data_ptr<int32_t>();
  }

  // An output: a contiguous int32 vector of any length.
  int32_t* output(const at::Tensor& t, const char* name) {
    int32_vector(t, name);
    return t.data_ptr<int32_t>();
  }

  kernels::SlicedOutput sliced_output(const at::Tensor& indptr, const char* indptr_name, const at::Tensor& out,
                                      const char* out_name, int64_t num_tokens) {
    return {vector(indptr, indptr_name, num_tokens + 1), output(out, out_name), out.numel()};
  }

  // Token positions: int32 or int64, contiguous, `len` elements.
  kernels::Positions positions(const at::Tensor& t, int64_t len) {
    on_device(t, "positions");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op_,
                     ": positions must be int32 or int64, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == len, op_, ": positions must have shape [", len, "], got ",
                      t.sizes());
    contiguous(t, "positions");
    if (t.scalar_type() == at::kLong) return {nullptr, t.data_ptr<int64_t>()};
    return {t.data_ptr<int32_t>(), nullptr};
  }

  // An int32 2-D tensor, any strides, with `rows` rows (any count when rows < 0).
  void matrix(const at::Tensor& t, const char* name, const char* shape, int64_t rows) {
    on_device(t, name);
    int32_dtype(t, name);
    TORCH_CHECK_VALUE(t.dim() == 2, op_, ": ", name, " must be 2-D ", shape, ", got ", t.dim(), "-D");
    TORCH_CHECK_VALUE(rows < 0 || t.size(0) == rows, op_, ": ", name, " must have shape ", shape, " with ", rows,
                      " rows, got ", t.sizes());
    TORCH_CHECK_VALUE(t.size(0) <= kInt32Max && t.size(1) <= kInt32Max, op_, ": ", name, " is too large: ",
                      t.sizes());
  }

  // A block table: [num_seqs, blocks] with at least one column.
  kernels::Table table(const at::Tensor& t, const char* name, int64_t rows) {
    matrix(t, name, "[num_seqs, blocks]", rows);
    TORCH_CHECK_VALUE(t.size(1) >= 1, op_, ": ", name, " must have at least one column, got ", t.sizes());
    return {t.data_ptr<int32_t>(), static_cast<int32_t>(t.size(0)), static_cast<int32_t>(t.size(1)), t.stride(0),
            t.stride(1)};
  }

  // Rows of the table times k must stay addressable as int32 entries.
  void table_entries_fit(const kernels::Table& table, const char* name, int32_t rows_per_block) const {
    TORCH_CHECK_VALUE(static_cast<int64_t>(table.cols) * rows_per_block <= kInt32Max, op_, ": ", name, " with ",
                      table.cols, " columns of ", rows_per_block, " entries exceeds the int32 entry range");
  }

  int32_t scalar(int64_t v, const char* name, int64_t lo) const {
    TORCH_CHECK_VALUE(v >= lo && v <= kInt32Max, op_, ": ", name, " must be in [", lo, ", ", kInt32Max, "], got ",
                      v);
    return static_cast<int32_t>(v);
  }

  // k = block_size / compress_ratio, by the same rule as the pool sizing.
  int32_t rows_per_block(int64_t compress_ratio, int64_t block_size) const {
    scalar(block_size, "block_size", 1);
    scalar(compress_ratio, "compress_ratio", 1);
    int64_t k = 0;
    try {
      k = ukv::rows_per_compress_block(compress_ratio, block_size);
    } catch (const ukv::InvalidArgument& e) {
      TORCH_CHECK_VALUE(false, op_, ": ", e.what());
    }
    return static_cast<int32_t>(k);
  }

  // Rows between consecutive compress blocks: k unless given (the row space's envelope).
  int32_t block_stride(const std::optional<int64_t>& stride, int32_t k, const char* name) const {
    if (!stride.has_value()) return k;
    TORCH_CHECK_VALUE(*stride >= k && *stride <= kInt32Max, op_, ": ", name, " must be in [k = ", k, ", ",
                      kInt32Max, "] (blocks of k rows must not overlap) or None, got ", *stride);
    return static_cast<int32_t>(*stride);
  }

  // A layer class's SWA row constants (KvPlan.layer_swa_rows): None is the
  // slot layouts' formula for block_size.
  kernels::SwaRows swa_rows(const std::optional<std::vector<int64_t>>& v, const char* name, int64_t block_size) {
    const int32_t bs = scalar(block_size, "block_size", 1);
    if (!v.has_value()) return {kernels::make_divisor(bs), bs, 0, kernels::make_divisor(bs), bs};
    TORCH_CHECK_VALUE(v->size() == 5, op_, ": ", name,
                      " must be None or 5 ints [page tokens, unit rows, offset, group, group stride], got ", v->size(),
                      " values");
    const std::vector<int64_t>& r = *v;
    const auto field = [&](size_t i, const char* what, int64_t lo) {
      return scalar(r[i], ("the " + std::string(what) + " of " + name).c_str(), lo);
    };
    const int32_t page = field(0, "page tokens", 1);
    const int32_t group = field(3, "group", 1);
    const int32_t unit_rows = field(1, "unit rows", 1), offset = field(2, "offset", 0);
    const int32_t group_stride = field(4, "group stride", 1);
    TORCH_CHECK_VALUE(page % group == 0, op_, ": ", name, ": the group ", group, " must divide the page ", page);
    // Pages tile the blocks: a page that does not divide block_size means the
    // constants belong to another configuration.
    TORCH_CHECK_VALUE(bs % page == 0, op_, ": ", name, ": the page of ", page, " tokens must divide block_size ",
                      bs, " (swa_rows and block_size of one configuration: KvPlan.swa_rows)");
    // A page's rows span this many rows from the offset: pages of different
    // units must not share rows, nor the groups of one page.
    const int64_t span = static_cast<int64_t>(page / group - 1) * group_stride + group;
    TORCH_CHECK_VALUE((page == group || group_stride >= group) && span <= unit_rows, op_, ": ", name,
                      ": a page's rows (", page / group, " groups of ", group, ", ", group_stride,
                      " rows apart: ", span, " rows) must fit in a unit of ", unit_rows,
                      " rows with groups that do not overlap");
    return {kernels::make_divisor(page), unit_rows, offset, kernels::make_divisor(group), group_stride};
  }

  // The outputs of one call share the SWA units: one page size, one unit size.
  void same_units(const kernels::SwaRows& a, const kernels::SwaRows& b, const char* name) const {
    TORCH_CHECK_VALUE(a.page.value == b.page.value && a.unit_rows == b.unit_rows, op_, ": ", name,
                      " must have swa_rows' page tokens and unit rows (", a.page.value, ", ", a.unit_rows, "), got (",
                      b.page.value, ", ", b.unit_rows, ")");
  }

  // A view of a manager's staged tables is read with the layout it was staged
  // in: the SWA page of its 'swa' table (None is the slot layouts' page of
  // block_size tokens).
  void staged_page(const at::Tensor& table, const char* table_name, const kernels::SwaRows& rows,
                   const std::optional<std::vector<int64_t>>& given, const char* rows_name) const {
    const std::optional<StagedLayout> staged = staged_layout(table.storage().data());
    if (!staged || staged->swa_page == rows.page.value) return;
    TORCH_CHECK_VALUE(false, op_, ": ", table_name, " is a KV manager's staged table of ", staged->swa_page,
                      "-token SWA pages, but ", rows_name,
                      given ? " gives pages of " : " is None (the slot layouts' pages of block_size: ",
                      rows.page.value, given ? " tokens" : " tokens)",
                      ": pass KvPlan.swa_rows(ratio) of its plan, or use ukv_torch.KvStepOps");
  }

  // ... and a row-space manager's compress tables with the envelope as the block stride.
  void staged_stride(const at::Tensor& table, const char* table_name, int32_t stride,
                     const std::optional<int64_t>& given, const char* stride_name) const {
    const std::optional<StagedLayout> staged = staged_layout(table.storage().data());
    if (!staged || staged->envelope_rows == 0 || staged->envelope_rows == stride) return;
    TORCH_CHECK_VALUE(false, op_, ": ", table_name, " is a row-space KV manager's staged table of ",
                      staged->envelope_rows, "-row envelopes, but ", stride_name, " is ", stride,
                      given ? "" : " (None: k)",
                      ": pass KvPlan.compress_args(ratio) of its plan, or use ukv_torch.KvStepOps");
  }

  int32_t num_tokens(const at::Tensor& batch_id) {
    on_device(batch_id, "batch_id");
    int32_dtype(batch_id, "batch_id");
    TORCH_CHECK_VALUE(batch_id.dim() == 1, op_, ": batch_id must be 1-D [num_tokens], got ", batch_id.dim(), "-D");
    TORCH_CHECK_VALUE(batch_id.size(0) < kInt32Max, op_, ": too many tokens: ", batch_id.size(0));
    contiguous(batch_id, "batch_id");
    return static_cast<int32_t>(batch_id.size(0));
  }

  int32_t num_seqs(const at::Tensor& per_seq, const char* name) {
    int32_vector(per_seq, name);
    TORCH_CHECK_VALUE(per_seq.size(0) <= kInt32Max, op_, ": ", name, " has too many sequences: ", per_seq.size(0));
    return static_cast<int32_t>(per_seq.size(0));
  }

  const char* op() const { return op_; }
  // Any dtype, on the call's device.
  void same_device(const at::Tensor& t, const char* name) { on_device(t, name); }

 private:
  void on_device(const at::Tensor& t, const char* name) {
    if (!device_fixed_ && t.device().type() == device_.type()) {
      device_ = t.device();
      device_fixed_ = true;
    }
    TORCH_CHECK(t.device() == device_, op_, ": ", name, " must be on ", device_, " like the other arguments, got ",
                t.device());
  }
  void int32_dtype(const at::Tensor& t, const char* name) const {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, op_, ": ", name, " must be int32, got ", t.scalar_type());
  }
  void contiguous(const at::Tensor& t, const char* name) const {
    TORCH_CHECK_VALUE(t.numel() <= 1 || t.stride(0) == 1, op_, ": ", name,
                      " must be contiguous (stride 1), got stride ", t.stride(0));
  }
  void int32_vector(const at::Tensor& t, const char* name) {
    on_device(t, name);
    int32_dtype(t, name);
    TORCH_CHECK_VALUE(t.dim() == 1, op_, ": ", name, " must be 1-D, got ", t.dim(), "-D");
    contiguous(t, name);
  }

  const char* op_;
  at::Device device_;
  bool device_fixed_ = false;
};

}  // namespace

kernels::CsaTranslatePackParams check(c10::DeviceType device_type, const CsaTranslatePack::Args& a) {
  UKV_CSA_TRANSLATE_PACK_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("csa_translate_pack", device_type);
  kernels::CsaTranslatePackParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  c.matrix(topk_local, "topk_local", "[num_tokens, index_topk]", p.num_tokens);
  p.topk = topk_local.data_ptr<int32_t>();
  p.topk_row_stride = topk_local.stride(0);
  p.topk_col_stride = topk_local.stride(1);
  p.topk_width = static_cast<int32_t>(topk_local.size(1));
  p.rows_per_block = kernels::make_divisor(c.rows_per_block(compress_ratio, block_size));
  p.block_stride = c.block_stride(block_stride, p.rows_per_block.value, "block_stride");
  p.table = c.table(block_table, "block_table", -1);
  c.table_entries_fit(p.table, "block_table", p.rows_per_block.value);
  c.staged_stride(block_table, "block_table", p.block_stride, block_stride, "block_stride");
  p.positions = c.positions(positions, p.num_tokens);
  p.out = c.sliced_output(kv_indptr, "kv_indptr", kv_indices, "kv_indices", p.num_tokens);
  p.compress_base = c.scalar(compress_base, "compress_base", 0);
  if (skip_per_token.has_value()) {
    TORCH_CHECK_VALUE(window == 0, c.op(),
                      ": pass either skip_per_token (prefill) or window > 0 (decode), not both; got window=", window);
    p.skip = c.vector(*skip_per_token, "skip_per_token", p.num_tokens);
  } else {
    TORCH_CHECK_VALUE(window > 0, c.op(),
                      ": window must be > 0 when skip_per_token is None (decode skips min(pos + 1, window)), got ",
                      window);
    p.window = c.scalar(window, "window", 1);
  }
  return p;
}

kernels::PagedDecodeParams check(c10::DeviceType device_type, const PagedDecodeIndices::Args& a) {
  UKV_PAGED_DECODE_INDICES_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("paged_decode_indices", device_type);
  kernels::PagedDecodeParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.swa_table = c.table(swa_block_table, "swa_block_table", -1);
  p.positions = c.positions(positions, p.num_tokens);
  p.swa = c.sliced_output(swa_indptr, "swa_indptr", swa_indices, "swa_indices", p.num_tokens);
  TORCH_CHECK_VALUE(csa_indptr.has_value() == csa_indices.has_value(), c.op(),
                    ": csa_indptr and csa_indices must be given together");
  if (csa_indices.has_value())
    p.csa = c.sliced_output(*csa_indptr, "csa_indptr", *csa_indices, "csa_indices", p.num_tokens);
  TORCH_CHECK_VALUE(hca_indptr.has_value() == hca_indices.has_value(), c.op(),
                    ": hca_indptr and hca_indices must be given together");
  if (hca_indices.has_value())
    p.hca = c.sliced_output(*hca_indptr, "hca_indptr", *hca_indices, "hca_indices", p.num_tokens);
  p.window = c.scalar(window, "window", 1);
  p.swa_rows[0] = c.swa_rows(swa_rows, "swa_rows", block_size);
  p.swa_rows[1] = c.swa_rows(csa_swa_rows, "csa_swa_rows", block_size);
  p.swa_rows[2] = c.swa_rows(hca_swa_rows, "hca_swa_rows", block_size);
  // Only the outputs written share the units (an SWA-only call's CSA and HCA
  // constants are not used, whatever they are).
  if (csa_indices.has_value()) c.same_units(p.swa_rows[0], p.swa_rows[1], "csa_swa_rows");
  if (hca_indices.has_value()) c.same_units(p.swa_rows[0], p.swa_rows[2], "hca_swa_rows");
  c.staged_page(swa_block_table, "swa_block_table", p.swa_rows[0], swa_rows, "swa_rows");
  return p;
}

kernels::HcaDecodeParams check(c10::DeviceType device_type, const HcaDecodeIndices::Args& a) {
  UKV_HCA_DECODE_INDICES_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("hca_decode_indices", device_type);
  kernels::HcaDecodeParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.rows_per_block = kernels::make_divisor(c.rows_per_block(compress_ratio, block_size));
  p.block_stride = c.block_stride(block_stride, p.rows_per_block.value, "block_stride");
  p.table = c.table(hca_block_table, "hca_block_table", -1);
  c.table_entries_fit(p.table, "hca_block_table", p.rows_per_block.value);
  c.staged_stride(hca_block_table, "hca_block_table", p.block_stride, block_stride, "block_stride");
  p.n_committed = c.vector(n_committed_hca, "n_committed_hca", p.table.rows);
  p.out = c.sliced_output(hca_indptr, "hca_indptr", hca_indices, "hca_indices", p.num_tokens);
  p.compress_base = c.scalar(compress_base, "compress_base", 0);
  return p;
}

kernels::PagedPrefillParams check(c10::DeviceType device_type, const PagedPrefillIndices::Args& a) {
  UKV_PAGED_PREFILL_INDICES_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("paged_prefill_indices", device_type);
  kernels::PagedPrefillParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.positions = c.positions(positions, p.num_tokens);
  p.swa_table = c.table(swa_block_table, "swa_block_table", -1);
  const int64_t num_seqs = p.swa_table.rows;
  p.hca_rows_per_block = kernels::make_divisor(c.rows_per_block(compress_ratio, block_size));
  p.hca_block_stride = c.block_stride(hca_block_stride, p.hca_rows_per_block.value, "hca_block_stride");
  p.hca_table = c.table(hca_block_table, "hca_block_table", num_seqs);
  c.table_entries_fit(p.hca_table, "hca_block_table", p.hca_rows_per_block.value);
  p.chunk_start = c.vector(chunk_start, "chunk_start", num_seqs);
  p.query_start = c.vector(query_start, "query_start", num_seqs);
  p.n_committed_hca = c.vector(n_committed_hca, "n_committed_hca", num_seqs);
  p.extend = c.sliced_output(extend_indptr, "extend_indptr", extend_indices, "extend_indices", p.num_tokens);
  p.swa = c.sliced_output(swa_indptr, "swa_indptr", swa_indices, "swa_indices", p.num_tokens);
  p.csa = c.sliced_output(csa_indptr, "csa_indptr", csa_indices, "csa_indices", p.num_tokens);
  p.hca = c.sliced_output(hca_indptr, "hca_indptr", hca_indices, "hca_indices", p.num_tokens);
  p.compress_base = c.scalar(compress_base, "compress_base", 0);
  p.window = c.scalar(window, "window", 1);
  p.swa_rows[0] = c.swa_rows(swa_rows, "swa_rows", block_size);
  p.swa_rows[1] = c.swa_rows(csa_swa_rows, "csa_swa_rows", block_size);
  p.swa_rows[2] = c.swa_rows(hca_swa_rows, "hca_swa_rows", block_size);
  c.same_units(p.swa_rows[0], p.swa_rows[1], "csa_swa_rows");
  c.same_units(p.swa_rows[0], p.swa_rows[2], "hca_swa_rows");
  c.staged_page(swa_block_table, "swa_block_table", p.swa_rows[0], swa_rows, "swa_rows");
  c.staged_stride(hca_block_table, "hca_block_table", p.hca_block_stride, hca_block_stride, "hca_block_stride");
  p.hca_ratio = static_cast<int32_t>(compress_ratio);
  return p;
}

kernels::DecodeMetadataParams check(c10::DeviceType device_type, const DecodeIndexMetadata::Args& a) {
  UKV_DECODE_INDEX_METADATA_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("decode_index_metadata", device_type);
  kernels::DecodeMetadataParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.positions = c.positions(positions, p.num_tokens);
  p.num_seqs = c.num_seqs(n_committed_csa, "n_committed_csa");
  p.n_committed_csa = n_committed_csa.data_ptr<int32_t>();
  p.n_committed_hca = c.vector(n_committed_hca, "n_committed_hca", p.num_seqs);
  p.swa_indptr = c.vector(swa_indptr, "swa_indptr", p.num_tokens + 1);
  p.csa_indptr = c.vector(csa_indptr, "csa_indptr", p.num_tokens + 1);
  p.hca_indptr = c.vector(hca_indptr, "hca_indptr", p.num_tokens + 1);
  p.window = c.scalar(window, "window", 1);
  p.index_topk = c.scalar(index_topk, "index_topk", 0);
  p.csa_ratio = c.scalar(csa_ratio, "csa_ratio", 1);
  return p;
}

kernels::PrefillMetadataParams check(c10::DeviceType device_type, const PrefillIndexMetadata::Args& a) {
  UKV_PREFILL_INDEX_METADATA_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("prefill_index_metadata", device_type);
  kernels::PrefillMetadataParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.positions = c.positions(positions, p.num_tokens);
  p.num_seqs = c.num_seqs(chunk_start, "chunk_start");
  p.chunk_start = chunk_start.data_ptr<int32_t>();
  p.n_committed_csa = c.vector(n_committed_csa, "n_committed_csa", p.num_seqs);
  p.n_committed_hca = c.vector(n_committed_hca, "n_committed_hca", p.num_seqs);
  p.extend_indptr = c.vector(extend_indptr, "extend_indptr", p.num_tokens + 1);
  p.swa_indptr = c.vector(swa_indptr, "swa_indptr", p.num_tokens + 1);
  p.csa_indptr = c.vector(csa_indptr, "csa_indptr", p.num_tokens + 1);
  p.hca_indptr = c.vector(hca_indptr, "hca_indptr", p.num_tokens + 1);
  p.prefix_swa_count = c.vector(prefix_swa_count, "prefix_swa_count", p.num_tokens);
  p.window = c.scalar(window, "window", 1);
  p.index_topk = c.scalar(index_topk, "index_topk", 0);
  p.csa_ratio = c.scalar(csa_ratio, "csa_ratio", 1);
  p.hca_ratio = c.scalar(hca_ratio, "hca_ratio", 1);
  return p;
}

kernels::SwaSlotMappingParams check(c10::DeviceType device_type, const SwaSlotMapping::Args& a) {
  UKV_SWA_SLOT_MAPPING_ARGS(UKV_OP_ARG_BIND)
  ArgChecker c("swa_slot_mapping", device_type);
  kernels::SwaSlotMappingParams p{};
  p.num_tokens = c.num_tokens(batch_id);
  p.batch_id = batch_id.data_ptr<int32_t>();
  p.positions = c.positions(positions, p.num_tokens);
  p.swa_table = c.table(swa_block_table, "swa_block_table", -1);
  p.out = c.vector(slot_mapping, "slot_mapping", p.num_tokens);
  p.swa_rows = c.swa_rows(swa_rows, "swa_rows", block_size);
  c.staged_page(swa_block_table, "swa_block_table", p.swa_rows, swa_rows, "swa_rows");
  return p;
}

kernels::RowCopyParams check(c10::DeviceType device_type, const ApplyRowCopies::Args& a) {
  UKV_APPLY_ROW_COPIES_ARGS(UKV_OP_ARG_BIND)
  constexpr const char* op = "apply_row_copies";
  ArgChecker c(op, device_type);
  kernels::RowCopyParams p{};
  TORCH_CHECK_VALUE(planes.size() <= static_cast<size_t>(kernels::kMaxPlanes), op, ": planes must hold at most ",
                    kernels::kMaxPlanes, " tensors, got ", planes.size());
  c.matrix(copies, "copies", "[max_copies, 3]", -1);
  TORCH_CHECK_VALUE(copies.size(1) == 3 && copies.is_contiguous(), op,
                    ": copies must be a contiguous [max_copies, 3] tensor (src_row, dst_row, rows), got ",
                    copies.sizes(), " with strides ", copies.strides());
  p.copies = copies.data_ptr<int32_t>();
  p.max_copies = static_cast<int32_t>(copies.size(0));
  p.num_phases = c.num_seqs(copy_counts, "copy_counts");  // one count per phase
  p.counts = copy_counts.data_ptr<int32_t>();
  p.num_planes = static_cast<int32_t>(planes.size());
  for (size_t i = 0; i < planes.size(); ++i) {
    const at::Tensor& plane = planes[i];
    c.same_device(plane, ("planes[" + std::to_string(i) + "]").c_str());
    TORCH_CHECK_VALUE(plane.dim() == 2 && plane.is_contiguous(), op, ": planes[", i,
                      "] must be a contiguous 2-D [rows, width] tensor, got ", plane.sizes(), " with strides ",
                      plane.strides());
    TORCH_CHECK_VALUE(i == 0 || plane.size(0) == planes[0].size(0), op, ": every plane must have planes[0]'s ",
                      planes[0].size(0), " rows, planes[", i, "] has ", plane.size(0));
    p.planes[i] = static_cast<uint8_t*>(plane.data_ptr());
    p.row_bytes[i] = plane.size(1) * static_cast<int64_t>(plane.element_size());
  }
  p.plane_rows = planes.empty() ? 0 : planes[0].size(0);
  // Without planes nothing is copied, whatever the list holds.
  if (device_type == c10::DeviceType::CPU && !planes.empty()) check_host_copies(p);
  return p;
}

namespace {

// gather_rows and scatter_rows take the same arguments but for the direction:
// `tensors` (named `tensors_name`) are 2-D with contiguous rows (any row
// stride: a compressor or indexer view), the runs an int64 [max_runs, 4]
// list with an int32 [1] count, the buffer a contiguous 1-D uint8 tensor.
// With layer_offsets, `tensors` holds the layers' tensors layer after layer,
// the same number each, tensor k of every layer with layer 0's row bytes and
// row stride; its rows may differ (the row space's layers differ by a few), and
// the runs are bounded by the fewest.
kernels::LayerRowTransferParams check_transfer(const char* op, c10::DeviceType device_type,
                                               const std::vector<at::Tensor>& tensors, const char* tensors_name,
                                               const at::Tensor& runs, const at::Tensor& run_count,
                                               const at::Tensor& buffer,
                                               const std::optional<std::vector<int64_t>>& layer_offsets,
                                               bool to_buffer) {
  ArgChecker c(op, device_type);
  kernels::LayerRowTransferParams lp{};
  kernels::RowTransferParams& p = lp.rows;
  c.same_device(buffer, "buffer");
  TORCH_CHECK_TYPE(buffer.scalar_type() == at::kByte, op, ": buffer must be uint8, got ", buffer.scalar_type());
  TORCH_CHECK_VALUE(buffer.dim() == 1 && (buffer.numel() <= 1 || buffer.stride(0) == 1), op,
                    ": buffer must be a contiguous 1-D tensor, got ", buffer.sizes(), " with strides ",
                    buffer.strides());
  p.buffer = static_cast<uint8_t*>(buffer.data_ptr());
  p.buffer_bytes = buffer.numel();
  c.same_device(runs, "runs");
  TORCH_CHECK_TYPE(runs.scalar_type() == at::kLong, op, ": runs must be int64, got ", runs.scalar_type());
  TORCH_CHECK_VALUE(runs.dim() == 2 && runs.size(1) == 4 && runs.is_contiguous() && runs.size(0) <= kInt32Max, op,
                    ": runs must be a contiguous [max_runs, 4] tensor (tensor, first_row, rows, buffer_offset), got ",
                    runs.sizes(), " with strides ", runs.strides());
  p.runs = runs.data_ptr<int64_t>();
  p.max_runs = static_cast<int32_t>(runs.size(0));
  p.count = c.vector(run_count, "run_count", 1);
  const int64_t layers = layer_offsets ? static_cast<int64_t>(layer_offsets->size()) : 1;
  TORCH_CHECK_VALUE(layers >= 1 && layers <= kernels::kMaxLayers, op, ": layer_offsets must hold 1 to ",
                    kernels::kMaxLayers, " offsets (a call per group of layers beyond), got ", layers);
  TORCH_CHECK_VALUE(static_cast<int64_t>(p.max_runs) * layers <= kInt32Max, op, ": runs (", p.max_runs,
                    ") times layers (", layers, ") must fit 32 bits");
  const int64_t per_layer = static_cast<int64_t>(tensors.size()) / layers;
  TORCH_CHECK_VALUE(static_cast<int64_t>(tensors.size()) == per_layer * layers && per_layer <= kernels::kMaxPlanes,
                    op, ": ", tensors_name, " must hold at most ", kernels::kMaxPlanes, " tensors for each of the ",
                    layers, " layers, the same number each, got ", tensors.size());
  lp.num_layers = static_cast<int32_t>(layers);
  p.num_tensors = static_cast<int32_t>(per_layer);
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t shift = layer_offsets ? (*layer_offsets)[l] : 0;
    TORCH_CHECK_VALUE(shift >= 0 && shift <= p.buffer_bytes, op, ": layer_offsets[", l, "] must lie in the ",
                      p.buffer_bytes, "-byte buffer, got ", shift);
    lp.layer_offset[l] = shift;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const int64_t layer = static_cast<int64_t>(i) / per_layer, k = static_cast<int64_t>(i) % per_layer;
    const std::string name = std::string(tensors_name) + "[" + std::to_string(i) + "]";
    c.same_device(t, name.c_str());
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(1) > 0 && (t.size(1) == 1 || t.stride(1) == 1) &&
                          (t.size(0) <= 1 || t.stride(0) >= t.size(1)),
                      op, ": ", name,
                      " must be a 2-D [rows, width > 0] tensor whose rows are contiguous and do not overlap, got ",
                      t.sizes(), " with strides ", t.strides());
    const int64_t row_bytes = t.size(1) * static_cast<int64_t>(t.element_size());
    const int64_t row_stride = t.stride(0) * static_cast<int64_t>(t.element_size());
    if (layer == 0) {
      p.tensors[k] = static_cast<uint8_t*>(t.data_ptr());
      p.row_bytes[k] = row_bytes;
      p.row_stride[k] = row_stride;
      p.tensor_rows[k] = t.size(0);
    } else {
      TORCH_CHECK_VALUE(row_bytes == p.row_bytes[k] && row_stride == p.row_stride[k], op, ": ", name, " (layer ",
                        layer, ") must have the row bytes and row stride of ", tensors_name, "[", k, "] (",
                        p.row_bytes[k], ", ", p.row_stride[k], "), got (", row_bytes, ", ", row_stride, ")");
      // Every layer takes the same runs: they must fit the layer with the fewest rows.
      p.tensor_rows[k] = std::min(p.tensor_rows[k], t.size(0));
    }
    lp.tensors[layer][k] = static_cast<uint8_t*>(t.data_ptr());
  }
  p.to_buffer = to_buffer;
  // The layers' runs write the same rows of each layer's targets: a target given twice would lose a layer's bytes.
  if (!to_buffer && layers > 1) check_distinct_targets(op, tensors_name, lp);
  if (device_type == c10::DeviceType::CPU) check_host_runs(op, lp);
  if (layers == 1) {  // one layer at an offset is the buffer from there: the one-layer kernel has no offsets
    p.buffer += lp.layer_offset[0];
    p.buffer_bytes -= lp.layer_offset[0];
    lp.layer_offset[0] = 0;
  }
  return lp;
}

}  // namespace

kernels::LayerRowTransferParams check(c10::DeviceType device_type, const GatherRows::Args& a) {
  UKV_GATHER_ROWS_ARGS(UKV_OP_ARG_BIND)
  return check_transfer("gather_rows", device_type, sources, "sources", runs, run_count, buffer, layer_offsets, true);
}

kernels::LayerRowTransferParams check(c10::DeviceType device_type, const ScatterRows::Args& a) {
  UKV_SCATTER_ROWS_ARGS(UKV_OP_ARG_BIND)
  return check_transfer("scatter_rows", device_type, targets, "targets", runs, run_count, buffer, layer_offsets,
                        false);
}

}  // namespace ukv::ops
