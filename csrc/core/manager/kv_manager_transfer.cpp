// KvManager: moving a decoding sequence to another manager (disaggregated
// prefill, migration). The exporter describes it (tokens, computed count,
// tables); the importer admits it under the same promise rules as a request
// and replays its prefill as one chunk, so every count, quota and prefix-cache
// rule holds as if it had been computed here. Only the KV rows travel (the
// ops gather_rows and scatter_rows); this file decides which positions' SWA
// rows those are.
#include "core/common/errors.h"
#include "core/manager/kv_manager.h"

namespace ukv {

void KvManager::check_exportable(int64_t seq_id) const {
  const Sequence& s = seq(seq_id);
  // A prefilling sequence still needs SWA rows of its chunk boundaries that a
  // decoding one has freed; the importer would publish blocks without them.
  require<StateError>(is_decoding(s), "sequence ", seq_id,
                      " is still prefilling: export it once its prompt is computed and the token sampled after it "
                      "is committed");
  require<StateError>(s.scheduled == 0, "sequence ", seq_id, " has ", s.scheduled,
                      " positions appended but not committed: export it after commit_decode");
}

int64_t KvManager::import_sequence(int64_t seq_id, const int32_t* tokens, int64_t n, int64_t num_computed,
                                   uint64_t salt) {
  require_new_id(seq_id);
  require(n >= 2 && num_computed == n - 1, "import_sequence: num_computed must be len(tokens) - 1 (a decoding "
          "sequence: every position computed but the last sampled token's), got num_computed=", num_computed,
          " with ", n, " tokens");
  // Full retain keeps whole prefill chunks in SWA; an exported sequence kept
  // only its window, so the replayed chunk would claim rows nobody sent.
  require(!serve_.full_retain, "import_sequence: this manager's config has full_retain (SWA holds whole prefill "
          "chunks), which an imported sequence cannot provide");
  const int64_t computed = n - 1;
  // Under the exporter's salt, so its blocks hash (and hit) as they did there.
  if (!admission(tokens, computed, salt).ok) return refusal(computed);  // before allocate(): it would count a refusal
  const int64_t cached = allocate(seq_id, tokens, computed, salt);
  Sequence& s = seq(seq_id);
  const int64_t chunk = computed - s.num_computed;  // >= 1: a hit never covers the last known token
  apply_ensure(s, chunk);
  // The transfer writes SWA rows from transfer_swa_begin only: blocks whose
  // trailing window starts lower are not published (hittable_blocks).
  s.write_lo = std::max(s.num_computed, transfer_swa_begin(computed));
  apply_commit_prefill(s, chunk, tokens[computed]);
  return cached;
}

}  // namespace ukv
