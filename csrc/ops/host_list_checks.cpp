#include "ops/host_list_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/index_formulas.h"

namespace ukv::ops {
namespace {

// A half-open range of rows (or bytes) one entry reads or writes.
struct Span {
  int64_t key;    // ranges of different keys (tensors) never overlap
  int64_t begin, end;
  bool writes;
  int64_t entry;
};

// The first pair of ranges that overlap where at least one of them writes,
// as (lower entry, higher entry); {-1, -1} when there is none.
std::pair<int64_t, int64_t> first_conflict(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.key != b.key ? a.key < b.key : a.begin < b.begin; });
  // Sorted by start, an earlier range overlaps this one iff it ends after this one begins.
  const Span* longest = nullptr;          // the earlier range of this key reaching furthest
  const Span* longest_write = nullptr;    // the same among the writes
  for (const Span& s : spans) {
    if (longest && longest->key != s.key) longest = longest_write = nullptr;
    const Span* other = longest_write && longest_write->end > s.begin ? longest_write
                        : s.writes && longest && longest->end > s.begin ? longest
                                                                        : nullptr;
    if (other) return std::minmax(other->entry, s.entry);
    if (!longest || s.end > longest->end) longest = &s;
    if (s.writes && (!longest_write || s.end > longest_write->end)) longest_write = &s;
  }
  return {-1, -1};
}

}  // namespace

void check_host_copies(const kernels::RowCopyParams& p) {
  constexpr const char* op = "apply_row_copies";
  for (int32_t phase = 0; phase < p.num_phases; ++phase) {
    const kernels::PhaseSpan span = kernels::phase_span(p, phase);
    std::vector<Span> spans;
    for (int32_t i = span.first; i < span.first + span.count; ++i) {
      const int32_t* c = p.copies + 3 * static_cast<int64_t>(i);
      TORCH_CHECK_VALUE(kernels::copy_in_bounds(p, c[0], c[1], c[2]), op, ": copies[", i, "] = (", c[0], ", ", c[1],
                        ", ", c[2], ") must copy a positive number of rows between two disjoint ranges inside the planes' ",
                        p.plane_rows, " rows");
      spans.push_back({0, c[0], c[0] + static_cast<int64_t>(c[2]), false, i});
      spans.push_back({0, c[1], c[1] + static_cast<int64_t>(c[2]), true, i});
    }
    const auto [a, b] = first_conflict(std::move(spans));
    TORCH_CHECK_VALUE(a < 0, op, ": copies[", a, "] and copies[", b, "] of phase ", phase,
                      " overlap where one of them writes; the copies of one phase run in parallel and must write "
                      "rows no other copy of the phase reads or writes");
  }
}

void check_host_runs(const char* op, const kernels::LayerRowTransferParams& lp) {
  const kernels::RowTransferParams& p = lp.rows;
  std::vector<Span> spans;
  for (int32_t layer = 0; layer < lp.num_layers; ++layer) {
    for (int32_t i = 0; i < kernels::run_count(p); ++i) {
      const int64_t* r = p.runs + 4 * static_cast<int64_t>(i);
      const kernels::RowRun run = kernels::row_run(p, i, lp.layer_offset[layer]);
      TORCH_CHECK_VALUE(run.rows > 0, op, ": runs[", i, "] = (", r[0], ", ", r[1], ", ", r[2], ", ", r[3],
                        ") must name one of the ", p.num_tensors,
                        " tensors and a positive number of rows inside it and the ", p.buffer_bytes, "-byte buffer",
                        lp.num_layers > 1 ? " (in layer " + std::to_string(layer) + ", at its layer offset " +
                                                std::to_string(lp.layer_offset[layer]) +
                                                "; a tensor's rows are the fewest any layer's has)"
                                          : std::string());
      // Only the writes can conflict: buffer bytes (gather) or the tensors' bytes (scatter), by address,
      // since the layers' tensors may be views of one plane (the row space's, a few rows apart).
      const int64_t entry = static_cast<int64_t>(layer) * p.max_runs + i;
      if (p.to_buffer) {
        spans.push_back({0, run.offset, run.offset + run.rows * p.row_bytes[run.tensor], true, entry});
        continue;
      }
      const auto base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(lp.tensors[layer][run.tensor]));
      const int64_t stride = p.row_stride[run.tensor], bytes = p.row_bytes[run.tensor];
      if (stride == bytes) {  // packed rows: one range
        spans.push_back({0, base + run.first_row * stride, base + (run.first_row + run.rows) * stride, true, entry});
        continue;
      }
      for (int64_t row = run.first_row; row < run.first_row + run.rows; ++row)  // rows with gaps between them
        spans.push_back({0, base + row * stride, base + row * stride + bytes, true, entry});
    }
  }
  const auto [a, b] = first_conflict(std::move(spans));
  const auto name = [&](int64_t entry) {
    const std::string run = "runs[" + std::to_string(entry % std::max<int64_t>(p.max_runs, 1)) + "]";
    return lp.num_layers > 1 ? run + " of layer " + std::to_string(entry / p.max_runs) : run;
  };
  TORCH_CHECK_VALUE(a < 0, op, ": ", a < 0 ? std::string() : name(a), " and ", b < 0 ? std::string() : name(b),
                    " write the same ", p.to_buffer ? "buffer bytes" : "tensor rows", "; runs must write disjoint ",
                    p.to_buffer ? "bytes" : "rows");
}

void check_distinct_targets(const char* op, const char* tensors_name, const kernels::LayerRowTransferParams& lp) {
  const kernels::RowTransferParams& p = lp.rows;
  for (int32_t k = 0; k < p.num_tensors; ++k) {
    for (int32_t a = 0; a < lp.num_layers; ++a) {
      for (int32_t b = a + 1; b < lp.num_layers; ++b) {
        TORCH_CHECK_VALUE(lp.tensors[a][k] != lp.tensors[b][k], op, ": ", tensors_name, "[",
                          a * p.num_tensors + k, "] and ", tensors_name, "[", b * p.num_tensors + k,
                          "] (tensor ", k, " of layers ", a, " and ", b, ") start at the same address; every layer's "
                          "runs write the same rows of its own tensors, so one layer's bytes would be lost");
      }
    }
  }
}

}  // namespace ukv::ops
