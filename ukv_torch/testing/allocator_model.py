"""A plain-Python reference model of the ukv allocator semantics.

Upstream's UnifiedTypePool / UnifiedKvCoordinator semantics with ukv's
fixes: ownership checks that reject and change nothing (upstream let double
frees and foreign ids through), compress takes its own region before
borrowing and borrows the longest-released SWA slot (upstream borrowed the
most recently freed one first), an SWA slot's cache entry is evicted exactly
once, before compress first writes the slot, exact free counts, and joint
admission that never counts one slot for two roles (upstream's separate SWA
and compress checks could both count one released slot).

It is deliberately simple rather than fast: ordered dicts for the FIFO orders,
sets for sub-blocks, free counts recomputed by summation on every query. The
tests run it beside torch.classes.ukv.TypePool / Coordinator and require the
same ids, answers and refusals call for call, so every order rule is explicit:

  * free slots: one FIFO per region (shared [0, shared_slots), own the rest);
    a slot that becomes free goes to the back of its region's FIFO;
  * SWA allocation takes the front of the shared region first, then the own
    region (a TypePool used alone);
  * compress allocation fills the front slot of the "open" FIFO (compress slots
    with a free sub-block) at its smallest free sub-block; with no open slot it
    opens the front free slot of its own region, else of the shared region
    (a borrow), at sub-block 0; a slot gets (re)appended to the open FIFO when
    it is opened with spare sub-blocks or a block of a full slot is freed, and
    leaves it when it fills up or its last block is freed;
  * the Coordinator's SWA free FIFO holds the slots SWA may take now: a slot
    joins at the back when SWA frees it or when the last compress pool holding
    blocks in it frees them, and leaves when SWA takes it or a first compress
    pool borrows it;
  * with borrow_unreleased_swa, a compress allocation that finds no free block
    in its pool at all first lends the last never-used slot of the SWA free
    FIFO to every pool (it becomes released, with nothing cached), then
    borrows it as usual;
  * one compress type's pool used through its own methods (pool_alloc_swa,
    pool_claim_swa, pool_reserve_slot, ...: upstream's coord.csa / coord.hca)
    follows the pool rules; a released shared slot it takes (an SWA block)
    counts like a borrow (SWA may not take it, its cached entry is evicted
    once) and goes back to SWA when no pool holds it. Shared slots are
    reserved only by the SWA space: a pool cannot release those, nor reserve
    a released one that is free in it.
"""
from collections import OrderedDict

MAX_ROWS = 2**31 - 1  # row indices handed to kernels are int32

# Roles of a slot within one type's tensor (the strings TypePool.owner returns).
FREE, RESERVED, SWA, COMPRESS = "free", "reserved", "swa", "compress"

# The Coordinator's view of one shared SWA slot.
AVAILABLE = "available"  # never used by SWA, reserved in every pool
HELD = "held"            # an SWA block lives in it
RELEASED = "released"    # SWA freed (or lent) it: compress pools may borrow it

NO_FREE_SWA = "No free SWA slots available"  # upstream exhaustion texts
NO_FREE_KV = "No free KV slots available"


class InvalidArgument(Exception):
    """A value outside the documented domain; `argument` names it."""

    def __init__(self, argument):
        super().__init__(argument)
        self.argument = argument


class StateConflict(Exception):
    """A well-formed request the current state forbids (double free, foreign id, busy slot)."""


class Exhausted(Exception):
    """No room for the request; `text` is the upstream message it starts with."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text


def ceil_div(a, b):
    return -(-a // b)


def reference_type_slots(num_swa_blocks, num_compress_blocks, k, block_size=128):
    """Upstream's unified_slot_counts for one type: the shared SWA slots plus
    the own slots holding num_compress_blocks blocks of k rows."""
    return num_swa_blocks + ceil_div(num_compress_blocks, block_size // k)


def reference_layer_rows(ratio, num_swa, nb, block_size, unified):
    """Upstream's rows of a layer tensor. Unified: its type's slots x block_size;
    static split: the SWA region plus k rows per logical block; dense: the SWA region."""
    if ratio == 0:
        return num_swa * block_size
    k = block_size // ratio
    if unified:
        return reference_type_slots(num_swa, nb, k, block_size) * block_size
    return num_swa * block_size + nb * k


def _require(ok, argument):
    if not ok:
        raise InvalidArgument(argument)


def _require_distinct(ids):
    if len(set(ids)) != len(ids):
        raise StateConflict("an id appears twice in the batch")


class Fifo:
    """An ordered set: append at the back, take from the front or anywhere."""

    def __init__(self, items=()):
        self._items = OrderedDict.fromkeys(items)

    def push(self, item):
        assert item not in self._items
        self._items[item] = None

    def remove(self, item):
        del self._items[item]

    def front(self):
        return next(iter(self._items))

    def __contains__(self, item):
        return item in self._items

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def copy(self):
        clone = Fifo()
        clone._items = self._items.copy()
        return clone


class PoolModel:
    """One layer type's slot free list (torch.classes.ukv.TypePool)."""

    def __init__(self, num_slots, k, block_size=128, shared_slots=0):
        _require(block_size > 0, "block_size")
        _require(k >= 0, "k")
        _require(k == 0 or (k <= block_size and block_size % k == 0), "k")
        _require(num_slots >= 0, "num_slots")
        _require(num_slots * block_size <= MAX_ROWS, "num_slots")
        _require(0 <= shared_slots <= num_slots, "shared_slots")
        self.num_slots, self.k, self.block_size, self.shared_slots = num_slots, k, block_size, shared_slots
        self.blocks_per_slot = block_size // k if k else 0
        self.compress_ratio = self.blocks_per_slot  # block_size // k; 0 for an SWA-only pool
        self.role = [FREE] * num_slots
        self.free_shared = Fifo(range(shared_slots))
        self.free_own = Fifo(range(shared_slots, num_slots))
        self.open = Fifo()
        self.free_subs = {}  # compress slot -> its free sub-block indices
        self.counters = dict(swa_allocs=0, swa_frees=0, compress_allocs=0, compress_frees=0, borrows=0)

    def copy(self):
        clone = object.__new__(PoolModel)
        clone.__dict__.update(self.__dict__)
        clone.role = list(self.role)
        clone.free_shared, clone.free_own, clone.open = self.free_shared.copy(), self.free_own.copy(), self.open.copy()
        clone.free_subs = {slot: set(subs) for slot, subs in self.free_subs.items()}
        clone.counters = dict(self.counters)
        return clone

    # --- slots ---
    def _check_slot(self, slot):
        _require(0 <= slot < self.num_slots, "slot")

    def _free_fifo(self, slot):
        return self.free_shared if slot < self.shared_slots else self.free_own

    def _take(self, slot, role):
        self._free_fifo(slot).remove(slot)
        self.role[slot] = role

    def _give_back(self, slot):
        self.role[slot] = FREE
        self._free_fifo(slot).push(slot)

    def owner(self, slot):
        self._check_slot(slot)
        return self.role[slot]

    def slot_is_free(self, slot):
        return self.owner(slot) == FREE

    def is_free_swa(self, slot):
        return self.slot_is_free(slot)

    def reserve_slot(self, slot):
        if not self.slot_is_free(slot):
            return False
        self._take(slot, RESERVED)
        return True

    def release_slot(self, slot):
        role = self.owner(slot)
        if role == FREE:
            return  # upstream: releasing a free slot does nothing
        if role != RESERVED:
            raise StateConflict(f"slot {slot} is {role}, not reserved")
        self._give_back(slot)

    # --- SWA role ---
    def free_slots(self):
        return len(self.free_shared) + len(self.free_own)

    def has_free_swa(self, n=1):
        return self.num_slots == 0 or self.free_slots() >= n

    def alloc_swa(self):
        source = self.free_shared if self.free_shared else self.free_own
        if not source:
            raise Exhausted(NO_FREE_KV)
        slot = source.front()
        self._take(slot, SWA)
        self.counters["swa_allocs"] += 1
        return slot

    def free_swa(self, slot):
        if self.owner(slot) != SWA:
            raise StateConflict(f"slot {slot} is not held by SWA")
        self._give_back(slot)
        self.counters["swa_frees"] += 1

    def claim_swa(self, slot):
        if self.owner(slot) != FREE:
            raise StateConflict(f"slot {slot} is not free")
        self._take(slot, SWA)
        self.counters["swa_allocs"] += 1

    def alloc_swa_n(self, n):
        _require(n >= 0, "n")
        if n > self.free_slots():
            raise Exhausted(NO_FREE_KV)
        return [self.alloc_swa() for _ in range(n)]

    def free_swa_many(self, slots):
        for slot in slots:
            if self.owner(slot) != SWA:
                raise StateConflict(f"slot {slot} is not held by SWA")
        _require_distinct(slots)
        for slot in slots:
            self.free_swa(slot)

    # --- compress role ---
    def _check_compress_id(self, phys):
        _require(self.blocks_per_slot > 0, "k")
        _require(0 <= phys < self.num_slots * self.blocks_per_slot, "phys")

    def compress_id_is_held(self, phys):
        self._check_compress_id(phys)
        slot, sub = divmod(phys, self.blocks_per_slot)
        return self.role[slot] == COMPRESS and sub not in self.free_subs[slot]

    def free_compress_blocks(self):
        return sum(len(self.free_subs[slot]) for slot in self.open) + self.free_slots() * self.blocks_per_slot

    def has_free_compress(self, n=1):
        return self.num_slots == 0 or self.blocks_per_slot == 0 or self.free_compress_blocks() >= n

    def take_compress_block(self):
        """Allocate one block: (phys, the slot this opened or None)."""
        _require(self.blocks_per_slot > 0, "k")
        if self.open:
            slot = self.open.front()
            sub = min(self.free_subs[slot])
            self.free_subs[slot].remove(sub)
            if not self.free_subs[slot]:
                self.open.remove(slot)
            opened = None
        else:
            source = self.free_own if self.free_own else self.free_shared
            if not source:
                raise Exhausted(NO_FREE_KV)
            slot = opened = source.front()
            sub = 0
            if source is self.free_shared:
                self.counters["borrows"] += 1
            self._take(slot, COMPRESS)
            self.free_subs[slot] = set(range(1, self.blocks_per_slot))
            if self.free_subs[slot]:
                self.open.push(slot)
        self.counters["compress_allocs"] += 1
        return slot * self.blocks_per_slot + sub, opened

    def return_compress_block(self, phys):
        """Free one block; True when its slot became free."""
        if not self.compress_id_is_held(phys):
            raise StateConflict(f"compress id {phys} is not held")
        slot, sub = divmod(phys, self.blocks_per_slot)
        self.counters["compress_frees"] += 1
        subs = self.free_subs[slot]
        subs.add(sub)
        if len(subs) == self.blocks_per_slot:
            del self.free_subs[slot]
            if slot in self.open:
                self.open.remove(slot)
            self._give_back(slot)
            return True
        if slot not in self.open:
            self.open.push(slot)
        return False

    def alloc_compress(self):
        return self.take_compress_block()[0]

    def free_compress(self, phys):
        self.return_compress_block(phys)

    def alloc_compress_n(self, n):
        _require(n >= 0, "n")
        _require(n == 0 or self.blocks_per_slot > 0, "k")
        if n > self.free_compress_blocks():
            raise Exhausted(NO_FREE_KV)
        return [self.alloc_compress() for _ in range(n)]

    def free_compress_many(self, ids):
        for phys in ids:
            if not self.compress_id_is_held(phys):
                raise StateConflict(f"compress id {phys} is not held")
        _require_distinct(ids)
        for phys in ids:
            self.free_compress(phys)


class CoordinatorModel:
    """The option-2 coordinator over any list of compress types (torch.classes.ukv.Coordinator)."""

    def __init__(self, num_swa_base, ks, num_slots, block_size=128, borrow_unreleased_swa=False):
        _require(len(ks) == len(num_slots), "num_slots")
        _require(num_swa_base >= 0, "num_swa_base")
        _require(block_size > 0, "block_size")
        _require(num_swa_base * block_size <= MAX_ROWS, "num_swa_base")  # the dense layers' rows
        self.pools = []
        for k, slots in zip(ks, num_slots):
            _require(k > 0, "k")
            _require(slots >= num_swa_base, "num_slots")
            self.pools.append(PoolModel(slots, k, block_size, num_swa_base))
        self.num_swa_base, self.block_size = num_swa_base, block_size
        self.borrow_unreleased_swa = borrow_unreleased_swa
        for pool in self.pools:  # compress starts in its own region
            for slot in range(num_swa_base):
                pool.reserve_slot(slot)
        self.swa_role = [AVAILABLE] * num_swa_base
        self.swa_free = Fifo(range(num_swa_base))
        self.cached = set()  # released slots whose rows may still back a cached SWA block
        self.evicted = []    # evictions not yet taken by take_evicted_swa
        self.counters = dict(swa_allocs=0, swa_frees=0, swa_claims=0, swa_evictions=0, unreleased_borrows=0)

    def copy(self):
        clone = object.__new__(CoordinatorModel)
        clone.__dict__.update(self.__dict__)
        clone.pools = [pool.copy() for pool in self.pools]
        clone.swa_role = list(self.swa_role)
        clone.swa_free = self.swa_free.copy()
        clone.cached, clone.evicted, clone.counters = set(self.cached), list(self.evicted), dict(self.counters)
        return clone

    def num_types(self):
        return len(self.pools)

    def ks(self):
        return [pool.k for pool in self.pools]

    def compress_ratios(self):
        return [pool.compress_ratio for pool in self.pools]

    def type_slots(self):
        return [pool.num_slots for pool in self.pools]

    def _pool(self, type_index):
        _require(0 <= type_index < len(self.pools), "type")
        return self.pools[type_index]

    def _check_swa_slot(self, slot):
        _require(0 <= slot < self.num_swa_base, "slot")

    def _pools_holding(self, slot):
        """Pools holding a released shared slot: compress blocks, or an SWA block through the pool."""
        return sum(pool.role[slot] in (COMPRESS, SWA) for pool in self.pools)

    def _pool_took(self, slot):
        """A pool took a free slot: a shared one leaves SWA's reach (first taker) and loses its cache entry."""
        if slot >= self.num_swa_base:
            return
        assert self.swa_role[slot] == RELEASED
        if self._pools_holding(slot) == 1:
            self.swa_free.remove(slot)  # the first borrower: SWA may no longer take it
        if slot in self.cached:
            self.cached.remove(slot)
            self.counters["swa_evictions"] += 1
            self.evicted.append(slot)

    def _pool_gave_back(self, slot):
        if slot < self.num_swa_base and self._pools_holding(slot) == 0:
            self.swa_free.push(slot)  # the last borrower gave it back

    # --- SWA role ---
    def _take_swa(self, slot):
        self.swa_free.remove(slot)
        if self.swa_role[slot] == RELEASED:
            for pool in self.pools:
                assert pool.reserve_slot(slot)
        self.swa_role[slot] = HELD
        self.cached.discard(slot)

    def alloc_swa(self):
        if not self.swa_free:
            raise Exhausted(NO_FREE_SWA)
        slot = self.swa_free.front()
        self._take_swa(slot)
        self.counters["swa_allocs"] += 1
        return slot

    def claim_swa(self, slot):
        self._check_swa_slot(slot)
        if slot not in self.swa_free:
            raise StateConflict(f"SWA slot {slot} is not free")
        self._take_swa(slot)
        self.counters["swa_claims"] += 1

    def free_swa(self, slot):
        self._check_swa_slot(slot)
        if self.swa_role[slot] != HELD:
            raise StateConflict(f"SWA slot {slot} is not held")
        for pool in self.pools:
            pool.release_slot(slot)
        self.swa_role[slot] = RELEASED
        self.cached.add(slot)
        self.swa_free.push(slot)
        self.counters["swa_frees"] += 1

    def is_free_swa(self, slot):
        self._check_swa_slot(slot)
        return slot in self.swa_free

    def has_free_swa(self, n=1):
        return self.num_swa_base == 0 or len(self.swa_free) >= n

    def free_swa_slots(self):
        return len(self.swa_free)

    def alloc_swa_n(self, n):
        _require(n >= 0, "n")
        if n > len(self.swa_free):
            raise Exhausted(NO_FREE_SWA)
        return [self.alloc_swa() for _ in range(n)]

    def free_swa_many(self, slots):
        for slot in slots:
            self._check_swa_slot(slot)
            if self.swa_role[slot] != HELD:
                raise StateConflict(f"SWA slot {slot} is not held")
        _require_distinct(slots)
        for slot in slots:
            self.free_swa(slot)

    # --- compress role ---
    def _lendable(self):
        """Never-used free SWA slots, in SWA free FIFO order, that compress may be lent."""
        if not self.borrow_unreleased_swa:
            return []
        return [slot for slot in self.swa_free if self.swa_role[slot] == AVAILABLE]

    def _lend(self, slot):
        for pool in self.pools:
            pool.release_slot(slot)
        self.swa_role[slot] = RELEASED  # nothing cached: SWA never wrote it
        self.counters["unreleased_borrows"] += 1

    def alloc_compress(self, type_index):
        pool = self._pool(type_index)
        lendable = self._lendable()
        if pool.free_compress_blocks() == 0 and lendable:
            self._lend(lendable[-1])  # the one SWA would take last
        phys, opened = pool.take_compress_block()
        if opened is not None:
            self._pool_took(opened)
        return phys

    def free_compress(self, type_index, phys):
        pool = self._pool(type_index)
        if pool.return_compress_block(phys):
            self._pool_gave_back(phys // pool.blocks_per_slot)

    def has_free_compress(self, type_index, n=1):
        return self._pool(type_index).num_slots == 0 or self.free_compress_blocks(type_index) >= n

    def free_compress_blocks(self, type_index):
        pool = self._pool(type_index)
        return pool.free_compress_blocks() + len(self._lendable()) * pool.blocks_per_slot

    def alloc_compress_n(self, type_index, n):
        self._pool(type_index)
        _require(n >= 0, "n")
        if n > self.free_compress_blocks(type_index):
            raise Exhausted(NO_FREE_KV)
        return [self.alloc_compress(type_index) for _ in range(n)]

    def free_compress_many(self, type_index, ids):
        pool = self._pool(type_index)
        for phys in ids:
            if not pool.compress_id_is_held(phys):
                raise StateConflict(f"compress id {phys} is not held")
        _require_distinct(ids)
        for phys in ids:
            self.free_compress(type_index, phys)

    def owner(self, type_index, slot):
        return self._pool(type_index).owner(slot)

    def pool_slot_is_free(self, type_index, slot):
        return self._pool(type_index).slot_is_free(slot)

    # --- one type's pool through its own methods ---
    def pool_reserve_slot(self, type_index, slot):
        pool = self._pool(type_index)
        if 0 <= slot < self.num_swa_base and pool.slot_is_free(slot):
            raise StateConflict(f"slot {slot} is in the SWA space, which only the coordinator reserves")
        return pool.reserve_slot(slot)  # the own region (or False)

    def pool_release_slot(self, type_index, slot):
        pool = self._pool(type_index)
        if 0 <= slot < self.num_swa_base and self.swa_role[slot] != RELEASED:
            raise StateConflict(f"slot {slot} is reserved for the SWA space")
        pool.release_slot(slot)  # a released shared slot is never reserved in a pool

    def pool_alloc_swa(self, type_index):
        slot = self._pool(type_index).alloc_swa()
        self._pool_took(slot)
        return slot

    def pool_free_swa(self, type_index, slot):
        self._pool(type_index).free_swa(slot)
        self._pool_gave_back(slot)

    def pool_claim_swa(self, type_index, slot):
        self._pool(type_index).claim_swa(slot)
        self._pool_took(slot)

    def pool_has_free_swa(self, type_index, n=1):
        return self._pool(type_index).has_free_swa(n)

    def pool_free_slots(self, type_index):
        return self._pool(type_index).free_slots()

    def take_evicted_swa(self):
        taken, self.evicted = self.evicted, []
        return taken

    def all_counters(self):
        """The Coordinator's counters() dict: its own plus each pool's compress counters."""
        out = dict(self.counters)
        for t, pool in enumerate(self.pools):
            for name in ("compress_allocs", "compress_frees", "borrows"):
                out[f"type{t}_{name}"] = pool.counters[name]
        return out

    # --- joint admission: one slot is never counted for both SWA and compress ---
    def check_joint_demand(self, n_swa, compress_demand):
        _require(len(compress_demand) == len(self.pools), "compress_demand")
        _require(n_swa >= 0, "n_swa")
        for demand in compress_demand:
            _require(demand >= 0, "compress_demand")

    def joint_admission_bounds(self, n_swa, compress_demand):
        """(must_admit, must_refuse) for can_allocate_jointly, from first principles.

        must_refuse: allocating the demand alone already fails (too few SWA
        slots, or too few blocks of one type), so no order can succeed.
        must_admit: the demand succeeds in every order for an obvious reason:
        the roles never compete for a slot, because no compress type needs to
        borrow, or SWA asks for nothing, or there is no SWA space to share.
        A check between the two is free to be conservative; its promise is
        verified by allocations_succeed.
        """
        self.check_joint_demand(n_swa, compress_demand)
        swa_enabled = self.num_swa_base > 0
        enabled = [(t, pool, d) for t, (pool, d) in enumerate(zip(self.pools, compress_demand)) if pool.num_slots > 0]
        must_refuse = (swa_enabled and n_swa > len(self.swa_free)) or any(
            d > self.free_compress_blocks(t) for t, _, d in enabled)
        no_borrowing = all(d <= _free_own_blocks(pool) for _, pool, d in enabled)
        must_admit = not must_refuse and (no_borrowing or n_swa == 0 or not swa_enabled)
        return must_admit, must_refuse

    def allocations_succeed(self, order):
        """Whether allocating `order` (a sequence of "swa" or a compress type index)
        from a copy of the current state succeeds throughout."""
        trial = self.copy()
        try:
            for role in order:
                if role == "swa":
                    if trial.num_swa_base > 0:
                        trial.alloc_swa()
                elif trial.pools[role].num_slots > 0:
                    trial.alloc_compress(role)
        except Exhausted:
            return False
        return True


def _free_own_blocks(pool):
    """Blocks the pool can hand out without opening a shared slot."""
    return sum(len(pool.free_subs[slot]) for slot in pool.open) + len(pool.free_own) * pool.blocks_per_slot


# --- the torch classes' constructor arguments: compress types named by ratio ---
def rows_per_compress_block(compress_ratio, block_size):
    """k = block_size / compress_ratio (0: an SWA-only pool), refused as the core refuses it."""
    _require(block_size > 0, "block_size")
    _require(compress_ratio >= 0, "compress_ratio")
    if compress_ratio == 0:
        return 0
    _require(block_size % compress_ratio == 0, "compress_ratio")
    return block_size // compress_ratio


def pool_model(num_slots, compress_ratio, block_size, shared_slots=0):
    """The PoolModel of torch.classes.ukv.TypePool(num_slots, compress_ratio, block_size, shared_slots)."""
    return PoolModel(num_slots, rows_per_compress_block(compress_ratio, block_size), block_size, shared_slots)


def coordinator_model(num_swa_base, compress_ratios, num_slots, block_size, borrow_unreleased_swa=False):
    """The CoordinatorModel of torch.classes.ukv.Coordinator(num_swa_base, compress_ratios, num_slots,
    block_size, borrow_unreleased_swa): the ratios are checked first, as the torch class does."""
    _require(len(compress_ratios) == len(num_slots), "num_slots")
    ks = []
    for ratio in compress_ratios:
        _require(ratio > 0, "compress_ratio")
        ks.append(rows_per_compress_block(ratio, block_size))
    return CoordinatorModel(num_swa_base, ks, num_slots, block_size, borrow_unreleased_swa)
