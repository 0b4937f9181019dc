"""The unified slot layouts' compress bindings, as the KV manager model sees
them (a mixin of ukv_torch.testing.kv_manager_model.KvManagerModel).

Every live or cached logical block is bound to one physical block per
compress type. Compress takes open slots, then its own region, then borrows
the longest-released shared slot. Shared slots busy with cached bindings only
are reclaimed for SWA, coldest first, when an admission or append needs the
room. A true allocation takes the longest-free logical blocks; where the
pools cannot bind the never-bound ones among them without opening a shared
slot, or at all, the fewest of those give way to the coldest cached blocks
that hold a binding (evicting their content and re-using the binding).
"""
from __future__ import annotations


class CompressBindings:
    """Mixin: needs binding, owner_of, pools, space, live_in_slot,
    reclaimable, free, num_types, num_swa, unified, stat and
    _forget_logical from the manager model."""

    def _shared_slot(self, t, phys):
        slot = phys // self.pools[t].bps
        return slot if slot < self.num_swa else None

    def _update_reclaimable(self, slot):
        yes = self.space.busy[slot] > 0 and self.live_in_slot[slot] == 0
        if yes and slot not in self.reclaimable:
            self.reclaimable.push_back(slot)
        elif not yes and slot in self.reclaimable:
            self.reclaimable.remove(slot)

    def _live_change(self, b, delta, types=None):
        """Block b went live (+1) or free (-1): its bindings' shared slots follow."""
        if not self.unified:
            return
        for t in range(self.num_types) if types is None else types:
            if self.binding[t][b] < 0:
                continue
            slot = self._shared_slot(t, self.binding[t][b])
            if slot is not None:
                self.live_in_slot[slot] += delta
                self._update_reclaimable(slot)

    def _alloc_binding(self, t, b):
        phys = self.space.alloc_compress(t)
        self.binding[t][b] = phys
        self.owner_of[t][phys] = b

    def _free_binding(self, t, b):
        self._release_phys(t, self.binding[t][b])
        self.binding[t][b] = -1

    def _release_phys(self, t, phys):
        del self.owner_of[t][phys]
        self.space.free_compress(t, phys)
        slot = self._shared_slot(t, phys)
        if slot is not None:
            self._update_reclaimable(slot)

    def _slot_fresh_blocks(self, count, skip, fits):
        """The free blocks a true allocation of `count` takes (free-list order), as
        (blocks, demand, evicted), or None when none fit. A choice allowing m
        never-bound blocks takes them first-come in free-list order and fills
        up with bound (cached) ones; m starts at the longest-free choice's
        demand, or, unified, at what every pool binds without opening a shared
        slot if that is less (as far as bound blocks go); from there down the
        first choice that fits."""
        order = [b for b in self.free if b not in skip]
        unbound = [self.unified and self.binding[0][b] < 0 for b in order]
        demand = sum(unbound[:count])
        start = demand
        if self.unified:
            room = min(p.free_own_blocks() for p in self.pools if p.num_slots)
            start = min(demand, max(room, count - unbound.count(False)))
        for m in range(start, -1, -1):
            pick, taken = [], 0
            for b, u in zip(order, unbound):
                if len(pick) == count:
                    break
                if not u or taken < m:
                    pick.append(b)
                    taken += u
            if len(pick) < count:
                return None
            if fits(pick, m):
                return pick, m, demand - m
            if not self.unified:
                return None
        return None

    def _bind_compress(self, blocks):
        """Blocks without a binding get one first (the admission counted exactly
        them as compress demand); a retained binding then moves (is freed and
        bound afresh) only if its pool has room without borrowing a shared slot.
        The new block is taken before the old one is freed: freeing first could
        close the very slot that was the room and make the allocation borrow."""
        retained = [b for b in blocks if self.binding[0][b] >= 0]
        for b in blocks:
            if self.binding[0][b] < 0:
                for t in range(self.num_types):
                    self._alloc_binding(t, b)
                    self._live_change(b, +1, [t])
        for b in retained:
            for t in range(self.num_types):
                if self.pools[t].free_own_blocks() == 0:
                    continue
                self._live_change(b, -1, [t])
                old = self.binding[t][b]
                self._alloc_binding(t, b)
                self._release_phys(t, old)
                self._live_change(b, +1, [t])

    def _reclaim_one(self):
        slot = self.reclaimable.front()
        for t, p in enumerate(self.pools):
            for phys in range(slot * p.bps, (slot + 1) * p.bps):
                if p.holds(phys):
                    b = self.owner_of[t][phys]
                    for u in range(self.num_types):
                        self._free_binding(u, b)
                    self._forget_logical(b)
                    self.stat["reclaimed_blocks"] += 1
        self.stat["reclaimed_slots"] += 1

    def _reclaimable_after(self, going_live):
        """Reclaimable slots that stay so once the free blocks going_live go live."""
        kept = {self._shared_slot(t, self.binding[t][b]) for b in going_live
                for t in range(self.num_types) if self.binding[t][b] >= 0}
        return [s for s in self.reclaimable if s not in kept]
