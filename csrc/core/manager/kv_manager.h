// KvManager: the sequence-level KV manager of the unified pool (upstream's
// BlockManager and SlidingWindowPool, with ukv's fixes), torch-free.
//
// It owns the logical compress blocks (prefix cache), the sliding-window block
// pool, and either the unified Coordinator (SWA and per-type compress share
// slots; every logical block is bound to one physical block per compress type)
// or the static split (logical == physical compress ids, a private SWA pool).
//
// Admission is joint and a yes is a promise. Every live sequence holds an SWA
// quota: an upper bound on the SWA blocks it can hold at once (window spans of
// the previous and the current chunk, or the decode window plus speculative
// tokens). The manager keeps   SWA capacity (free + held slots) >= sum of
// quotas + checkpoint reserve (+ the whole-chunk reserve, set_whole_chunks)   at
// all times, and checks compress borrowing against the SWA demand still
// outstanding, so no later ensure_for_tokens or
// append can run out of slots (upstream's separate SWA and compress checks
// could count one released slot twice and crash there). Re-allocating a free
// logical block that still holds a binding is net-zero and not counted as
// demand, so a full own region cannot livelock admission.
// Cached compress blocks whose bindings occupy shared slots are reclaimed for
// SWA, coldest slot first, only when an admission or append needs the room.
// A true allocation takes the longest-free logical blocks; where binding the
// never-bound ones among them would open a shared slot, or would not fit at
// all, the fewest of those give way to the coldest cached blocks that hold a
// binding (evicting their content), so the cache never strands compress
// memory and live compress blocks pin no SWA slot the cache could spare.
//
// Every public operation validates its arguments and capacity first and
// either completes or throws with no state changed. Not thread-safe (the
// torch class serialises calls). Deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/manager/block_hash.h"
#include "core/common/ceil_div.h"
#include "core/slots/coordinator.h"
#include "core/manager/kv_events.h"
#include "core/manager/logical_blocks.h"
#include "core/config/pool_sizes.h"
#include "core/row_space/row_space.h"
#include "core/config/serve_config.h"
#include "core/slots/swa_blocks.h"

namespace ukv {


// Host memory the manager writes a batch's tables into (the torch layer owns
// it: pinned buffers mirrored on the device). Each table is row-major
// [max_num_seqs, row_stride] int32; phys has one table per compress type
// (one envelope table in the row-space layout). The SWA table has a column
// per SWA page, the others one per block.
struct StagingView {
  int32_t* logical;
  int32_t* swa;
  std::vector<int32_t*> phys;
  int64_t row_stride;
};

struct KvManagerStats {
  int64_t admissions = 0, admission_refusals = 0;
  int64_t appends = 0, append_refusals = 0;
  int64_t prefix_query_blocks = 0;   // blocks looked up at admission
  int64_t compressed_hit_blocks = 0; // compress-prefix matches
  int64_t prefix_hit_blocks = 0;     // hits after the SWA trailing-window gate
  int64_t reclaimed_slots = 0;       // shared slots taken back from cached compress blocks
  int64_t reclaimed_blocks = 0;      // cached logical blocks dropped to do so
  int64_t compress_evictions = 0;    // cached blocks that stood in for never-bound ones (content evicted)
  int64_t whole_chunks = 0;          // prefill chunks whose every position got an SWA page
};

class KvManager {
 public:
  // Validates both (InvalidArgument naming the field) before building anything.
  KvManager(const ServeConfig& config, const PoolSizes& pools);
  KvManager(const KvManager&) = delete;  // the coordinator's listener points at this object
  KvManager& operator=(const KvManager&) = delete;

  const ServeConfig& config() const { return serve_; }
  const PoolSizes& pools() const { return pools_; }
  int64_t num_types() const { return serve_.num_types(); }
  // SWA pages a prefix hit needs present before its end (the trailing window).
  int64_t tail_pages() const { return tail_pages_; }
  // SWA quota bounds in pages: a prefilling sequence, a decoding one (window + 2 speculative spans).
  int64_t prefill_quota_bound() const { return prefill_peak_; }
  int64_t decode_quota_bound() const { return decode_peak_; }
  bool has_sequence(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  // --- admission of a new request (its known tokens: prompt, or prompt +
  // generated tokens when a preempted request resumes) ---
  // A refusal: kNotNow while live sequences hold what it needs (or max_num_seqs
  // sequences are live), kNeverFits when it would not fit even with none live.
  static constexpr int64_t kNotNow = -1;
  static constexpr int64_t kNeverFits = -2;
  // salt isolates the request's prefix cache: it seeds block 0's hash
  // (block_hash.h), so it hits and publishes only blocks of requests with
  // the same salt; 0 is no salt. A resumed request passes its salt again.
  // The cached prefix in tokens allocate() would give, or a refusal.
  int64_t can_allocate(const int32_t* tokens, int64_t n, uint64_t salt = 0) const;
  // Admits the request: returns its cached tokens (prefill starts there), or
  // a refusal with nothing changed. seq_id must be >= 0 and not live.
  int64_t allocate(int64_t seq_id, const int32_t* tokens, int64_t n, uint64_t salt = 0);

  // --- prefill (batch calls: every entry is validated before any changes) ---
  // Materialises the SWA pages each sequence's next chunk of counts[i] tokens
  // writes: its last window always (admission promised those), and, where
  // the pools have room beyond every promise, the whole chunk, so that every
  // block of it can serve a later prefix hit whatever the chunking. The
  // positions that got pages are the ones the model writes (swa_slot_mapping).
  void ensure_for_tokens(const int64_t* seq_ids, const int64_t* counts, int64_t n);
  // The chunks' KV was computed: publish the blocks a later request can hit,
  // advance, free the window. counts[i] must be what ensure_for_tokens
  // provisioned for the chunk (or 0). sampled[i] >= 0 is the token sampled
  // after a prompt's last chunk, -1 none.
  void commit_prefill(const int64_t* seq_ids, const int64_t* counts, const int32_t* sampled, int64_t n);

  // --- decode (num_new_tokens[i] = 1 + the draft tokens of sequence i this step) ---
  // Length of the longest prefix of seq_ids that append() can serve jointly.
  int64_t can_append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n) const;
  void append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n);
  // The step computed KV for counts[i] positions of sequence i, whose new
  // tokens (accepted drafts and the bonus token) are the next counts[i]
  // entries of tokens.
  void commit_decode(const int64_t* seq_ids, const int64_t* counts, const int32_t* tokens, int64_t n);

  void deallocate(const int64_t* seq_ids, int64_t n);
  void clear_cache();

  // --- moving a decoding sequence between managers (kv_manager_transfer.cpp) ---
  // Throws unless the sequence can be exported now: it decodes (its prompt is
  // computed and a token sampled after it) and no append() awaits its commit.
  void check_exportable(int64_t seq_id) const;
  // The positions whose SWA rows travel with a sequence of `num_computed`
  // computed positions: the window - 1 before it, which the next decode step
  // reads (its own position is written by that step).
  int64_t transfer_swa_begin(int64_t num_computed) const {
    return std::max<int64_t>(0, num_computed - (serve_.window - 1));
  }
  // Admits a sequence exported by another manager as decoding: tokens[0, n)
  // its known tokens, num_computed == n - 1. Same promise rules as allocate()
  // (a refusal, kNotNow or kNeverFits, changes nothing, not even the refusal
  // count); on success the sequence holds the blocks of its computed
  // positions and the SWA pages of its last window, as if it had been
  // prefilled here in one chunk, and the return value is the cached prefix
  // in tokens: the positions below it already hold their KV here, the
  // transfer fills the rest (its full blocks are published once their KV is
  // in place, by the same rule as prefill).
  int64_t import_sequence(int64_t seq_id, const int32_t* tokens, int64_t n, int64_t num_computed, uint64_t salt = 0);

  // --- KV tiers beyond HBM (kv_manager_tiers.cpp) ---
  // allocate(), with tokens [0, loaded) found in a tier beyond the HBM hit
  // (loaded a multiple of block_size below n; 0 or at most the HBM hit:
  // plain allocate). Same answers and refusals as allocate(), nothing changed
  // on a refusal; on success the return value is max(HBM hit, loaded), and the
  // sequence holds, for positions [HBM hit, loaded), their blocks and the SWA
  // pages of the window - 1 positions before `loaded`: the caller writes those
  // rows (their compress rows and those SWA rows) before the first chunk runs.
  // They are published by the first commit_prefill, not before. In the row
  // space, fewer tokens are loaded where the step's copy list (its share for
  // loads) has no room to bind all their units (the rest stays prompt): fill
  // up to the return value.
  int64_t allocate_loaded(int64_t seq_id, const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt = 0);
  // What allocate_loaded would answer now (a refusal, or how far the sequence's
  // computed prefix would reach); changes nothing.
  int64_t can_allocate_loaded(const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt = 0) const;
  // Whole chunks (the tier layer turns it on): every prefill chunk gets the
  // SWA pages of all its positions, not only of its last window, so each
  // block boundary inside a prompt has its trailing window written and
  // published, and a tier can save a tail object there. The pages below a
  // chunk's window come from a reserve of whole_chunk_pages() pages that
  // every admission keeps apart (counted in swa_reserved), enough for a
  // step's chunks within max_num_batched_tokens; they go back at the chunk's
  // commit. Beyond the reserve (chunks of earlier steps not yet committed, a
  // step over the budget) a chunk is whole only where the pools have room
  // beyond every promise, as with the mode off. Turning it on is refused
  // (OutOfSlots, nothing changed) while the live sequences' promises leave no
  // room for the reserve.
  void set_whole_chunks(bool on);
  bool whole_chunks() const { return whole_chunks_; }
  int64_t whole_chunk_pages() const { return whole_chunk_pages_; }
  // Where the blocks (and SWA pages) with these hashes and tokens (block_size,
  // resp. swa_page, tokens each, concatenated) hold their KV now, live or
  // cached: per block its logical id then its phys_table entry per table
  // (1 + num_phys_tables ints), per page its staged SWA unit; -1 where the
  // manager holds none. StateError while row copies are pending.
  void locate_blocks(const CacheKey* hashes, const int32_t* tokens, int64_t n, int32_t* out) const;
  void locate_pages(const CacheKey* hashes, const int32_t* tokens, int64_t n, int32_t* out) const;
  uint64_t salt(int64_t seq_id) const { return seq(seq_id).salt; }
  // Which admission made the sequence live, and the cached prefix it returned
  // (what scatter_sequence must leave alone after import_sequence).
  int64_t generation(int64_t seq_id) const { return seq(seq_id).generation; }
  int64_t cached_prefix(int64_t seq_id) const { return seq(seq_id).cached; }

  // --- tables ---
  const std::vector<int32_t>& logical_table(int64_t seq_id) const;
  // The sequence's SWA pages, one entry per page (-1: none): the ids the
  // manager knows them by (in the row-space layout, virtual pages).
  const std::vector<int32_t>& swa_table(int64_t seq_id) const;
  // The physical tables as staged: a compress type's blocks (the logical ids
  // in the static split, envelopes in the row-space layout: type 0, where a
  // block no chunk has reached yet has none and reads 0), and the SWA units
  // of the pages.
  std::vector<int32_t> phys_table(int64_t seq_id, int64_t type) const;
  std::vector<int32_t> staged_swa_table(int64_t seq_id) const;
  int64_t num_computed(int64_t seq_id) const;
  int64_t num_tokens(int64_t seq_id) const;
  const std::vector<int32_t>& tokens(int64_t seq_id) const;
  // The prefix-cache hash chain of the sequence's published blocks.
  const std::vector<CacheKey>& block_hashes(int64_t seq_id) const;
  // Writes rows 0..n-1 of every table for these sequences (an SWA page the
  // sequence does not hold is -1: the kernels that read SWA rows clamp it,
  // and the write-row op skips its positions; unused columns 0).
  // Incremental: a row already holding a sequence gets only what changed
  // since (all of it after units moved). Throws on unknown or repeated ids.
  void stage(const int64_t* seq_ids, int64_t n, const StagingView& view);
  void invalidate_staging();  // the next stage() rewrites every row in full

  // The most units the row space may move to bind one unit: the copies one
  // bind can add to the step's list.
  static int64_t moves_per_bind(const PoolSizes& p);
  // The copy list's room for one step's prefill chunks and for its decode appends.
  static int64_t prefill_copy_share(const ServeConfig& c, const PoolSizes& p);
  static int64_t decode_copy_share(const ServeConfig& c, const PoolSizes& p);
  // The KV events since the last call (kv_events.h), in order.
  KvEventBatch take_events() { return events_.take(); }
  const KvManagerStats& stats() const { return stats_; }
  int64_t free_logical_blocks() const { return logical_.free_count(); }
  int64_t free_swa_slots() const { return swa_ ? swa_->free_slots() : 0; }
  int64_t held_swa_slots() const { return swa_ ? swa_->held_slots() : 0; }
  int64_t swa_reserved() const { return swa_reserved_; }
  int64_t reclaimable_slots() const { return reclaimable_.size(); }
  const Coordinator* coordinator() const { return coord_.get(); }
  const RowSpace* row_space() const { return rows_.get(); }
  // Row-space layout: the row copies since the last call (units moved to make
  // room), to apply before the step that reads the rows. Empty otherwise.
  std::vector<RowCopy> take_copies() {
    step_decode_copies_ = 0;
    load_moves_ = 0;
    return rows_ ? rows_->take_copies() : std::vector<RowCopy>{};
  }
  const LogicalBlocks& logical_blocks() const { return logical_; }

  void check_invariants() const;
  std::vector<int64_t> to_state() const;
  static std::unique_ptr<KvManager> from_state(const std::vector<int64_t>& state);

 private:
  struct Sequence {
    std::vector<int32_t> tokens;
    int64_t num_prompt = 0, num_computed = 0;
    std::vector<int32_t> logical;
    std::vector<int32_t> swa;        // one entry per page of the logical blocks
    std::vector<CacheKey> hashes;    // chain over the published blocks [0, hashes.size())
    uint64_t salt = 0;               // seeds hashes[0]
    // The admission that made it live (the admissions count then): an export
    // taken before a deallocate and the id's reuse names another generation.
    int64_t generation = 0;
    int64_t cached = 0;              // the cached prefix allocate / import_sequence returned
    int64_t swa_written_lo = 0;      // SWA rows of positions [lo, num_computed) are all written
    int64_t swa_freed_upto = 0;      // pages [0, this) are window-freed (-1)
    int64_t swa_quota = 0;
    int64_t swa_held = 0;
    int64_t extra_pages = 0;         // pages below the chunk's window held beyond the quota (released at commit)
    int64_t ensured = 0;             // tokens ensure_for_tokens provisioned for the next chunk
    int64_t write_lo = 0;            // the chunk's SWA is written from this position (ensure_for_tokens)
    int64_t scheduled = 0;           // positions the last append() scheduled, not yet committed
    int64_t stage_row = -1, dirty_lo = 0;  // dirty_lo: the first block column changed since staged
    int64_t staged_moves = 0;        // row space: units moved before the last stage
    mutable uint64_t batch_mark = 0;  // == batch_mark_ while a batch call validates it
  };
  // The free logical blocks a true allocation takes, in free-list order.
  struct FreshBlocks {
    std::vector<int64_t> ids;
    int64_t demand = 0;     // how many need room: new physical blocks per type (row space: all of them)
    int64_t evicted = 0;    // cached bound blocks whose content is evicted for them
    int64_t cursor = -1;    // the next free-list block the walk has not looked at
  };
  using FitsFn = std::function<bool(const FreshBlocks&)>;
  struct Admission {
    bool ok = false;
    int64_t compressed_hit = 0;   // compress-prefix match, before the SWA gate
    int64_t cached_blocks = 0;    // hits after the gate
    FreshBlocks fresh;            // the blocks allocate() takes after the hits
    int64_t quota = 0;
    std::vector<CacheKey> hashes;
    std::vector<int64_t> hit_ids;
  };

  void install_evict_listener();
  Sequence& seq(int64_t seq_id);
  const Sequence& seq(int64_t seq_id) const;
  // A sequence decodes once its prompt is computed and the token sampled
  // after it was committed; from then on num_tokens == num_computed + 1.
  static bool is_decoding(const Sequence& s) { return static_cast<int64_t>(s.tokens.size()) > s.num_prompt; }
  int64_t blocks_for(int64_t tokens) const { return ceil_div(tokens, serve_.block_size); }
  // SWA pages a sequence of this many blocks may hold at once.
  int64_t quota_for(int64_t num_blocks, bool decoding) const {
    return std::min(decoding ? decode_peak_ : prefill_peak_, num_blocks * ppb_);
  }
  int64_t page_of(int64_t pos) const { return pos / page_; }
  int64_t checkpoint_reserve() const { return swa_ ? swa_->checkpoint_capacity() : 0; }
  bool capacity_ok(int64_t extra_quota, int64_t compress_demand, const std::vector<int64_t>& reclaim = {}) const;
  // Room now, or once the cached compress slots are reclaimed that stay
  // reclaimable after the free blocks `going_live` (hits, blocks to pop) go live.
  bool capacity_ok_with_reclaim(int64_t extra_quota, int64_t compress_demand, const std::vector<int64_t>& going_live) const;
  void reclaim_until(int64_t extra_quota, int64_t compress_demand);
  void reclaim_one_slot();

  Admission admission(const int32_t* tokens, int64_t n, uint64_t salt) const;
  bool fits_empty_pools(int64_t blocks, int64_t quota) const;
  int64_t refusal(int64_t n) const;
  FreshBlocks fresh_walk() const { return {{}, 0, 0, logical_.free_list().front()}; }
  void take_longest_free(FreshBlocks& fresh, int64_t add, const std::vector<int64_t>& skip) const;
  bool stand_in_cached(FreshBlocks& fresh, const std::vector<int64_t>& skip) const;
  int64_t room_without_borrowing() const;
  bool settle_fresh(FreshBlocks& fresh, const std::vector<int64_t>& skip, const FitsFn& fits) const;
  bool choose_fresh(int64_t count, const std::vector<int64_t>& skip, const FitsFn& fits, FreshBlocks& fresh) const;
  FreshBlocks choose_row_space_fresh(int64_t count, const std::vector<int64_t>& skip) const;
  int64_t plan_append(const int64_t* seq_ids, const int64_t* num_new_tokens, int64_t n, FreshBlocks& fresh,
                      int64_t& extra_quota) const;
  int64_t bounded_hit(const int32_t* tokens, int64_t hit, const std::vector<CacheKey>& hashes) const;
  // The SWA page id cached for page j of a prefix with these block hashes, -1 if absent.
  int64_t lookup_page(const int32_t* tokens, int64_t page, const std::vector<CacheKey>& hashes) const;
  // The key of the block_size tokens at `tokens` after the block keyed parent (nullptr: block 0, seeded by salt).
  CacheKey block_key(const int32_t* tokens, const CacheKey* parent, uint64_t salt) const {
    return block_hash(serve_.prefix_hash, tokens, static_cast<size_t>(serve_.block_size), parent, salt);
  }
  CacheKey page_hash(const CacheKey& block_hash, int64_t page) const {
    return swa_page_hash(serve_.prefix_hash, block_hash, page % ppb_, ppb_);
  }
  bool is_checkpoint(const Sequence& s, int64_t block) const;

  int64_t take_block(int64_t id);
  void bind_popped(const std::vector<int64_t>& ids);
  void bind_envelopes(const std::vector<int64_t>& ids);
  // Admission in the row space: cached blocks go live on their envelopes,
  // the others are reserved (bound by the chunk that writes them), so one
  // step binds, and moves for, at most what it computes.
  void reserve_envelopes(const std::vector<int64_t>& ids);
  void bind_chunk_envelopes(Sequence& s, int64_t num_new_tokens);
  void alloc_binding(int64_t type, int64_t id);
  void release_phys(int64_t type, int32_t phys);
  void free_binding(int64_t type, int64_t id);
  void unbind(int64_t id);
  void on_live_change(int64_t id, int delta);
  void on_live_change(int64_t type, int64_t id, int delta);
  void on_compress_freed(int64_t type, int64_t phys);
  void update_reclaimable(int64_t slot);
  int64_t shared_slot_of(int64_t type, int64_t phys) const;

  void require_distinct_known(const int64_t* seq_ids, int64_t n, const char* what) const;
  void require_new_id(int64_t seq_id) const;
  void require_no_pending_copies(const char* what) const;
  int64_t loadable(const int32_t* tokens, int64_t n, int64_t loaded, uint64_t salt) const;
  void check_loaded(int64_t n, int64_t loaded) const;
  int64_t missing_swa_pages(const Sequence& s, int64_t num_new_tokens) const;
  // The reservation held for pages below chunks' windows: the whole-chunk
  // reserve while the mode is on, or what the chunks hold, the larger.
  int64_t chunk_reserve(int64_t extra_pages) const {
    return std::max(whole_chunks_ ? whole_chunk_pages_ : 0, extra_pages);
  }
  void set_extra_pages(Sequence& s, int64_t pages);
  // Pages [first, last] of the sequence's positions written this chunk.
  std::pair<int64_t, int64_t> chunk_pages(const Sequence& s, int64_t num_new_tokens) const;
  void check_ensure(int64_t seq_id, int64_t num_new_tokens) const;
  // Units the chunk binds in the row space (envelopes of the blocks it
  // writes that have none, and missing pages).
  int64_t chunk_units(const Sequence& s, int64_t num_new_tokens) const;
  // Copies the step's prefill chunks may still add to the row space's list.
  int64_t prefill_copy_room() const;
  void check_commit_prefill(int64_t seq_id, int64_t num_tokens, int32_t sampled) const;
  void check_commit_decode(int64_t seq_id, int64_t count) const;
  void apply_ensure(Sequence& s, int64_t num_new_tokens);
  // The pages below the chunk's window, if the pools can give them now beyond
  // every promise; true when they were given.
  bool ensure_whole_chunk(Sequence& s);
  // Blocks [hashes.size(), this) may be published: the highest block
  // boundary whose SWA tail the sequence wrote (a hit can end there).
  int64_t hittable_blocks(const Sequence& s) const;
  void apply_commit_prefill(Sequence& s, int64_t num_tokens, int32_t sampled);
  void apply_commit_decode(Sequence& s, const int32_t* tokens, int64_t count);
  void apply_deallocate(int64_t seq_id);
  void push_block(Sequence& s, int64_t id);
  // A logical block's id in physical table `table` (the staged value), and an
  // SWA page's unit (-1 stays -1).
  int32_t phys_of(int64_t table, int32_t id) const;
  int32_t unit_of(int32_t page) const;
  // A logical block's last reference went (it is free, cached if hashed) or a
  // free one was claimed by a prefix hit.
  void on_block_freed(int64_t id);
  void on_block_claimed(int64_t id);
  void alloc_page(Sequence& s, int64_t page);
  void publish_full_blocks(Sequence& s);
  void free_out_of_window(Sequence& s, int64_t seq_len);
  void write_row(const Sequence& s, int64_t row, int64_t from, const StagingView& view);
  void check_row_space_invariants() const;
  // The sequence's keys are the prefix_hash chain of its tokens under its salt.
  void check_hash_chain(int64_t id, const Sequence& s) const;
  void write_sequence(StateWriter& w, int64_t id, const Sequence& s) const;
  void read_sequence(StateReader& r);

  ServeConfig serve_;
  KvEventLog events_;               // before the pools whose content changes it records
  PoolSizes pools_;                 // type_slots resolved (slot_counts when it was empty)
  std::vector<int64_t> ks_;         // rows per block of each compress type
  int64_t page_ = 0, ppb_ = 1;      // tokens per SWA page, pages per block
  int64_t tail_pages_ = 0, retention_blocks_ = 0, prefill_peak_ = 0, decode_peak_ = 0;
  std::unique_ptr<Coordinator> coord_;
  std::unique_ptr<RowSpace> rows_;  // the row-space layout's units
  LogicalBlocks logical_;
  std::unique_ptr<SwaBlocks> swa_;
  std::vector<std::vector<int32_t>> owner_of_phys_;  // [type][phys] -> logical id or -1 (unified)
  std::vector<int32_t> live_in_slot_;                // live bindings per shared slot
  SlotList reclaimable_;                             // busy shared slots holding only cached bindings
  SlotList unbound_free_;                            // row space: free logical blocks without an envelope
  std::unordered_map<int64_t, Sequence> seqs_;
  int64_t swa_reserved_ = 0;                         // sum of quotas + checkpoint reserve + chunk_reserve(extra_pages_)
  bool whole_chunks_ = false;
  int64_t whole_chunk_pages_ = 0;                    // the whole-chunk reserve (set_whole_chunks)
  int64_t extra_pages_ = 0;                          // the sequences' extra_pages, summed
  // Row space: blocks of live sequences that have no envelope yet (a chunk
  // binds its blocks' envelopes when ensure_for_tokens reaches them).
  int64_t envelopes_reserved_ = 0;
  // Row space: copies append() added since the last take_copies(). They come
  // out of the decode share, so the prefill share stays whole for the chunks.
  int64_t step_decode_copies_ = 0;
  std::vector<int64_t> row_seq_, row_len_;           // staging rows: sequence and length last written
  int64_t load_moves_ = 0;                           // row space: pending copies loads made (their share)
  KvManagerStats stats_;
  mutable uint64_t batch_mark_ = 0;
};

}  // namespace ukv
