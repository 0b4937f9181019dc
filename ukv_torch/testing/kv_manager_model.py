"""A plain pure-Python model of the KV manager (torch.classes.ukv.KvManager).

Needs xxhash (`pip install xxhash`) for the block hashes; it is imported
where a hash is computed, so importing the module does not need it.

Written from SPEC.md §1.3-§1.6 and the fixes in ARCHITECTURE.md, plus the
rules the C++ header documents, without looking at how the C++ computes them:

- Logical blocks: ref counts, a FIFO free list (the longest-freed block is
  reused first), chained xxh64 block hashes with a token-equality check, lazy
  eviction (a freed block keeps its hash until it is reused), KV events.
- Unified layout: every logical block is bound to one physical block per
  compress type on true allocation; the binding is retained while the block is
  cached and freed when the block is reused (rebind). Compress takes open
  slots, then its own region, then borrows the longest-released shared slot;
  borrowing a slot drops the SWA block cached there (H-a). With
  borrow_unreleased_swa, a type with no free block left is first lent the
  never-used shared slot SWA would take last (nothing cached there).
- The SWA pool: content-addressed blocks, -1 placeholders, the trailing-window
  hit gate, window-only or full-chunk materialisation, freeing with the
  computed length, sparse checkpoints pinned in an LRU.
- Admission is a promise: each live sequence holds an SWA quota, the reserved
  total never exceeds what SWA can still get, and compress borrowing is
  checked against the SWA demand outstanding. Cached compress blocks that sit
  in shared slots are reclaimed for SWA, coldest slot first, when needed.
- A true allocation takes the longest-free logical blocks; where the pools
  cannot bind the never-bound ones among them without opening a shared slot,
  or at all, the fewest of those give way to the coldest cached blocks that
  hold a binding (evicting their content and re-using the binding).

The model is deliberately slow and obvious: dicts as ordered sets, lists as
tables. It raises AssertionError on calls a correct engine never makes; the
tests compare it with the C++ on valid calls only.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Optional, Sequence

STORED, REMOVED, ALL_CLEARED = 0, 1, 2


def block_hash(tokens: Sequence[int], parent: Optional[int]) -> int:
    """h_i = xxh64(parent as 8-byte LE (absent for block 0) + tokens as int64 LE)."""
    import xxhash

    data = b"" if parent is None else struct.pack("<Q", parent)
    return xxhash.xxh64_intdigest(data + struct.pack(f"<{len(tokens)}q", *tokens))


def as_int64(u: int) -> int:
    """A uint64 hash as the int64 the torch class returns."""
    return u - (1 << 64) if u >= 1 << 63 else u


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class OrderedIds:
    """A FIFO of distinct ids with O(1) removal (a dict keeps insertion order)."""

    def __init__(self, ids=()):
        self._d = dict.fromkeys(ids)

    def __contains__(self, i):
        return i in self._d

    def __len__(self):
        return len(self._d)

    def __iter__(self):
        return iter(self._d)

    def push_back(self, i):
        assert i not in self._d
        self._d[i] = None

    def remove(self, i):
        del self._d[i]

    def front(self):
        return next(iter(self._d))

    def pop_front(self):
        i = self.front()
        del self._d[i]
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
            if self.cached[opened]:  # compress overwrites the rows: drop the SWA entry first (H-a)
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


class SwaPool:
    """Content-addressed SWA blocks; id = slot. Hash kept after release (lazy)."""

    def __init__(self, num_blocks: int, block_size: int, checkpoint_capacity: int):
        self.bs = block_size
        self.ref = [0] * num_blocks
        self.hash: List[Optional[int]] = [None] * num_blocks
        self.tokens: List[Optional[tuple]] = [None] * num_blocks
        self.by_hash: Dict[int, int] = {}
        self.lru = OrderedIds()
        self.checkpoint_capacity = checkpoint_capacity
        self.source = None  # SharedSwaSpace or a static SlotPool

    def free_slots(self):
        src = self.source
        return len(src.swa_free) if isinstance(src, SharedSwaSpace) else src.free_slot_count()

    def held_slots(self):
        return sum(1 for r in self.ref if r > 0)

    def lookup(self, h, toks):
        i = self.by_hash.get(h)
        return i if i is not None and self.tokens[i] == tuple(toks) else -1

    def forget(self, i):
        if self.hash[i] is not None and self.by_hash.get(self.hash[i]) == i:
            del self.by_hash[self.hash[i]]
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

    def publish(self, i, h, toks):
        self.hash[i], self.tokens[i] = h, tuple(toks)
        self.by_hash[h] = i

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
        while len(self.lru):  # checkpoint pins only keep cached blocks; the cache is gone
            self.release(self.lru.pop_front())
        self.by_hash.clear()
        for i, r in enumerate(self.ref):
            if r == 0:
                self.hash[i] = None


class _Seq:
    def __init__(self, tokens, num_types):
        self.tokens = list(tokens)
        self.num_prompt = len(tokens)
        self.num_computed = 0
        self.logical: List[int] = []
        self.swa: List[int] = []
        self.phys: List[List[int]] = [[] for _ in range(num_types)]
        self.hashes: List[int] = []
        self.swa_written_lo = 0   # SWA rows of positions [lo, num_computed) are written
        self.swa_freed_upto = 0   # entries below are window-freed
        self.swa_quota = 0
        self.scheduled = 0        # positions the last append scheduled, not yet committed


def span_blocks(w: int, bs: int) -> int:
    """Most blocks that any w consecutive positions touch."""
    return 0 if w <= 0 else ceil_div(w - 1, bs) + 1


class KvManagerModel:
    def __init__(self, *, num_logical_blocks, num_swa_blocks, block_size=128, window=128, mtp_k=0,
                 max_num_batched_tokens=8192, enable_prefix_caching=True, unified=True,
                 compress_ratios=(4, 128), compress_ks=None, type_slots=None, borrow_unreleased_swa=False,
                 full_retain=False, retention_interval=0,
                 checkpoint_frac=0.5, max_num_seqs=256, max_blocks_per_seq=1024):
        bs = block_size
        self.bs, self.window, self.mtp_k = bs, window, mtp_k
        self.prefix_caching, self.unified, self.full_retain = enable_prefix_caching, unified, full_retain
        self.num_logical, self.num_swa = num_logical_blocks, num_swa_blocks
        # Compress types by ratio (k = block_size / ratio rows per block), or by k as
        # the manager's keyword form still accepts.
        self.ks = list(compress_ks) if compress_ks is not None else [bs // r for r in compress_ratios]
        self.max_blocks_per_seq, self.max_num_seqs = max_blocks_per_seq, max_num_seqs
        self.num_types = len(self.ks)
        # SWA geometry (SPEC §1.3) and the per-sequence quota bound.
        self.tail_blocks = max(1, ceil_div(window + mtp_k - 1, bs)) if window > 0 else 0
        self.prefill_peak = self.decode_peak = 0
        if window > 0:
            chunk = span_blocks(max_num_batched_tokens if full_retain else window, bs)
            self.prefill_peak = max(self.tail_blocks, span_blocks(window, bs)) + chunk
            self.decode_peak = span_blocks(window + 2 * (1 + mtp_k) - 1, bs)
        self.retention_blocks = retention_interval // bs
        sparse = full_retain and self.retention_blocks > 0
        capacity = int(num_swa_blocks * checkpoint_frac) if sparse else 0
        # logical blocks
        NB = num_logical_blocks
        self.ref = [0] * NB
        self.hash: List[Optional[int]] = [None] * NB
        self.block_tokens: List[Optional[tuple]] = [None] * NB
        self.binding = [[-1] * NB for _ in range(self.num_types)] if unified else []
        self.free = OrderedIds(range(NB))
        self.by_hash: Dict[int, int] = {}
        self.events: list = []
        self.swa = SwaPool(num_swa_blocks, bs, capacity) if window > 0 else None
        self.space = None
        if unified:
            if type_slots is None:
                type_slots = [num_swa_blocks + ceil_div(NB, bs // k) for k in self.ks]
            self.pools = [SlotPool(n, k, bs, num_swa_blocks) for n, k in zip(type_slots, self.ks)]
            self.space = SharedSwaSpace(num_swa_blocks, self.pools, self._on_swa_evicted, borrow_unreleased_swa)
            self.owner_of = [dict() for _ in self.ks]    # [type] phys -> logical
            self.live_in_slot = [0] * num_swa_blocks     # live bindings per shared slot
            self.reclaimable = OrderedIds()              # busy shared slots with cached bindings only
            if self.swa:
                self.swa.source = self.space
        elif self.swa:
            self.swa.source = SlotPool(num_swa_blocks, 0, bs, 0)
        self.seqs: Dict[int, _Seq] = {}
        self.swa_reserved = capacity
        self.stat = dict.fromkeys(
            ["admissions", "admission_refusals", "appends", "append_refusals", "prefix_query_blocks",
             "compressed_hit_blocks", "prefix_hit_blocks", "reclaimed_slots", "reclaimed_blocks",
             "compress_evictions"], 0)

    # ------------------------------------------------------------ helpers --
    def _blocks_for(self, tokens):
        return ceil_div(tokens, self.bs)

    def _quota_for(self, nb, decoding):
        """Prefilling: two window spans; decoding (after the prompt): the decode window."""
        return min(self.decode_peak if decoding else self.prefill_peak, nb) if self.swa else 0

    def _on_swa_evicted(self, slot):
        self.swa.evict(slot)

    def _forget_logical(self, b):
        h = self.hash[b]
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]
            self.events.append((REMOVED, as_int64(h), 0, False))
        self.hash[b] = None

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

    def _take_block(self, b):
        """A true allocation of free block b: its stale hash dropped. It is live at
        once (with any binding it retains), so no reclaim can take that."""
        self.free.remove(b)
        self._forget_logical(b)
        self.ref[b] = 1
        self._live_change(b, +1)
        return b

    def _fresh_blocks(self, count, skip, fits):
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

    def _bind_popped(self, blocks):
        """Blocks without a binding get one first (the admission counted exactly
        them as compress demand); a retained binding then moves (is freed and
        bound afresh) only if its pool has room without borrowing a shared slot.
        The new block is taken before the old one is freed: freeing first could
        close the very slot that was the room and make the allocation borrow."""
        if not self.unified:
            return
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

    def _capacity_ok_with_reclaim(self, extra_quota, demand, going_live):
        if self._capacity_ok(extra_quota, demand):
            return True
        if not self.unified:
            return False
        usable = self._reclaimable_after(going_live)
        return bool(usable) and self._capacity_ok(extra_quota, demand, usable)

    def _capacity_ok(self, extra_quota, demand, extra_slots=()):
        outstanding = max(0, self.swa_reserved + extra_quota - (self.swa.held_slots() if self.swa else 0))
        if self.unified:
            return self.space.can_serve(outstanding if self.swa else 0, demand, list(extra_slots))
        return self.swa is None or self.swa.free_slots() >= outstanding

    def _reclaim_until(self, extra_quota, demand):
        while not self._capacity_ok(extra_quota, demand):
            assert len(self.reclaimable), "reclaim ran out of reclaimable slots (a broken promise)"
            self._reclaim_one()

    def _lookup(self, h, toks):
        b = self.by_hash.get(h)
        return b if b is not None and self.block_tokens[b] == tuple(toks) else -1

    # ---------------------------------------------------------- admission --
    def _bounded_hit(self, tokens, hit, hashes):
        """Rightmost boundary L <= hit whose trailing tail_blocks are SWA-present."""
        if not self.swa:
            return hit
        run = 0
        for i in range(hit - 1, -1, -1):
            present = self.swa.lookup(hashes[i], tokens[i * self.bs:(i + 1) * self.bs]) >= 0
            run = run + 1 if present else 0
            if run == self.tail_blocks:
                return i + run
        return run

    def _admission(self, tokens):
        bs, n = self.bs, len(tokens)
        nb = self._blocks_for(n)
        assert 0 < n and nb <= self.max_blocks_per_seq
        hashes, hit_ids = [], []
        if self.prefix_caching:
            for i in range(min(nb - 1, n // bs)):  # the last block is never a hit
                toks = tokens[i * bs:(i + 1) * bs]
                h = block_hash(toks, hashes[-1] if hashes else None)
                b = self._lookup(h, toks)
                if b < 0:
                    break
                hashes.append(h)
                hit_ids.append(b)
        compressed_hit = len(hit_ids)
        cached = self._bounded_hit(tokens, compressed_hit, hashes)
        hashes, hit_ids = hashes[:cached], hit_ids[:cached]
        adm = dict(ok=False, compressed_hit=compressed_hit, cached=cached, hashes=hashes, hit_ids=hit_ids,
                   quota=self._quota_for(nb, False), demand=0, nb=nb)
        used_hits = sum(1 for b in hit_ids if self.ref[b] > 0)
        if len(self.free) < nb - used_hits:
            return adm
        free_hits = [b for b in hit_ids if self.ref[b] == 0]
        fresh = self._fresh_blocks(nb - cached, set(hit_ids), lambda blocks, demand:
                                   self._capacity_ok_with_reclaim(adm["quota"], demand, free_hits + blocks))
        if fresh is not None:
            adm.update(ok=True, fresh=fresh[0], demand=fresh[1], evicted=fresh[2])
        return adm

    def can_allocate(self, tokens) -> int:
        a = self._admission(list(tokens))
        return a["cached"] if a["ok"] else -1

    def _push(self, s, b, swa_id):
        s.logical.append(b)
        s.swa.append(swa_id)
        for t in range(self.num_types):
            s.phys[t].append(self.binding[t][b] if self.unified else b)

    def allocate(self, seq_id, tokens) -> int:
        tokens = list(tokens)
        assert seq_id not in self.seqs
        a = self._admission(tokens)
        if not a["ok"]:
            self.stat["admission_refusals"] += 1
            return -1
        s = _Seq(tokens, self.num_types)
        bs, hits = self.bs, a["cached"]
        swa_hit_start = max(0, hits - self.tail_blocks)
        for i, b in enumerate(a["hit_ids"]):
            if b in self.free:
                self.free.remove(b)
                self.ref[b] = 1
                self._live_change(b, +1)
            else:
                self.ref[b] += 1
            swa_id = -1
            if self.swa and i >= swa_hit_start:
                swa_id = self.swa.lookup(a["hashes"][i], tokens[i * bs:(i + 1) * bs])
                self.swa.claim(swa_id)
            self._push(s, b, swa_id)
        popped = [self._take_block(b) for b in a["fresh"]]
        self.stat["compress_evictions"] += a["evicted"]
        self._reclaim_until(a["quota"], a["demand"])
        self._bind_popped(popped)
        for b in popped:
            self._push(s, b, -1)
        s.hashes = list(a["hashes"])
        s.num_computed = hits * bs
        s.swa_written_lo = swa_hit_start * bs
        s.swa_freed_upto = swa_hit_start
        s.swa_quota = a["quota"]
        self.swa_reserved += a["quota"]
        self.seqs[seq_id] = s
        self.stat["admissions"] += 1
        self.stat["prefix_query_blocks"] += a["nb"]
        self.stat["compressed_hit_blocks"] += a["compressed_hit"]
        self.stat["prefix_hit_blocks"] += hits
        return hits * bs

    # ------------------------------------------------------------ prefill --
    def _chunk_swa_blocks(self, s, count):
        """Blocks whose SWA rows a prefill chunk writes: all (full retain) or its last window."""
        if count == 0 or not self.swa:
            return range(0)
        end = s.num_computed + count
        free_before = 0 if self.full_retain else max(0, end - self.window) // self.bs
        return range(max(s.num_computed // self.bs, free_before), (end - 1) // self.bs + 1)

    def ensure_for_tokens(self, seq_ids, counts):
        for sid, n in zip(seq_ids, counts):
            s = self.seqs[sid]
            for i in self._chunk_swa_blocks(s, n):
                if s.swa[i] < 0:
                    s.swa[i] = self.swa.alloc()

    def _is_checkpoint(self, s, i):
        rb, need = self.retention_blocks, self.tail_blocks
        prompt_blocks = s.num_prompt // self.bs  # decode blocks: the segment rule only
        return i % rb >= rb - need or prompt_blocks - need <= i < prompt_blocks

    def _publish_full_blocks(self, s):
        if not self.prefix_caching:
            return
        bs = self.bs
        for i in range(len(s.hashes), s.num_computed // bs):
            toks = s.tokens[i * bs:(i + 1) * bs]
            parent = s.hashes[-1] if s.hashes else None
            h = block_hash(toks, parent)
            b = s.logical[i]
            self.hash[b], self.block_tokens[b] = h, tuple(toks)
            self.by_hash[h] = b
            self.events.append((STORED, as_int64(h), 0 if parent is None else as_int64(parent), parent is not None))
            s.hashes.append(h)
            swa_id = s.swa[i] if self.swa else -1
            if swa_id < 0 or i * bs < s.swa_written_lo:  # only fully written SWA blocks (H7)
                continue
            self.swa.publish(swa_id, h, toks)
            if self.swa.checkpoint_capacity > 0 and self._is_checkpoint(s, i):
                self.swa.pin(swa_id)

    def _free_out_of_window(self, s, seq_len):
        if not self.swa:
            return
        free_before = min(max(0, seq_len - self.window) // self.bs, len(s.swa))
        for i in range(s.swa_freed_upto, free_before):
            if s.swa[i] >= 0:
                self.swa.release(s.swa[i])
                s.swa[i] = -1
        s.swa_freed_upto = max(s.swa_freed_upto, free_before)

    def commit_prefill(self, seq_ids, counts, sampled=None):
        sampled = [-1] * len(seq_ids) if sampled is None else sampled
        for sid, n, tok in zip(seq_ids, counts, sampled):
            s = self.seqs[sid]
            start, end = s.num_computed, s.num_computed + n
            assert end <= len(s.tokens)
            if self.swa and n > 0:
                written_from = start if self.full_retain else max(start, end - self.window)
                if written_from > start:
                    s.swa_written_lo = written_from
            s.num_computed = end
            self._publish_full_blocks(s)
            self._free_out_of_window(s, end)  # the computed length (H-j)
            if tok >= 0:
                s.tokens.append(tok)
                if self.swa:  # decoding from here on: the quota shrinks to the decode bound
                    quota = self._quota_for(len(s.logical), True)
                    self.swa_reserved += quota - s.swa_quota
                    s.swa_quota = quota

    # ------------------------------------------------------------- decode --
    def _append_plan(self, seq_ids, q):
        """Per sequence (need, new blocks); whether each prefix fits; and for the
        whole batch the fresh blocks (batch order), their demand and evictions
        and the extra SWA quota."""
        plan, fits = [], []
        new_blocks = extra_quota = 0
        fresh = ([], 0, 0)
        for sid in seq_ids:
            s = self.seqs[sid]
            need = self._blocks_for(s.num_computed + q)
            add = max(0, need - len(s.logical))
            dq = self._quota_for(need, True) - s.swa_quota
            plan.append((need, add))
            if add == 0 and dq <= 0:
                fits.append(True)
                continue
            new_blocks += add
            extra_quota += max(0, dq)
            quota = extra_quota
            chosen = None
            if new_blocks <= len(self.free):
                chosen = self._fresh_blocks(new_blocks, set(), lambda blocks, demand:
                                            self._capacity_ok_with_reclaim(quota, demand, blocks))
            fits.append(chosen is not None)
            if chosen is not None:
                fresh = chosen
        return plan, fits, extra_quota, fresh

    def can_append(self, seq_ids, q=1) -> int:
        _, fits, _, _ = self._append_plan(seq_ids, q)
        return fits.index(False) if False in fits else len(seq_ids)

    def append(self, seq_ids, q=1):
        plan, fits, extra_quota, (blocks, demand, evicted) = self._append_plan(seq_ids, q)
        if False in fits:
            self.stat["append_refusals"] += 1
            raise RuntimeError("No free KV slots available")
        popped = iter([self._take_block(b) for b in blocks])
        self.stat["compress_evictions"] += evicted
        self._reclaim_until(extra_quota, demand)
        self._bind_popped(list(blocks))
        for sid, (need, add) in zip(seq_ids, plan):
            s = self.seqs[sid]
            if self.swa:
                quota = max(s.swa_quota, self._quota_for(need, True))
                self.swa_reserved += quota - s.swa_quota
                s.swa_quota = quota
            for _ in range(add):
                self._push(s, next(popped), self.swa.alloc() if self.swa else -1)
            self._free_out_of_window(s, s.num_computed + 1)
            s.scheduled = q
        self.stat["appends"] += 1

    def commit_decode(self, seq_ids, counts, tokens):
        pos = 0
        for sid, n in zip(seq_ids, counts):
            s = self.seqs[sid]
            assert s.num_computed + 1 == len(s.tokens) and n >= 1
            assert n <= s.scheduled
            s.num_computed += n
            s.scheduled = 0
            s.tokens.extend(tokens[pos:pos + n])
            pos += n
            self._publish_full_blocks(s)  # decode blocks are cacheable once full and committed

    def deallocate(self, seq_ids):
        for sid in seq_ids:
            s = self.seqs.pop(sid)
            for b in reversed(s.logical):
                self.ref[b] -= 1
                if self.ref[b] == 0:
                    self.free.push_back(b)
                    self._live_change(b, -1)
            if self.swa:
                for w in reversed(s.swa):
                    if w >= 0:
                        self.swa.release(w)
            self.swa_reserved -= s.swa_quota

    def clear_cache(self):
        self.by_hash.clear()
        for b, r in enumerate(self.ref):
            if r == 0:
                self.hash[b] = None
        self.events.append((ALL_CLEARED, 0, 0, False))
        if self.swa:
            self.swa.clear_cache()

    # ---------------------------------------------------------- inspection --
    def logical_table(self, sid):
        return list(self.seqs[sid].logical)

    def swa_table(self, sid):
        return list(self.seqs[sid].swa)

    def phys_table(self, sid, t):
        return list(self.seqs[sid].phys[t])

    def num_computed(self, sid):
        return self.seqs[sid].num_computed

    def num_tokens(self, sid):
        return len(self.seqs[sid].tokens)

    def take_events(self):
        out, self.events = self.events, []
        return out

    def stats(self) -> Dict[str, int]:
        d = dict(num_sequences=len(self.seqs), free_logical_blocks=len(self.free),
                 free_swa_slots=self.swa.free_slots() if self.swa else 0,
                 held_swa_slots=self.swa.held_slots() if self.swa else 0,
                 swa_reserved=self.swa_reserved,
                 reclaimable_slots=len(self.reclaimable) if self.unified else 0)
        d.update(self.stat)
        if self.unified:
            d["swa_evictions"] = self.space.evictions
            d["unreleased_borrows"] = self.space.unreleased_borrows
            for t, p in enumerate(self.pools):  # named by compress ratio, as the manager's stats
                d[f"ratio{self.bs // p.k}_free_blocks"] = self.space.free_blocks(t)
                d[f"ratio{self.bs // p.k}_borrows"] = p.borrows
        return d

    def stage_rows(self, seq_ids, rows):
        """Pure-Python staging: rows[r] = [logical, swa (-1 as 0), phys...] lists
        of max_blocks_per_seq entries each, rewritten in full."""
        width = self.max_blocks_per_seq
        for r, sid in enumerate(seq_ids):
            s = self.seqs[sid]
            pad = [0] * (width - len(s.logical))
            logical, swa, *phys = rows[r]
            logical[:] = s.logical + pad
            swa[:] = list(s.swa) + pad
            for table, blocks in zip(phys, s.phys):
                table[:] = blocks + pad
