"""The slot layouts' physical pools, as the KV manager model sees them
(ukv_torch.testing.kv_manager_model): one layer type's slots (SlotPool, also
the static split's private SWA pool) and the unified coordinator's shared
SWA slot space over them (SharedSwaSpace). Slow and obvious on purpose."""
from __future__ import annotations

from typing import Dict, List

from .allocator_model import Fifo, ceil_div


class OrderedIds(Fifo):
    """A FIFO of distinct ids with O(1) removal, named as the manager model uses it."""

    def push_back(self, i):
        self.push(i)

    def pop_front(self):
        i = self.front()
        self.remove(i)
        return i


class SlotPool:
    """One layer type's tensor cut into slots of block_size rows.

    A slot is free, reserved (the shared SWA space owns it), SWA-held (static
    SWA pool only) or compress: block_size // k compress blocks, phys =
    slot * bps + sub. Slots [0, shared) are shared with SWA, the rest are the
    type's own region.
    """

    def __init__(self, num_slots: int, k: int, block_size: int, shared: int):
        self.num_slots, self.k, self.shared = num_slots, k, shared
        self.bps = block_size // k if k else 0
        self.owner = ["free"] * num_slots
        self.own_free = OrderedIds(range(shared, num_slots))
        self.shared_free = OrderedIds(range(shared))
        self.open = OrderedIds()           # compress slots with a free sub-block
        self.free_subs: Dict[int, set] = {}
        self.used: Dict[int, int] = {}
        self.borrows = 0

    def _free_list(self, slot):
        return self.shared_free if slot < self.shared else self.own_free

    def _take(self, slot, owner):
        self._free_list(slot).remove(slot)
        self.owner[slot] = owner

    def _give_back(self, slot):
        self.owner[slot] = "free"
        self._free_list(slot).push_back(slot)

    def reserve(self, slot):
        self._take(slot, "reserved")

    def release(self, slot):
        assert self.owner[slot] == "reserved"
        self._give_back(slot)

    def free_slot_count(self):
        return len(self.own_free) + len(self.shared_free)

    def free_swa_count(self):
        """Static split: pages the private SWA pool can still give."""
        return self.free_slot_count()

    def open_free_blocks(self):
        return sum(len(self.free_subs[s]) for s in self.open)

    def free_own_blocks(self):
        """Compress blocks available without opening a shared slot."""
        return self.open_free_blocks() + len(self.own_free) * self.bps

    def free_blocks(self):
        return self.open_free_blocks() + self.free_slot_count() * self.bps

    def holds(self, phys):
        slot, sub = divmod(phys, self.bps)
        return self.owner[slot] == "compress" and sub not in self.free_subs[slot]

    # static-split SWA role (k = 0, no shared region)
    def alloc_swa(self):
        slot = (self.shared_free if len(self.shared_free) else self.own_free).front()
        self._take(slot, "swa")
        return slot

    def free_swa(self, slot):
        assert self.owner[slot] == "swa"
        self._give_back(slot)

    def claim_swa(self, slot):
        assert self.owner[slot] == "free"
        self._take(slot, "swa")

    def alloc_compress(self):
        """-> (phys, slot opened by this call or None)."""
        if len(self.open):
            slot = self.open.front()
            sub = min(self.free_subs[slot])
            self.free_subs[slot].discard(sub)
            self.used[slot] += 1
            if not self.free_subs[slot]:
                self.open.remove(slot)
            return slot * self.bps + sub, None
        source = self.own_free if len(self.own_free) else self.shared_free
        assert len(source), "No free KV slots available"
        slot = source.front()
        if source is self.shared_free:
            self.borrows += 1
        self._take(slot, "compress")
        self.free_subs[slot] = set(range(1, self.bps))
        self.used[slot] = 1
        if self.bps > 1:
            self.open.push_back(slot)
        return slot * self.bps, slot

    def free_compress(self, phys):
        """-> True when the slot became free."""
        slot, sub = divmod(phys, self.bps)
        assert self.holds(phys)
        self.used[slot] -= 1
        if self.used[slot] == 0:
            if slot in self.open:
                self.open.remove(slot)
            del self.free_subs[slot], self.used[slot]
            self._give_back(slot)
            return True
        self.free_subs[slot].add(sub)
        if slot not in self.open:
            self.open.push_back(slot)
        return False


class SharedSwaSpace:
    """The unified coordinator: SWA slot s is rows [s*bs, +bs) of every tensor.

    A shared slot is 'available' (reserved in every pool, never used by SWA),
    'held' by SWA, or 'released' (free in the pools; SWA may take it back while
    no pool has compress blocks in it).
    """

    def __init__(self, num_swa: int, pools: List[SlotPool], on_evict, borrow_unreleased: bool = False):
        self.num_swa, self.pools, self.on_evict = num_swa, pools, on_evict
        self.borrow_unreleased = borrow_unreleased
        self.unreleased_borrows = 0
        self.state = ["available"] * num_swa
        self.busy = [0] * num_swa          # pools with compress blocks in the slot
        self.cached = [False] * num_swa    # released slot may back a cached SWA block
        self.swa_free = OrderedIds(range(num_swa))
        self.evictions = 0
        for s in range(num_swa):
            for p in pools:
                p.reserve(s)

    def available_unreleased(self):
        return sum(1 for s in self.swa_free if self.state[s] == "available")

    def lendable(self):
        """Never-used free slots a type may be lent, in SWA free-list order."""
        return [s for s in self.swa_free if self.state[s] == "available"] if self.borrow_unreleased else []

    def free_blocks(self, t):
        return self.pools[t].free_blocks() + len(self.lendable()) * self.pools[t].bps

    def held(self):
        return self.state.count("held")

    def free_swa_count(self):
        return len(self.swa_free)

    def is_free_swa(self, s):
        return s in self.swa_free

    def _take(self, s):
        self.swa_free.remove(s)
        if self.state[s] == "released":
            for p in self.pools:
                p.reserve(s)
        self.state[s] = "held"
        self.cached[s] = False

    def alloc_swa(self):
        assert len(self.swa_free), "No free SWA slots available"
        s = self.swa_free.front()
        self._take(s)
        return s

    def claim_swa(self, s):
        assert s in self.swa_free
        self._take(s)

    def free_swa(self, s):
        assert self.state[s] == "held"
        for p in self.pools:
            p.release(s)
        self.state[s] = "released"
        self.cached[s] = True
        self.swa_free.push_back(s)

    def alloc_compress(self, t):
        lendable = self.lendable()
        if self.pools[t].free_blocks() == 0 and lendable:
            s = lendable[-1]
            for p in self.pools:
                p.release(s)
            self.state[s] = "released"
            self.unreleased_borrows += 1
        phys, opened = self.pools[t].alloc_compress()
        if opened is not None and opened < self.num_swa:
            if self.busy[opened] == 0:
                self.swa_free.remove(opened)
            self.busy[opened] += 1
            if self.cached[opened]:  # compress overwrites the rows: drop the SWA entry first
                self.cached[opened] = False
                self.evictions += 1
                self.on_evict(opened)
        return phys

    def free_compress(self, t, phys):
        slot_freed = self.pools[t].free_compress(phys)
        slot = phys // self.pools[t].bps
        if slot_freed and slot < self.num_swa:
            self.busy[slot] -= 1
            if self.busy[slot] == 0:
                self.swa_free.push_back(slot)

    def can_serve(self, n_swa: int, demand: int, extra_slots: List[int]) -> bool:
        """Can n_swa SWA blocks and `demand` compress blocks of every type be
        allocated in any order, once the shared slots in extra_slots (busy
        with cached compress blocks only) are made free in every pool?

        Worst case: SWA first takes every free released slot it can reach
        (those are the slots compress could borrow); each type must then find
        the shared slots it borrows among what is left in its own pool; and
        the pools together take at most the contested (released, free) slots
        from under SWA. With borrow_unreleased every never-used free slot is
        contested too, and is room in every pool. Freeing an extra slot gives a pool a shared slot only
        if the pool was in it, and takes away the free blocks the pool had
        open there.
        """
        swa_free = len(self.swa_free) + len(extra_slots)
        if n_swa > swa_free:
            return False
        lendable = len(self.lendable())
        contested = swa_free - self.available_unreleased() + lendable
        swa_takes_released = min(n_swa, contested)
        borrows = 0
        for t, p in enumerate(self.pools):
            if demand == 0:
                continue
            freed_in_pool = [s for s in extra_slots if p.owner[s] == "compress"]
            own_after = p.free_own_blocks() - sum(len(p.free_subs[s]) for s in freed_in_pool)
            beyond_own = demand - own_after
            borrow = ceil_div(beyond_own, p.bps) if beyond_own > 0 else 0
            if borrow > len(p.shared_free) + lendable + len(freed_in_pool) - swa_takes_released:
                return False
            borrows += borrow
        return n_swa + min(borrows, contested) <= swa_free

