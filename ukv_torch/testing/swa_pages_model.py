"""The sliding-window page pool of the KV manager model
(ukv_torch.testing.kv_manager_model): content-addressed SWA pages of
page_tokens positions each, with -1 placeholders in the tables, lazy eviction
(a released page keeps its content until it is reused) and the checkpoint
pins of sparse retention. Where a page's rows come from is its source: the
unified coordinator's shared slots, the static split's private pool, or the
row space (RowSpaceSwaSource in row_space_model)."""
from __future__ import annotations

from typing import Dict, List, Optional

from .kv_events_model import SWA, EventLog
from .prefix_keys_model import Key
from .slot_pools_model import OrderedIds


class SwaPool:
    """Content-addressed SWA pages; a page's id is its source's slot (or, in
    the row space, the page's own id). Hash kept after release (lazy)."""

    def __init__(self, num_pages: int, checkpoint_capacity: int, events: EventLog):
        self.events = events  # the manager's: cache changes are recorded with role SWA
        self.ref = [0] * num_pages
        self.hash: List[Optional[Key]] = [None] * num_pages
        self.tokens: List[Optional[tuple]] = [None] * num_pages
        self.by_hash: Dict[Key, int] = {}
        self.lru = OrderedIds()  # pinned checkpoints, least recently used first
        self.checkpoint_capacity = checkpoint_capacity
        self.source = None  # SharedSwaSpace, a static SlotPool or a RowSpaceSwaSource

    def free_slots(self):
        return self.source.free_swa_count()

    def held_slots(self):
        return sum(1 for r in self.ref if r > 0)

    def lookup(self, h, toks):
        i = self.by_hash.get(h)
        return i if i is not None and self.tokens[i] == tuple(toks) else -1

    def forget(self, i):
        if self.hash[i] is not None and self.by_hash.get(self.hash[i]) == i:
            del self.by_hash[self.hash[i]]
            self.events.removed(SWA, self.hash[i])
        self.hash[i] = None

    def alloc(self):
        i = self.source.alloc_swa()
        self.forget(i)
        self.ref[i] = 1
        return i

    def claim(self, i):
        if self.ref[i] > 0:
            self.ref[i] += 1
        else:
            self.source.claim_swa(i)
            self.ref[i] = 1
        if i in self.lru:
            self.lru.remove(i)
            self.lru.push_back(i)

    def release(self, i):
        assert self.ref[i] > 0
        self.ref[i] -= 1
        if self.ref[i] == 0:
            self.source.free_swa(i)

    def publish(self, i, h, toks, block_h, salt):
        """Page i holds toks under key h; block_h is the hash of its block."""
        self.hash[i], self.tokens[i] = h, tuple(toks)
        self.by_hash[h] = i
        self.events.stored(SWA, h, block_h, toks, salt)

    def pin(self, i):
        if i in self.lru:
            self.lru.remove(i)
            self.lru.push_back(i)
            return
        self.ref[i] += 1
        self.lru.push_back(i)
        while len(self.lru) > self.checkpoint_capacity:
            self.release(self.lru.pop_front())

    def evict(self, i):
        assert self.ref[i] == 0
        self.forget(i)

    def clear_cache(self):
        while len(self.lru):  # checkpoint pins only keep cached pages; the cache is gone
            self.release(self.lru.pop_front())
        self.by_hash.clear()
        for i, r in enumerate(self.ref):
            if r == 0:
                self.hash[i] = None
        clear = getattr(self.source, "clear_cache", None)
        if clear is not None:  # the row space gives the cached units back
            clear()
