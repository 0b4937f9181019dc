"""Seed-compatible drop-ins for the upstream `unified_chunk_pool` module.

`UnifiedTypePool`, `UnifiedKvCoordinator` and `unified_slot_counts` take the
upstream constructor arguments and offer the upstream attributes, methods,
parameter names and results, backed by `torch.classes.ukv.TypePool` /
`torch.classes.ukv.Coordinator`:

- `unified_slot_counts(num_swa_blocks, num_compress_blocks, block_size=128)`;
- `UnifiedTypePool(num_slots, k, block_size=128)`: attributes `num_slots`,
  `k`, `block_size`, `blocks_per_slot`, `enabled`; methods `reserve_slot(s)`,
  `release_slot(s)`, `slot_is_free(s)`, `has_free_swa(n_blocks)`,
  `has_free_compress(n_blocks)`, `num_free_slots()`, `alloc_swa()`,
  `free_swa(phys)`, `is_free_swa(phys)`, `claim_swa(phys)`,
  `alloc_compress()`, `free_compress(phys)`;
- `UnifiedKvCoordinator(num_swa_base, n_csa_slots, n_hca_slots,
  block_size=128)`: attributes `enabled`, `num_swa_base`, `block_size` and the
  per-type pools `csa` and `hca`, each with the whole pool interface above;
  methods `set_swa_evict_cb(cb)`, `alloc_swa()`, `free_swa(s)`,
  `is_free_swa(s)`, `claim_swa(s)`, `has_free_swa(n)`, `alloc_csa()`,
  `free_csa(phys)`, `has_free_csa(n)`, `alloc_hca()`, `free_hca(phys)`,
  `has_free_hca(n)`.

Every parameter takes upstream's name as a keyword. The block size may also be
given as `bs` (the older spelling of these drop-ins), never both. The
attributes `bs` and `bps` (= `blocks_per_slot`) remain as well.

Where they deliberately differ from upstream:

- Where upstream silently corrupted state (double free, freeing a foreign
  id, claiming a non-free slot, releasing a slot the SWA space holds) these
  raise instead and change nothing. An argument that is not an int is a
  TypeError, and one out of range a ValueError, each naming the parameter.
- Compress allocation takes its own region before borrowing SWA-freed slots
  (upstream took the most recently freed SWA slot first, evicting SWA
  prefix-cache entries while its own region still had room).
- Deterministic id order: free lists are FIFO (a freed or released slot goes
  to the back) and a slot's sub-blocks are handed out lowest first, where
  upstream reuses a slot's old queue entry and pops sub-blocks from a set. Ids
  can differ from upstream's; behaviour does not, and the same calls give the
  same ids on every process.
- Calls on a coordinator's `csa` / `hca` pool keep its SWA bookkeeping
  exact, where upstream's bypassed it. A released slot that a pool takes for
  an SWA block leaves SWA's free list and has its cached SWA block evicted,
  as a compress borrow does. Reservations in the shared SWA region stay the
  SWA space's: a pool can neither release them nor reserve a released slot.

Exhaustion raises `OutOfSlots`, a subclass of both RuntimeError and
AssertionError, so code catching the upstream AssertionError keeps working.
"""
from __future__ import annotations

import functools
import operator
import threading
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .batch_calls import BatchCalls

__all__ = [
    "OutOfSlots",
    "UnifiedTypePool",
    "UnifiedKvCoordinator",
    "unified_slot_counts",
    "slot_counts",
]

CSA_K = 32  # compressed rows per 128-token block, compress ratio 4
HCA_K = 1   # compress ratio 128


class OutOfSlots(RuntimeError, AssertionError):
    """No free slot (or compress block) is left for the request."""


def _raises_out_of_slots(fn):
    """Re-raise the core's exhaustion error (a RuntimeError whose text starts
    with "No free") as OutOfSlots; every other error passes through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            if str(exc).startswith("No free"):
                raise OutOfSlots(str(exc)) from None
            raise

    return wrapper


def _torch_object(drop_in: str, make: Callable[[], "torch.ScriptObject"], **arguments):
    """Build a drop-in's torch object. A bad argument's ValueError is prefixed
    with the drop-in's own arguments (n_csa_slots, ...; the block size labelled
    bs, as these messages always had it), since the core's reason names those
    of the torch class (block_size, compress type 0, ...)."""
    try:
        return make()
    except ValueError as exc:
        given = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        raise ValueError(f"{drop_in}({given}): {exc}") from None


def _int(method: str, name: str, value) -> int:
    """An int argument (anything with __index__, bools included as upstream's
    set lookups take them); otherwise a TypeError naming the parameter."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{method}: {name} must be an int, got {type(value).__name__}") from None


def _call(method: str, name: str, value, call: Callable[[int], object]):
    """call(value) for an int argument `name`: a wrong type is a TypeError and a
    value out of range a ValueError, each naming the parameter."""
    value = _int(method, name, value)
    try:
        return call(value)
    except ValueError as exc:
        raise ValueError(f"{exc} ({name}={value})") from None


class _DefaultInt(int):
    """A default argument value, told apart from the same value given explicitly."""

    def __repr__(self):
        return int.__repr__(self)


_DEFAULT_BLOCK_SIZE = _DefaultInt(128)


def _block_size(drop_in: str, block_size, bs) -> int:
    """The block size, given as upstream's `block_size` or as the older spelling `bs`, not both."""
    if bs is None:
        return _int(drop_in, "block_size", block_size)
    if block_size is not _DEFAULT_BLOCK_SIZE:
        raise TypeError(f"{drop_in}() got both block_size and bs (its older spelling): give one")
    return _int(drop_in, "bs", bs)


def slot_counts(num_swa_blocks: int, num_compress_blocks: int, compress_ratios: Sequence[int],
                block_size: int) -> List[int]:
    """Slots of each compress type's tensor: num_swa_blocks + ceil(NB / ratio), the
    type's k = block_size / ratio rows per block packed block_size / k to a slot.

    The same C++ function sizes the Coordinator's pools and the unified_kv tensors.
    """
    return list(torch.ops.ukv.slot_counts(num_swa_blocks, num_compress_blocks, list(compress_ratios), block_size))


def _ratio_of(k: int, bs: int) -> int:
    """The compress ratio of upstream's k rows per block (0: an SWA-only pool)."""
    if bs <= 0:  # before bs // k, which would make a bad block size ratio 0
        raise ValueError(f"block_size must be > 0, got {bs}")
    if k == 0:
        return 0
    if not isinstance(k, int) or k < 0 or bs % k:
        raise ValueError(f"k (rows per compress block) must divide block_size {bs}, got {k}")
    return bs // k


def unified_slot_counts(num_swa_blocks: int, num_compress_blocks: int,
                        block_size: int = _DEFAULT_BLOCK_SIZE, *, bs: Optional[int] = None) -> Tuple[int, int]:
    """Upstream sizing: (n_csa_slots, n_hca_slots) for CSA k=32 and HCA k=1.
    `bs` is accepted for `block_size`."""
    block_size = _block_size("unified_slot_counts", block_size, bs)
    n_csa, n_hca = slot_counts(num_swa_blocks, num_compress_blocks,
                               [_ratio_of(CSA_K, block_size), _ratio_of(HCA_K, block_size)], block_size)
    return n_csa, n_hca


class _PoolMethods:
    """Upstream `UnifiedTypePool`'s methods under its parameter names, over
    `self._core`: an object with TypePool's method names (a TypePool, or one
    compress type of a coordinator)."""

    def reserve_slot(self, s: int) -> bool:
        """Reserve free slot s for an external owner; False if it is not free."""
        return _call("reserve_slot", "s", s, self._core.reserve_slot)

    def release_slot(self, s: int) -> None:
        """Give a reserved slot back to the free list (a free slot: nothing happens)."""
        _call("release_slot", "s", s, self._core.release_slot)

    def slot_is_free(self, s: int) -> bool:
        return _call("slot_is_free", "s", s, self._core.slot_is_free)

    def owner(self, s: int) -> str:
        """Who holds slot s: "free", "reserved", "swa" or "compress"."""
        return _call("owner", "s", s, self._core.owner)

    def has_free_swa(self, n_blocks: int = 1) -> bool:
        """Whether n_blocks SWA blocks fit (a disabled pool: True)."""
        return _call("has_free_swa", "n_blocks", n_blocks, self._core.has_free_swa)

    def has_free_compress(self, n_blocks: int = 1) -> bool:
        """Whether n_blocks compress blocks fit (a disabled or SWA-only pool: True)."""
        return _call("has_free_compress", "n_blocks", n_blocks, self._core.has_free_compress)

    def num_free_slots(self) -> int:
        """Slots on the free list (neither SWA, compress nor reserved)."""
        return self._core.free_slots()

    @_raises_out_of_slots
    def alloc_swa(self) -> int:
        """Take a free slot for one SWA block; its id is the slot."""
        return self._core.alloc_swa()

    def free_swa(self, phys: int) -> None:
        _call("free_swa", "phys", phys, self._core.free_swa)

    def is_free_swa(self, phys: int) -> bool:
        return _call("is_free_swa", "phys", phys, self._core.is_free_swa)

    def claim_swa(self, phys: int) -> None:
        """Take the specific free slot phys for an SWA block (a cache-hit reclaim)."""
        _call("claim_swa", "phys", phys, self._core.claim_swa)

    @_raises_out_of_slots
    def alloc_compress(self) -> int:
        """One compress block: phys = slot * blocks_per_slot + sub, rows [phys * k, (phys + 1) * k)."""
        return self._core.alloc_compress()

    def free_compress(self, phys: int) -> None:
        _call("free_compress", "phys", phys, self._core.free_compress)


class UnifiedTypePool(_PoolMethods):
    """One layer type's shared slot free-list (upstream `UnifiedTypePool`).

    A slot of `block_size` rows is free, SWA-held (phys = slot) or
    compress-held and split into `blocks_per_slot = block_size // k` blocks
    (phys = slot * blocks_per_slot + sub, row = phys * k). k = 0 makes an
    SWA-only pool. `bs` is accepted for `block_size`; `bs` and `bps` remain as
    attributes. Ids follow the deterministic order of the module docstring
    (FIFO slots, a slot's sub-blocks lowest first). `torch_object` is the
    underlying torch.classes.ukv.TypePool (batch methods, counters, pickling).
    """

    def __init__(self, num_slots: int, k: int, block_size: int = _DEFAULT_BLOCK_SIZE, *, bs: Optional[int] = None):
        block_size = _block_size("UnifiedTypePool", block_size, bs)
        num_slots, k = _int("UnifiedTypePool", "num_slots", num_slots), _int("UnifiedTypePool", "k", k)
        self.torch_object = _torch_object(
            "UnifiedTypePool", lambda: torch.classes.ukv.TypePool(num_slots, _ratio_of(k, block_size), block_size, 0),
            num_slots=num_slots, k=k, bs=block_size)
        self._core = self.torch_object
        self.num_slots = num_slots
        self.k = k
        self.block_size = self.bs = block_size
        self.blocks_per_slot = self.bps = block_size // k if k else 0
        self.enabled = num_slots > 0
        self._batch = BatchCalls(self.torch_object)

    @_raises_out_of_slots
    def alloc_compress_n(self, n: int) -> torch.Tensor:
        """Allocate n compress blocks at once (all or nothing), as an int64 tensor."""
        return self._batch.alloc_compress_n(n)

    def free_compress_many(self, ids: torch.Tensor) -> None:
        """Free a batch of compress blocks; the whole batch is validated first."""
        self._batch.free_compress_many(ids)


class _CoordinatorType:
    """One compress type of a drop-in coordinator under TypePool's method
    names. A call that takes a released shared slot delivers that slot's
    eviction before it returns, as alloc_csa / alloc_hca do."""

    def __init__(self, coordinator: "UnifiedKvCoordinator", type_index: int):
        self._coordinator, self._type = coordinator, type_index

    def _torch(self) -> "torch.ScriptObject":
        return self._coordinator.torch_object

    def _took(self, slot: int) -> None:
        if slot < self._coordinator.num_swa_base:
            self._coordinator._deliver_evictions()

    def reserve_slot(self, s: int) -> bool:
        return self._torch().pool_reserve_slot(self._type, s)  # the own region only: nothing to evict

    def release_slot(self, s: int) -> None:
        self._torch().pool_release_slot(self._type, s)

    def slot_is_free(self, s: int) -> bool:
        return self._torch().pool_slot_is_free(self._type, s)

    is_free_swa = slot_is_free

    def owner(self, s: int) -> str:
        return self._torch().owner(self._type, s)

    def has_free_swa(self, n: int) -> bool:
        return self._torch().pool_has_free_swa(self._type, n)

    def has_free_compress(self, n: int) -> bool:
        return self._torch().has_free_compress(self._type, n)

    def free_slots(self) -> int:
        return self._torch().pool_free_slots(self._type)

    def alloc_swa(self) -> int:
        with self._coordinator._eviction_lock:
            slot = self._torch().pool_alloc_swa(self._type)
            self._took(slot)
        return slot

    def free_swa(self, phys: int) -> None:
        self._torch().pool_free_swa(self._type, phys)

    def claim_swa(self, phys: int) -> None:
        with self._coordinator._eviction_lock:
            self._torch().pool_claim_swa(self._type, phys)
            self._took(phys)

    def alloc_compress(self) -> int:
        pool = (self._coordinator.csa, self._coordinator.hca)[self._type]
        return self._coordinator._alloc_compress(self._type, pool.blocks_per_slot)

    def free_compress(self, phys: int) -> None:
        self._torch().free_compress(self._type, phys)


class _CoordinatorPool(_PoolMethods):
    """A coordinator's per-type pool (`coord.csa`, `coord.hca`): upstream's
    pool interface over that compress type's tensor. Slots [0, num_swa_base)
    are the shared SWA space: reserved in the pool while the SWA space holds
    them or never used them, free once SWA released them. alloc_compress /
    free_compress are alloc_csa / free_csa (or _hca). Every call keeps the
    coordinator's SWA bookkeeping exact: an SWA block the pool takes in a
    released slot makes it unavailable to SWA and evicts its cached SWA block,
    as a compress borrow does. Reservations in the shared region belong to the
    SWA space, so release_slot refuses them and reserve_slot refuses a released
    slot that is free (upstream let either corrupt the coordinator)."""

    def __init__(self, coordinator: "UnifiedKvCoordinator", type_index: int, k: int, num_slots: int,
                 block_size: int):
        self._core = _CoordinatorType(coordinator, type_index)
        self.k = k
        self.num_slots = num_slots
        self.block_size = self.bs = block_size
        self.blocks_per_slot = self.bps = block_size // k
        self.enabled = num_slots > 0


class UnifiedKvCoordinator:
    """The option-2 coordinator (upstream `UnifiedKvCoordinator`).

    One SWA slot space [0, num_swa_base) valid in every layer tensor, a CSA pool
    (`csa`, k = 32) of n_csa_slots and an HCA pool (`hca`, k = 1) of
    n_hca_slots. `bs` is accepted for `block_size`. Ids follow the
    deterministic order of the module docstring. `set_swa_evict_cb(cb)`
    registers the SWA pool's eviction hook: when a compress allocation borrows a
    released slot that may still back a cached SWA block, cb(slot) is called
    once, before alloc_csa/alloc_hca returns, and before any other thread's
    allocation can receive a block of that slot. Evictions caused by calls
    made directly on `torch_object` are that caller's to take
    (`torch_object.take_evicted_swa()`).
    """

    CSA, HCA = 0, 1

    def __init__(self, num_swa_base: int, n_csa_slots: int, n_hca_slots: int,
                 block_size: int = _DEFAULT_BLOCK_SIZE, *, bs: Optional[int] = None):
        block_size = _block_size("UnifiedKvCoordinator", block_size, bs)
        num_swa_base = _int("UnifiedKvCoordinator", "num_swa_base", num_swa_base)
        n_csa_slots = _int("UnifiedKvCoordinator", "n_csa_slots", n_csa_slots)
        n_hca_slots = _int("UnifiedKvCoordinator", "n_hca_slots", n_hca_slots)
        self.torch_object = _torch_object(
            "UnifiedKvCoordinator",
            lambda: torch.classes.ukv.Coordinator(num_swa_base, [_ratio_of(CSA_K, block_size),
                                                                 _ratio_of(HCA_K, block_size)],
                                                  [n_csa_slots, n_hca_slots], block_size),
            num_swa_base=num_swa_base, n_csa_slots=n_csa_slots, n_hca_slots=n_hca_slots, bs=block_size)
        self.num_swa_base = num_swa_base
        self.block_size = self.bs = block_size
        self.enabled = num_swa_base > 0
        self.csa = _CoordinatorPool(self, self.CSA, CSA_K, n_csa_slots, block_size)
        self.hca = _CoordinatorPool(self, self.HCA, HCA_K, n_hca_slots, block_size)
        self._swa_evict_cb: Optional[Callable[[int], None]] = None
        # Held from a compress allocation until its eviction callback returns,
        # so no thread receives a block of a borrowed slot while the slot's SWA
        # cache entry is still being dropped. Reentrant: a callback may allocate.
        self._eviction_lock = threading.RLock()

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_eviction_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._eviction_lock = threading.RLock()

    def set_swa_evict_cb(self, cb: Optional[Callable[[int], None]]) -> None:
        self._swa_evict_cb = cb

    def _deliver_evictions(self) -> None:
        if self._swa_evict_cb is None:
            self.torch_object.take_evicted_swa()  # nobody listens: keep the queue empty
            return
        for slot in self.torch_object.take_evicted_swa():
            self._swa_evict_cb(slot)

    # --- SWA side ---
    @_raises_out_of_slots
    def alloc_swa(self) -> int:
        return self.torch_object.alloc_swa()

    def free_swa(self, s: int) -> None:
        """Free SWA slot s: it goes to the back of SWA's free list and is released to
        both pools; its SWA block stays cached until a pool borrows the slot."""
        _call("free_swa", "s", s, self.torch_object.free_swa)

    def is_free_swa(self, s: int) -> bool:
        """Whether SWA may take slot s now: not held by SWA, not borrowed by a pool."""
        return _call("is_free_swa", "s", s, self.torch_object.is_free_swa)

    def claim_swa(self, s: int) -> None:
        """Take the specific free slot s back for SWA (a cache-hit reclaim)."""
        _call("claim_swa", "s", s, self.torch_object.claim_swa)

    def has_free_swa(self, n: int = 1) -> bool:
        """Whether n SWA slots are free now (a disabled coordinator: True)."""
        return _call("has_free_swa", "n", n, self.torch_object.has_free_swa)

    # --- compress side ---
    @_raises_out_of_slots
    def _alloc_compress_block(self, type_index: int) -> int:
        return self.torch_object.alloc_compress(type_index)

    def _alloc_compress(self, type_index: int, blocks_per_slot: int) -> int:
        with self._eviction_lock:
            phys = self._alloc_compress_block(type_index)
            # Only a call that opened a shared slot (sub-block 0 of a slot below
            # num_swa_base) can have evicted; skip the second call otherwise.
            if phys % blocks_per_slot == 0 and phys // blocks_per_slot < self.num_swa_base:
                self._deliver_evictions()
        return phys

    def alloc_csa(self) -> int:
        return self._alloc_compress(self.CSA, self.csa.blocks_per_slot)

    def alloc_hca(self) -> int:
        return self._alloc_compress(self.HCA, self.hca.blocks_per_slot)

    def free_csa(self, phys: int) -> None:
        _call("free_csa", "phys", phys, lambda p: self.torch_object.free_compress(self.CSA, p))

    def free_hca(self, phys: int) -> None:
        _call("free_hca", "phys", phys, lambda p: self.torch_object.free_compress(self.HCA, p))

    def has_free_csa(self, n: int = 1) -> bool:
        return _call("has_free_csa", "n", n, lambda m: self.torch_object.has_free_compress(self.CSA, m))

    def has_free_hca(self, n: int = 1) -> bool:
        return _call("has_free_hca", "n", n, lambda m: self.torch_object.has_free_compress(self.HCA, m))

    def can_allocate_jointly(self, n_swa: int, n_csa: int, n_hca: int) -> bool:
        """Whether n_swa SWA blocks and n_csa / n_hca compress blocks can all be
        allocated, in any order, without one slot being counted for two roles."""
        return self.torch_object.can_allocate_jointly(n_swa, [n_csa, n_hca])
