// KvManager: staging the batch's tables into the caller's host buffers.
#include <algorithm>
#include <cstring>

#include "core/kv_manager.h"

namespace ukv {

void KvManager::write_row(const Sequence& s, int64_t row, int64_t from, const StagingView& view) {
  const int64_t base = row * view.row_stride, len = static_cast<int64_t>(s.logical.size());
  for (int64_t i = from; i < len; ++i) {
    view.logical[base + i] = s.logical[static_cast<size_t>(i)];
    view.swa[base + i] = std::max<int32_t>(s.swa[static_cast<size_t>(i)], 0);  // -1 is never read; keep it in bounds
  }
  for (int64_t t = 0; t < num_types(); ++t) {
    const auto& table = s.phys[static_cast<size_t>(t)];
    std::memcpy(view.phys[static_cast<size_t>(t)] + base + from, table.data() + from,
                sizeof(int32_t) * static_cast<size_t>(len - from));
  }
  const int64_t old_len = row_len_[static_cast<size_t>(row)];
  for (int64_t i = len; i < old_len; ++i) {
    view.logical[base + i] = 0;
    view.swa[base + i] = 0;
    for (auto* p : view.phys) p[base + i] = 0;
  }
}

void KvManager::stage(const int64_t* seq_ids, int64_t n, const StagingView& view) {
  require(n >= 0 && n <= serve_.max_num_seqs, "stage: batch of ", n, " sequences exceeds max_num_seqs ", serve_.max_num_seqs);
  require(view.row_stride >= serve_.max_blocks_per_seq, "stage: row_stride ", view.row_stride,
          " is smaller than max_blocks_per_seq ", serve_.max_blocks_per_seq);
  require(static_cast<int64_t>(view.phys.size()) == num_types(), "stage: expected ", num_types(), " physical tables");
  require_distinct_known(seq_ids, n, "stage");  // every id known before any row changes
  for (int64_t r = 0; r < n; ++r) {
    Sequence& s = seq(seq_ids[r]);
    const bool same = row_seq_[static_cast<size_t>(r)] == seq_ids[r] && s.stage_row == r;
    write_row(s, r, same ? std::min(s.dirty_lo, static_cast<int64_t>(s.logical.size())) : 0, view);
    row_seq_[static_cast<size_t>(r)] = seq_ids[r];
    row_len_[static_cast<size_t>(r)] = static_cast<int64_t>(s.logical.size());
    s.stage_row = r;
    s.dirty_lo = static_cast<int64_t>(s.logical.size());
  }
}

void KvManager::invalidate_staging() {
  std::fill(row_seq_.begin(), row_seq_.end(), -1);
  std::fill(row_len_.begin(), row_len_.end(), serve_.max_blocks_per_seq);  // zero whole rows on next write
}

}  // namespace ukv
