"""The model-based serving engine on the row-space layout.

RowSpaceServing runs Serving's engine (support.serving) on a manager whose
envelopes and SWA units share one row space, with a simulated device memory
of absolute rows (RowSpaceMemory). Each call that may give out rows is
followed by staging, and the row copies the manager queued (units it moved
to make room) are checked and applied before the step reads or writes:
phase by phase, no copy writing rows that a live unit which did not move
still holds, or that a copy of the same or a later phase reads. Every read
of a hit or a live sequence must then find exactly its own content; live
units never overlap; every id and row lies in bounds.

The pure-Python model (ukv_torch.testing.kv_manager_model) counts the row
space in rows but does not place units, so it cannot say which cached unit
the row space evicts to make room. Every call's result - each admission and
its hit included, and each admission is checked against the rows formula
written out from the model's tables too - is compared with the model, and
so are the stats, events and tables after it; after a call in which the row
space evicted a cached unit to make room, the model takes the manager's
state (support.row_space_sync.follow_evictions) before the comparison.
"""
import ukv_torch
from support.row_space_sync import follow_evictions
from support.serving import Serving
from ukv_torch.testing.kv_manager_model import NEVER_FITS, NOT_NOW, salt_value


class RowSpaceMemory:
    """What each row of the row space holds (the same row in every plane): the
    key of the token prefix whose KV was written there (None = never).

    Envelope p is rows [p*E, (p+1)*E): compress type t's entries at offset
    sum(k of the types before t). SWA unit u is rows [base + u*U, +U), U a
    multiple of the page: each of its U / page layers holds every position
    of the page, position q at offset layer * page + q.
    """

    def __init__(self, pools, page, ks):
        self.E, self.U, self.page = pools.envelope_rows, pools.swa_unit_rows, page
        self.total = pools.total_rows
        self.base = self.total - (self.total // self.U) * self.U
        self.offsets = [sum(ks[:t]) for t in range(len(ks))]
        assert self.offsets[-1] + ks[-1] <= self.E and self.U % page == 0
        self.rows = [None] * self.total

    def unit_rows(self, unit):
        return range(self.base + unit * self.U, self.base + (unit + 1) * self.U)

    def envelope_rows(self, env):
        return range(env * self.E, (env + 1) * self.E)

    def write_swa(self, unit, pos, key):
        assert unit >= 0, "a forward writes SWA rows through a -1 table entry"
        for layer in range(self.U // self.page):
            self.rows[self.base + unit * self.U + layer * self.page + pos % self.page] = key

    def read_swa(self, unit, lo, hi):
        """What each layer holds for positions [lo, hi) of one page."""
        assert unit >= 0, "a forward reads SWA rows through a -1 table entry"
        first = self.base + unit * self.U + lo % self.page
        return [self.rows[first + layer * self.page:first + layer * self.page + hi - lo]
                for layer in range(self.U // self.page)]

    def write_compress(self, t, env, entry, key):
        self.rows[env * self.E + self.offsets[t] + entry] = key

    def read_compress(self, t, env, lo, hi):
        first = env * self.E + self.offsets[t]
        return self.rows[first + lo:first + hi]

    def apply(self, copies):
        """Copies (src, dst, rows, phase) in phase order: a phase reads all its
        sources before it writes (its copies touch disjoint rows)."""
        for phase in sorted({c[3] for c in copies}):
            moved = [(dst, self.rows[src:src + n]) for src, dst, n, p in copies if p == phase]
            for dst, content in moved:
                self.rows[dst:dst + len(content)] = content


def overlaps(a, b):
    return a.start < b.stop and b.start < a.stop


def check_copy_order(copies, total):
    """Within a phase no two copies touch the same rows as writer and reader or
    writer and writer; a copy writing rows another copy reads runs in a later
    phase than that copy."""
    for i, (src, dst, n, phase) in enumerate(copies):
        assert 0 <= src and src + n <= total and 0 <= dst and dst + n <= total, "copy out of the row space"
        for j, (src2, dst2, n2, phase2) in enumerate(copies):
            if i == j:
                continue
            if overlaps(range(dst, dst + n), range(src2, src2 + n2)):
                assert phase > phase2, f"copy {i} writes rows copy {j} reads, in phase {phase} <= {phase2}"
            if phase == phase2:
                assert not overlaps(range(dst, dst + n), range(dst2, dst2 + n2)), "two copies write one row"


class RowSpaceServing(Serving):
    """Serving's engine on a row-space manager, its KV in a RowSpaceMemory."""

    def __init__(self, cfg, seed, whole_chunks=False):
        super().__init__(cfg, seed, whole_chunks)
        self.placement = {}     # seq id -> (envelope per block, unit per page) as last staged
        self.units = {}         # ("env", block) / ("swa", page) -> its rows, as last staged
        self.evictions = 0      # cached units the row space evicted to make room
        self.copies = 0         # row copies applied

    def make_memory(self):
        return RowSpaceMemory(self.cpp.pools, self.page, self.ks)

    # ------------------------------------------------------------ plumbing --
    def sync_model(self):
        """The model does not place units, so it cannot say which cached unit the
        row space evicts to make room: after a call that evicted one, it takes
        the manager's state."""
        self.evictions += follow_evictions(self.model, self.cpp)

    def compare_phys_tables(self, sid):
        """Where units lie is the manager's; a block no chunk has reached reads 0."""
        envelopes = self.cpp.phys_table(sid, 0).tolist()
        bound = self.model.rows.env.bound
        assert all(e == 0 for b, e in zip(self.model.logical_table(sid), envelopes) if b not in bound)

    def tables(self, sid):
        envelopes, units = self.placement[sid]
        return self.model.logical_table(sid), units, [envelopes] * len(self.ks)

    # ------------------------------------------------------------ placement --
    def placed(self):
        """Stage every live sequence, check the copies the manager queued and
        apply them, then check where the live units lie."""
        ids = list(self.seqs)
        self.cpp.stage(ids)
        copies = self.staged_copies()
        host = self.cpp.host_tables
        index = [ukv_torch.table_index(self.cpp.config, name) for name in ("logical", "swa", "envelope")]
        placement, units = {}, {}
        bound = self.model.rows.env.bound
        for r, sid in enumerate(ids):
            logical, pages = self.model.logical_table(sid), self.model.swa_table(sid)
            row = [host[r, i].tolist() for i in index]
            assert row[0][:len(logical)] == logical
            envelopes, staged_units = row[2][:len(logical)], row[1][:len(pages)]
            assert [u < 0 for u in staged_units] == [p < 0 for p in pages], "staged SWA table holds -1 iff no page"
            assert all(e == 0 for b, e in zip(logical, envelopes) if b not in bound), "a reserved envelope stages as 0"
            placement[sid] = (envelopes, staged_units)
            for b, e in zip(logical, envelopes):
                if b in bound:
                    assert units.setdefault(("env", b), self.mem.envelope_rows(e)) == self.mem.envelope_rows(e), \
                        f"block {b} staged on two envelopes"
            for p, u in zip(pages, staged_units):
                if p >= 0:
                    assert units.setdefault(("swa", p), self.mem.unit_rows(u)) == self.mem.unit_rows(u), \
                        f"SWA page {p} staged on two units"
        self.check_copies(copies, units)
        self.mem.apply(copies)
        self.copies += len(copies)
        self.placement, self.units = placement, units
        self.check_units(units)

    def staged_copies(self):
        counts = self.cpp.row_copy_counts.tolist()
        rows = self.cpp.row_copies[:sum(counts)].tolist()
        phases = [p for p, n in enumerate(counts) for _ in range(n)]
        return [(src, dst, n, phase) for (src, dst, n), phase in zip(rows, phases)]

    def check_copies(self, copies, units):
        """No copy writes the rows of a live unit that stayed where it was."""
        check_copy_order(copies, self.mem.total)
        stayed = [rows for key, rows in units.items() if self.units.get(key) == rows]
        for src, dst, n, _ in copies:
            for rows in stayed:
                assert not overlaps(range(dst, dst + n), rows), f"a copy to row {dst} overwrites a unit that stayed"

    def check_units(self, units):
        """Live units lie inside the row space and never overlap; their owners are in range."""
        pools = self.cpp.pools
        spans = sorted((rows.start, rows.stop, key) for key, rows in units.items())
        for (a0, a1, ka), (b0, _, kb) in zip(spans, spans[1:]):
            assert a1 <= b0, f"live units {ka} and {kb} overlap"
        for (kind, owner), rows in units.items():
            assert 0 <= rows.start and rows.stop <= pools.total_rows
            limit = pools.num_logical_blocks if kind == "env" else pools.num_swa_blocks
            assert 0 <= owner < limit, (kind, owner)

    # ---------------------------------------------------------- the engine --
    def before_admission(self, tokens, salt):
        """E * (the live blocks' envelopes, bound or reserved, + the request's
        fresh blocks + its free hits) + U * max(reserved pages + its quota,
        held SWA pages) <= R, from the model's tables and hit; NEVER_FITS when
        even empty rows cannot (with the reserves that stay when nothing is live)."""
        model, pools, bs = self.model, self.cpp.pools, self.bs
        nb = -(-len(tokens) // bs)
        quota = model._quota_for(nb, False)
        E, U, R = pools.envelope_rows, pools.swa_unit_rows, pools.total_rows
        want = NOT_NOW
        if len(model.seqs) < self.cfg["max_num_seqs"]:
            hits = model._admission(list(tokens), salt_value(salt))["hit_ids"]
            free_hits = sum(1 for b in hits if model.ref[b] == 0)
            live_blocks = len({b for s in model.seqs.values() for b in s.logical})
            envelopes = live_blocks + nb - len(hits) + free_hits
            units = max(model.swa_reserved + quota, model.swa.held_slots())
            if len(model.free) >= nb - (len(hits) - free_hits) and E * envelopes + U * units <= R:
                want = len(hits) * bs
        pages = quota + model._checkpoint_reserve() + model._chunk_reserve(0)
        if want == NOT_NOW and (nb > pools.num_logical_blocks or nb * E + pages * U > R):
            want = NEVER_FITS
        assert self.cpp.can_allocate(tokens, salt=salt) == want

    def check_ownership(self):
        self.placed()

    def stage_and_compare(self):
        """Staged rows are checked in placed(); every live unit's content here."""
        for sid in self.seqs:
            self.check_live_content(sid)

    def check_live_content(self, sid):
        """Every SWA row the sequence holds and wrote, and every compress entry it
        completed, holds its own content."""
        _, units, phys = self.tables(sid)
        nc = self.model.num_computed(sid)
        keys = self.keys(sid, nc)
        written = self.seqs[sid]["written"]
        for j, unit in enumerate(units):
            for p in range(j * self.page, min(nc, (j + 1) * self.page)):
                if unit >= 0 and p in written:
                    self.check_swa(sid, units, keys, p, p + 1)
        self.check_compress(sid, phys, keys, nc)


def row_space_config(page, total_rows, unit_layers=2, **overrides):
    """A row-space configuration: envelopes of 40 rows (CSA 32 + HCA 1 and room),
    SWA units of `unit_layers` layers of `page` tokens."""
    cfg = dict(layout="row_space", block_size=128, window=128, mtp_k=0, swa_page_tokens=page,
               total_rows=total_rows, envelope_rows=40, swa_unit_rows=unit_layers * page,
               max_num_seqs=8, max_blocks_per_seq=12)
    cfg.update(overrides)
    return cfg
