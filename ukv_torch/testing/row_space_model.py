"""The row-space layout as the KV manager model sees it
(ukv_torch.testing.kv_manager_model): how many envelopes (one per logical
block) and SWA units (one per page) are bound, which bound ones are cached
(their owner is free but keeps content a hit may use), coldest first, and
which free owners have no unit. A block a sequence takes without an
envelope is reserved: it gets its envelope when the chunk that writes it is
provisioned (a decode step's new block at once). That is all admission and
the choice of ids depend on: E * (live + reserved envelopes) + U * SWA
units <= R, where only bound units hold rows.

Where the units lie (rows, moves, the copy list) is not modelled; neither is
which cached unit the row space evicts to make room, which depends on that
placement. The model assumes no such eviction; a test that sees one (the
manager's eviction counters) takes the manager's state.
"""
from __future__ import annotations

from .slot_pools_model import OrderedIds


class UnitKind:
    """One kind of unit: envelopes of logical blocks, or SWA units of pages."""

    def __init__(self, rows: int, num_owners: int):
        self.rows = rows
        self.bound = set()
        self.cached = OrderedIds()                    # coldest first
        self.unbound_free = OrderedIds(range(num_owners))
        self.evictions = 0

    def live(self):
        return len(self.bound) - len(self.cached)

    def bind(self, owner):
        self.unbound_free.remove(owner)
        self.bound.add(owner)

    def set_cached(self, owner, cached):
        assert owner in self.bound
        if cached and owner not in self.cached:
            self.cached.push_back(owner)
        elif not cached and owner in self.cached:
            self.cached.remove(owner)

    def release(self, owner, keep):
        """The owner became free: its unit stays as a cached one if it keeps content."""
        if keep:
            self.set_cached(owner, True)
            return
        self.bound.remove(owner)
        self.unbound_free.push_back(owner)

    def evict(self, owner):
        self.cached.remove(owner)
        self.bound.remove(owner)
        self.unbound_free.push_back(owner)
        self.evictions += 1


class RowSpaceCounts:
    def __init__(self, total_rows, envelope_rows, unit_rows, num_blocks, num_pages):
        self.total_rows = total_rows
        self.env = UnitKind(envelope_rows, num_blocks)
        self.swa = UnitKind(unit_rows, num_pages)
        self.reserved = 0  # live blocks without an envelope yet

    def take_blocks(self, blocks):
        """Free blocks went live: a cached one on its own envelope (first, so
        nothing bound next could evict it), the others reserved."""
        for b in blocks:
            if b in self.env.bound:
                self.env.set_cached(b, False)
        for b in blocks:
            if b not in self.env.bound:
                self.env.unbound_free.remove(b)
                self.reserved += 1

    def bind_reserved(self, b):
        """A live block's envelope, now that KV is written there."""
        if b not in self.env.bound:
            self.env.bound.add(b)
            self.reserved -= 1

    def release_block(self, b, keep):
        """Block b's last reference went: its envelope stays cached if it keeps
        content, else goes back (a reserved block just gives up its reservation)."""
        if b in self.env.bound:
            self.env.release(b, keep)
            return
        self.reserved -= 1
        self.env.unbound_free.push_back(b)

    def promised_envelopes(self):
        """Envelopes the live blocks hold or were promised."""
        return self.env.live() + self.reserved

    def unheld_rows(self):
        return self.total_rows - len(self.env.bound) * self.env.rows - len(self.swa.bound) * self.swa.rows

    def live_rows(self):
        return self.env.live() * self.env.rows + self.swa.live() * self.swa.rows

    def fits(self, envelopes, units):
        """Do these many live envelopes and SWA units fit the rows?"""
        return envelopes * self.env.rows + units * self.swa.rows <= self.total_rows

    def fresh_blocks(self, count, skip):
        """The free blocks a true allocation of `count` takes, as (blocks,
        cached ones among them): blocks without an envelope while the unheld
        rows hold their envelopes (nothing is evicted), then the coldest cached
        blocks not in skip (their content is evicted, their envelope reused),
        then blocks without an envelope again (the row space makes room)."""
        unbound = list(self.env.unbound_free)
        room = self.unheld_rows() // self.env.rows
        first = min(count, room, len(unbound))
        cached = [b for b in self.env.cached if b not in skip][:count - first]
        rest = unbound[first:first + count - first - len(cached)]
        blocks = unbound[:first] + cached + rest
        assert len(blocks) == count, "the logical free list ran out"
        return blocks, len(cached)


class RowSpaceSwaSource:
    """SWA units for the page pool: a page gets a unit from the unheld rows
    while there are enough of them and a page without one is free, else the
    coldest cached page gives its unit (and content) up."""

    def __init__(self, counts: RowSpaceCounts, has_content):
        self.counts, self.has_content = counts, has_content

    def free_swa_count(self):
        return (self.counts.total_rows - self.counts.live_rows()) // self.counts.swa.rows

    def alloc_swa(self):
        swa = self.counts.swa
        if len(swa.cached) and (not len(swa.unbound_free) or self.counts.unheld_rows() < swa.rows):
            page = swa.cached.front()
            swa.set_cached(page, False)
            return page
        assert len(swa.unbound_free), "No free SWA slots available"
        page = swa.unbound_free.front()
        swa.bind(page)
        return page

    def claim_swa(self, page):
        self.counts.swa.set_cached(page, False)

    def free_swa(self, page):
        self.counts.swa.release(page, self.has_content(page))

    def clear_cache(self):
        swa = self.counts.swa
        while len(swa.cached):
            swa.evict(swa.cached.front())
