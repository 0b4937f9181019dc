"""The model-based serving engine of the KV manager tests: Serving drives
ukv_torch.KvManager and the pure-Python KvManagerModel
(ukv_torch.testing.kv_manager_model) through one engine run and checks after
every call, and replays the manager's KV events into a router's cache index
(support.kv_event_index) that must predict every admission's cached prefix;
requests carry cache salts, so prompts repeat across tenants, whose caches
never share a block; DeviceMemory simulates what each KV row holds; CONFIGS are the
slot-layout configurations the runs cover (the row space's are in
support.row_space_serving)."""
import collections
import random

import ukv_torch
from ukv_torch.testing.allocator_model import ceil_div
from support.kv_event_index import index_for
from ukv_torch.testing.kv_manager_model import NEVER_FITS, PLACEMENT_STATS, KvManagerModel

# Cache salts of the requests: unsalted ones, an int tenant and a bytes one.
SALTS = [None, None, 7, b"tenant-b"]


def prefix_keys(tokens, upto, keys, salt=None):
    """keys[p] identifies tokens[0..p] under the salt (another tenant's or
    adapter's KV of the same tokens differs); extends keys to cover positions < upto."""
    while len(keys) < upto:
        p = len(keys)
        keys.append(hash((keys[-1] if keys else ("salt", salt), tokens[p])))
    return keys


class DeviceMemory:
    """What each row of each layer tensor holds: the key of the token prefix
    whose KV was written there (None = never written).

    Tensor 'dense' has the SWA rows only; compress tensor t has the SWA rows
    [0, swa_pages) too, and its compress rows at base + phys * k. An SWA page
    is a block here: page w is rows [w * bs, (w + 1) * bs).
    """

    def __init__(self, cfg, ks, type_rows, compress_base):
        self.bs = cfg["block_size"]
        self.ks = list(ks)
        self.base = compress_base
        self.swa_rows = cfg["num_swa_blocks"] * self.bs
        self.dense = [None] * self.swa_rows
        self.types = [[None] * rows for rows in type_rows]

    def write_swa(self, page, pos, key):
        assert page >= 0, "a forward writes SWA rows through a -1 table entry"
        row = page * self.bs + pos % self.bs
        self.dense[row] = key
        for mem in self.types:
            mem[row] = key

    def read_swa(self, page, lo, hi):
        """What each tensor holds for positions [lo, hi) of one page."""
        assert page >= 0, "a forward reads SWA rows through a -1 table entry"
        first = page * self.bs + lo % self.bs
        return [mem[first:first + hi - lo] for mem in [self.dense] + self.types]

    def write_compress(self, t, phys, entry, key):
        self.types[t][self.base + phys * self.ks[t] + entry] = key

    def read_compress(self, t, phys, lo, hi):
        """Entries [lo, hi) of compress block phys of type t."""
        first = self.base + phys * self.ks[t]
        return self.types[t][first + lo:first + hi]


class Serving:
    """Drives both managers through one engine run and checks after every call."""

    def __init__(self, cfg, seed, whole_chunks=False):
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.cpp = ukv_torch.KvManager(**cfg)
        self.model = KvManagerModel(**cfg)
        if whole_chunks:  # as a KV tier runs them
            self.cpp.set_whole_chunks(True)
            self.model.set_whole_chunks(True)
        self.bs = cfg["block_size"]
        self.page = self.cpp.config.swa_page
        self.ks, self.ratios = list(self.cpp.config.compress_ks), list(self.cpp.config.compress_ratios)
        self.window = cfg.get("window", 128)
        self.mtp_k = cfg.get("mtp_k", 0)
        self.mem = self.make_memory()
        self.index = index_for(self.cpp)
        self.seqs = {}              # seq id -> dict(tokens, keys, target)
        self.waiting = collections.deque()
        self.finished_tokens = []   # for repeats and a conversation's follow-up requests
        self.next_id = 0
        self.calls = 0
        self.never_fits = 0         # requests refused for good (and dropped)
        self.preemptions = 0
        self.system_prompts = [self.fresh(n) for n in (2 * self.bs, 3 * self.bs + 17, self.bs + 50)]

    def make_memory(self):
        cfg, bs = self.cfg, self.bs
        ns, nb = cfg["num_swa_blocks"], cfg["num_logical_blocks"]
        if self.cpp.config.unified:
            slots = cfg.get("type_slots") or ukv_torch.slot_counts(ns, nb, self.ratios, bs)
            return DeviceMemory(cfg, self.ks, [s * bs for s in slots], 0)
        return DeviceMemory(cfg, self.ks, [ns * bs + nb * k for k in self.ks], ns * bs)

    # ------------------------------------------------------------ plumbing --
    def fresh(self, n):
        return [self.rng.randrange(1, 1 << 20) for _ in range(n)]

    def both(self, name, *args, **kwargs):
        """The same call on both managers; results, stats and events must agree."""
        self.calls += 1
        got = getattr(self.cpp, name)(*args, **kwargs)
        want = getattr(self.model, name)(*args, **kwargs)
        assert got == want, f"{name}{args[:1]}: C++ {got} != model {want}"
        self.cpp.check_invariants()
        self.sync_model()
        assert self.cpp_stats() == self.model.stats(), name
        events = self.cpp.take_events()
        assert events == self.model.take_events(), name
        self.index.apply(events)
        return got

    def sync_model(self):
        """Called after every call, before the comparison (the row space brings
        the model up to evictions it does not predict here)."""

    def cpp_stats(self):
        return {k: v for k, v in self.cpp.stats().items() if k not in PLACEMENT_STATS}

    def compare_tables(self, sid):
        for name in ("logical_table", "swa_table"):
            assert getattr(self.cpp, name)(sid).tolist() == getattr(self.model, name)(sid), (name, sid)
        self.compare_phys_tables(sid)
        assert self.cpp.num_computed(sid) == self.model.num_computed(sid)
        assert self.cpp.num_tokens(sid) == self.model.num_tokens(sid)

    def compare_phys_tables(self, sid):
        for t in range(len(self.ks)):
            assert self.cpp.phys_table(sid, t).tolist() == self.model.phys_table(sid, t), ("phys", t, sid)

    def tables(self, sid):
        """(logical blocks, the SWA table's entries, each compress type's physical
        blocks) as the forward addresses memory with them."""
        return (self.model.logical_table(sid), self.model.swa_table(sid),
                [self.model.phys_table(sid, t) for t in range(len(self.ks))])

    def placed(self):
        """Called after every call that may give out memory, before the step
        touches it (the row space applies its moves here)."""

    # ------------------------------------------------- simulated forwards --
    def keys(self, sid, upto):
        s = self.seqs[sid]
        return prefix_keys(s["tokens"], upto, s["keys"], s["salt"])

    def check_reads(self, sid, start):
        """A forward starting at `start` reads the SWA rows of (start - window, start)
        and every compress entry completed before start."""
        _, swa, phys = self.tables(sid)
        keys = self.keys(sid, start)
        self.check_swa(sid, swa, keys, max(0, start - self.window + 1), start)
        self.check_compress(sid, phys, keys, start)

    def check_swa(self, sid, swa, keys, lo, hi):
        """The SWA rows of positions [lo, hi) hold those positions' keys in every tensor."""
        for j in range(lo // self.page, (hi - 1) // self.page + 1 if hi > lo else 0):
            a, b = max(lo, j * self.page), min(hi, (j + 1) * self.page)
            for got in self.mem.read_swa(swa[j], a, b):
                assert got == keys[a:b], f"seq {sid} reads stale SWA rows of positions [{a}, {b})"

    def check_compress(self, sid, phys, keys, upto):
        """Every compress entry completed before upto holds the key of its last position."""
        for t, k in enumerate(self.ks):
            ratio = self.bs // k
            for block in range(ceil_div(upto // ratio, k)):
                lo, hi = block * k, min((block + 1) * k, upto // ratio)
                want = keys[lo * ratio + ratio - 1:hi * ratio:ratio]
                assert self.mem.read_compress(t, phys[t][block], 0, hi - lo) == want, \
                    f"seq {sid} type {t} block {block} holds foreign content"

    def write_swa(self, sid, positions, keys):
        """The model writes the SWA rows of every position whose page the table holds."""
        swa = self.tables(sid)[1]
        for p in positions:
            if swa[p // self.page] >= 0:
                self.mem.write_swa(swa[p // self.page], p, keys[p])
                self.seqs[sid]["written"].add(p)

    def write_compress(self, sid, start, end):
        phys = self.tables(sid)[2]
        keys = self.keys(sid, end)
        for t, k in enumerate(self.ks):
            ratio = self.bs // k
            for e in range(start // ratio, end // ratio):
                if e * ratio + ratio - 1 >= start:
                    self.mem.write_compress(t, phys[t][e // k], e % k, keys[e * ratio + ratio - 1])

    def check_ownership(self):
        """No row owned twice: an SWA page or a compress block appears in live
        tables only for one content at one position; in the unified layout no
        compress block of a live table sits in a slot a live SWA entry holds."""
        swa_owner, cmp_owner = {}, [dict() for _ in self.ks]
        for sid in self.model.seqs:
            logical, swa, phys = self.tables(sid)
            keys = self.keys(sid, min(len(self.seqs[sid]["tokens"]), len(logical) * self.bs))
            for j, w in enumerate(swa):
                end = (j + 1) * self.page
                content = (j, keys[end - 1]) if end <= len(keys) else (j, "partial", sid)
                if w >= 0:
                    assert swa_owner.setdefault(w, content) == content, f"SWA page {w} owned twice"
            for i, b in enumerate(logical):
                end = (i + 1) * self.bs
                content = (i, keys[end - 1]) if end <= len(keys) else (i, "partial", sid)
                for t in range(len(self.ks)):
                    assert cmp_owner[t].setdefault(phys[t][i], (b, content)) == (b, content), \
                        f"type {t} block {phys[t][i]} owned twice"
        if self.cpp.config.unified:
            for t, k in enumerate(self.ks):
                per_slot = self.bs // k
                for p in cmp_owner[t]:
                    assert p // per_slot not in swa_owner, f"type {t} block {p} aliases a live SWA slot"

    # ---------------------------------------------------------- the engine --
    def new_request(self):
        bs, r = self.bs, self.rng.random()
        if r < 0.35:
            tokens = self.rng.choice(self.system_prompts) + self.fresh(self.rng.randrange(1, 2 * bs))
        elif r < 0.55:
            tokens = self.fresh(self.rng.randrange(2 * bs, 5 * bs))  # unique filler: forces eviction
        elif r < 0.7 and self.finished_tokens:
            tokens = list(self.rng.choice(self.finished_tokens))     # an exact repeat
        elif r < 0.85 and self.finished_tokens:                      # a conversation's follow-up request
            tokens = list(self.rng.choice(self.finished_tokens)) + self.fresh(self.rng.randrange(1, bs))
        else:
            tokens = self.fresh(self.rng.randrange(1, bs))
        limit = self.cfg["max_blocks_per_seq"] * bs // 2
        gen = self.rng.randrange(1, bs // 4) if self.rng.random() < 0.7 else self.rng.randrange(bs, 2 * bs)
        return tokens[:limit], gen, self.rng.choice(SALTS)

    def admit(self):
        """Admit from the head of the queue until a refusal: the live limit
        (max_num_seqs) is the manager's to enforce; a request that never fits
        is dropped, as an engine rejects it."""
        while self.waiting:
            tokens, gen, salt = self.waiting[0]
            self.before_admission(tokens, salt)
            hit = self.both("can_allocate", tokens, salt=salt)
            if hit >= 0:  # the router's index knows what the cache holds for this tenant
                assert self.index.predict(tokens, salt) == hit, "the replayed KV events mispredict the hit"
            cached = self.both("allocate", self.next_id, tokens, salt=salt)
            assert cached == hit, "can_allocate and allocate disagree"
            if cached == NEVER_FITS:
                self.waiting.popleft()
                self.never_fits += 1
                continue
            if cached < 0:
                return
            self.waiting.popleft()
            sid, self.next_id = self.next_id, self.next_id + 1
            self.seqs[sid] = dict(tokens=list(tokens), keys=[], target=len(tokens) + gen, written=set(), salt=salt)
            self.placed()
            self.compare_tables(sid)
            self.claim_hit_tail(sid, cached)
            self.check_reads(sid, cached)  # a hit reads exactly the rows its content was written to

    def before_admission(self, tokens, salt):
        """Called before each admission (the row space checks its formula here)."""

    def claim_hit_tail(self, sid, cached):
        """The SWA pages a hit claimed were written whole by their first owner."""
        swa = self.tables(sid)[1]
        self.seqs[sid]["written"].update(p for p in range(cached) if swa[p // self.page] >= 0)

    def prefill_step(self):
        batch = [sid for sid in self.seqs if self.model.num_tokens(sid) == self.model.seqs[sid].num_prompt]
        if not batch:
            return
        self.rng.shuffle(batch)
        batch = batch[:self.rng.randrange(1, len(batch) + 1)]
        counts, sampled = self.chunks(batch)
        self.both("ensure_for_tokens", batch, counts)
        self.placed()
        for sid, n in zip(batch, counts):
            start = self.model.num_computed(sid)
            self.check_reads(sid, start)
            keys = self.keys(sid, start + n)
            self.write_swa(sid, range(start, start + n), keys)
            self.write_compress(sid, start, start + n)
        self.both("commit_prefill", batch, counts, sampled)
        for sid, tok in zip(batch, sampled):
            if tok >= 0:
                self.seqs[sid]["tokens"].append(tok)
            self.compare_tables(sid)

    def chunks(self, batch):
        """Each sequence's next chunk (its rest, a random part or a block) within
        the step's token budget, and the token sampled after a prompt's last."""
        budget = self.cfg.get("max_num_batched_tokens", 8192)
        counts, sampled = [], []
        for sid in batch:
            left = self.model.num_tokens(sid) - self.model.num_computed(sid)
            n = min(left, budget, self.rng.choice([left, self.rng.randrange(1, left + 1), self.bs]))
            counts.append(n)
            sampled.append(self.rng.randrange(1, 1 << 20) if n == left else -1)
        return counts, sampled

    def decode_step(self):
        batch = [sid for sid in self.seqs if self.model.num_tokens(sid) > self.model.seqs[sid].num_prompt]
        if not batch:
            return
        self.rng.shuffle(batch)
        widths = [self.rng.randrange(1, self.mtp_k + 2) for _ in batch]  # 1 + each sequence's drafts
        served = self.both("can_append", batch, widths)
        if served < len(batch):
            self.preempt(batch[served:])
            batch, widths = batch[:served], widths[:served]
            if not batch:
                return
        self.both("append", batch, widths)
        self.placed()
        counts, new_tokens = [], []
        for sid, q in zip(batch, widths):
            toks = self.decode_one(sid, q)
            counts.append(len(toks))
            new_tokens.extend(toks)
        self.both("commit_decode", batch, counts, new_tokens)
        for sid, n in zip(batch, counts):
            nc = self.model.num_computed(sid)
            self.write_compress(sid, nc - n, nc)
            self.compare_tables(sid)
        done = [sid for sid in batch if self.model.num_tokens(sid) >= self.seqs[sid]["target"]]
        self.finish(done)

    def decode_one(self, sid, q):
        """One sequence's forward of q positions (its last token and q - 1
        drafts): reads, SWA writes, and the tokens it accepts."""
        s = self.seqs[sid]
        nc = self.model.num_computed(sid)
        self.check_reads(sid, nc)
        drafts = self.fresh(q - 1)
        keys = list(self.keys(sid, nc + 1))
        for d in drafts:  # the step writes SWA rows for every scheduled position
            keys.append(hash((keys[-1], d)))
        self.write_swa(sid, range(nc, nc + q), keys)
        accepted = self.rng.randrange(1, q + 1)
        toks = drafts[:accepted - 1] + [self.rng.randrange(1, 1 << 20)]  # and the bonus token
        s["tokens"].extend(toks)
        s["keys"] = keys[:nc + accepted]  # rejected drafts' keys are not the sequence's
        return toks

    def preempt(self, victims):
        self.preemptions += len(victims)
        for sid in victims:  # resumes later from its known tokens (prompt + generated), under its salt
            self.waiting.appendleft((list(self.seqs[sid]["tokens"]), 1, self.seqs[sid]["salt"]))
        self.release(victims)

    def finish(self, done):
        for sid in done:
            self.finished_tokens.append(list(self.seqs[sid]["tokens"]))
        self.release(done)

    def release(self, sids):
        if not sids:
            return
        for sid in sids:  # the KV a sequence leaves behind must still be its own
            phys = self.tables(sid)[2]
            nc = self.model.num_computed(sid)
            self.check_compress(sid, phys, self.keys(sid, nc), nc)
        self.both("deallocate", sids)
        for sid in sids:
            del self.seqs[sid]

    def stage_and_compare(self):
        ids = list(self.seqs)
        self.rng.shuffle(ids)
        self.cpp.stage(ids)
        host = self.cpp.host_tables
        width = self.cfg["max_blocks_per_seq"]
        index = {name: ukv_torch.table_index(self.cpp.config, name) for name in ["logical", "swa", *self.ratios]}
        for r, sid in enumerate(ids):
            logical, swa, phys = self.tables(sid)
            pad = [0] * (width - len(logical))
            assert host[r, index["logical"]].tolist() == logical + pad
            assert host[r, index["swa"]].tolist() == list(swa) + pad
            for t, ratio in enumerate(self.ratios):
                assert host[r, index[ratio]].tolist() == phys[t] + pad

    def step(self):
        while len(self.waiting) < 3:
            self.waiting.append(self.new_request())
        self.admit()
        self.prefill_step()
        self.decode_step()
        self.check_ownership()
        self.stage_and_compare()

    def run(self, steps):
        for _ in range(steps):
            self.step()
        self.release(list(self.seqs))
        self.check_nothing_leaks()

    def check_nothing_leaks(self):
        stats = self.cpp.stats()
        assert stats["num_sequences"] == 0
        assert stats["free_logical_blocks"] == self.cpp.pools.num_logical_blocks
        reserve = (self.model.swa.checkpoint_capacity if self.model.swa else 0) + self.model._chunk_reserve(0)
        assert stats["swa_reserved"] == reserve
        # Only checkpoint pins may still hold SWA slots; dropping the cache drops them.
        assert stats["held_swa_slots"] == (len(self.model.swa.lru) if self.model.swa else 0)
        self.both("clear_cache")
        assert self.cpp.stats()["held_swa_slots"] == 0


def config(unified, block_size=128, **overrides):
    cfg = dict(num_logical_blocks=40, num_swa_blocks=32, block_size=block_size, window=128, mtp_k=0,
               unified=unified, max_num_seqs=8, max_blocks_per_seq=12)
    cfg.update(overrides)
    return cfg


# Small logical pools under unique fillers force eviction and reuse, so the
# physical ids drift away from the logical ones.
CONFIGS = {
    "unified-bs128": config(True),
    "static-bs128": config(False),
    "unified-bs256-mtp2": config(True, 256, mtp_k=2, num_logical_blocks=30),
    "static-bs256-mtp1": config(False, 256, mtp_k=1, num_logical_blocks=30),
    "unified-window256-mtp3": config(True, window=256, mtp_k=3, num_swa_blocks=40),
    "unified-sparse-retain": config(True, full_retain=True, retention_interval=256, checkpoint_frac=0.25,
                                    max_num_batched_tokens=256, num_swa_blocks=48),
    "static-sparse-retain": config(False, full_retain=True, retention_interval=256, checkpoint_frac=0.25,
                                   max_num_batched_tokens=256, num_swa_blocks=48),
    "unified-full-retain-bs256": config(True, 256, full_retain=True, max_num_batched_tokens=512,
                                        num_logical_blocks=30, num_swa_blocks=40),
    # Elastic sizing: own regions smaller than the logical space, so compress
    # borrows shared slots and SWA reclaims cached compress blocks.
    "unified-elastic": config(True, num_logical_blocks=64, type_slots=[32 + 6, 32 + 1]),
    "unified-elastic-mtp1": config(True, mtp_k=1, num_logical_blocks=64, num_swa_blocks=24, type_slots=[24 + 4, 24 + 1]),
    "unified-elastic-both-types-borrow": config(True, num_logical_blocks=160, type_slots=[32 + 12, 32 + 1]),
    # ... and may borrow shared slots SWA never used (the planner's elastic mode).
    "unified-elastic-lend": config(True, num_logical_blocks=64, type_slots=[32 + 6, 32 + 1],
                                   borrow_unreleased_swa=True),
    "unified-elastic-mtp1-lend": config(True, mtp_k=1, num_logical_blocks=64, num_swa_blocks=24,
                                        type_slots=[24 + 4, 24 + 1], borrow_unreleased_swa=True),
    "unified-elastic-both-types-lend": config(True, num_logical_blocks=160, type_slots=[32 + 12, 32 + 1],
                                              borrow_unreleased_swa=True),
    "unified-no-prefix-cache": config(True, enable_prefix_caching=False),
}
