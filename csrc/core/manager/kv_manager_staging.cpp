// KvManager: staging the batch's tables into the caller's host buffers.
#include <algorithm>

#include "core/manager/kv_manager.h"

namespace ukv {

// Block columns [from, len) and their pages; columns a longer sequence
// staged in this row before left behind are zeroed.
void KvManager::write_row(const Sequence& s, int64_t row, int64_t from, const StagingView& view) {
  const int64_t base = row * view.row_stride, len = static_cast<int64_t>(s.logical.size());
  const auto tables = static_cast<int64_t>(view.phys.size());
  for (int64_t i = from; i < len; ++i) {
    const int32_t id = s.logical[static_cast<size_t>(i)];
    view.logical[base + i] = id;
    for (int64_t t = 0; t < tables; ++t) view.phys[static_cast<size_t>(t)][base + i] = phys_of(t, id);
  }
  for (int64_t j = from * ppb_; j < len * ppb_; ++j) view.swa[base + j] = unit_of(s.swa[static_cast<size_t>(j)]);
  const int64_t old_len = row_len_[static_cast<size_t>(row)];
  for (int64_t i = len; i < old_len; ++i) {
    view.logical[base + i] = 0;
    for (auto* p : view.phys) p[base + i] = 0;
  }
  for (int64_t j = len * ppb_; j < old_len * ppb_; ++j) view.swa[base + j] = 0;
}

void KvManager::stage(const int64_t* seq_ids, int64_t n, const StagingView& view) {
  require(n >= 0 && n <= serve_.max_num_seqs, "stage: batch of ", n, " sequences exceeds max_num_seqs ", serve_.max_num_seqs);
  require(view.row_stride >= serve_.table_cols(), "stage: row_stride ", view.row_stride,
          " is smaller than the tables' columns ", serve_.table_cols());
  require(static_cast<int64_t>(view.phys.size()) == serve_.num_phys_tables(), "stage: expected ",
          serve_.num_phys_tables(), " physical tables");
  require_distinct_known(seq_ids, n, "stage");  // every id known before any row changes
  // Units moved since a row was staged: its envelope and SWA columns changed
  // wherever they point at a moved unit, so the row is written in full.
  const int64_t moves = rows_ ? rows_->counters().moves[0] + rows_->counters().moves[1] : 0;
  for (int64_t r = 0; r < n; ++r) {
    Sequence& s = seq(seq_ids[r]);
    const bool same = row_seq_[static_cast<size_t>(r)] == seq_ids[r] && s.stage_row == r && s.staged_moves == moves;
    write_row(s, r, same ? std::min(s.dirty_lo, static_cast<int64_t>(s.logical.size())) : 0, view);
    row_seq_[static_cast<size_t>(r)] = seq_ids[r];
    row_len_[static_cast<size_t>(r)] = static_cast<int64_t>(s.logical.size());
    s.stage_row = r;
    s.dirty_lo = static_cast<int64_t>(s.logical.size());
    s.staged_moves = moves;
  }
}

void KvManager::invalidate_staging() {
  std::fill(row_seq_.begin(), row_seq_.end(), -1);
  std::fill(row_len_.begin(), row_len_.end(), serve_.max_blocks_per_seq);  // zero whole rows on next write
}

}  // namespace ukv
