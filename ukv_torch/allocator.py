"""Seed-compatible drop-ins for the upstream `unified_chunk_pool` module.

`UnifiedTypePool`, `UnifiedKvCoordinator` and `unified_slot_counts` take the
upstream constructor arguments and offer the upstream methods, attributes and
results, backed by `torch.classes.ukv.TypePool` / `torch.classes.ukv.Coordinator`.
Where upstream silently corrupted state (double free, freeing a foreign id,
claiming a non-free slot) these raise instead and change nothing; compress
allocation takes its own region before borrowing SWA-freed slots (SPEC.md H5).

Exhaustion raises `OutOfSlots`, a subclass of both RuntimeError and
AssertionError, so code catching the upstream AssertionError keeps working.
"""
from __future__ import annotations

import functools
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
    with the drop-in's own arguments (bs, n_csa_slots, ...), since the core's
    reason names those of the torch class (block_size, compress type 0, ...)."""
    try:
        return make()
    except ValueError as exc:
        given = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        raise ValueError(f"{drop_in}({given}): {exc}") from None


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
                        block_size: int = 128) -> Tuple[int, int]:
    """Upstream sizing: (n_csa_slots, n_hca_slots) for CSA k=32 and HCA k=1."""
    n_csa, n_hca = slot_counts(num_swa_blocks, num_compress_blocks,
                               [_ratio_of(CSA_K, block_size), _ratio_of(HCA_K, block_size)], block_size)
    return n_csa, n_hca


class UnifiedTypePool:
    """One layer type's shared slot free-list (upstream `UnifiedTypePool`).

    A slot of `bs` rows is free, SWA-held (phys = slot) or compress-held and split
    into `bps = bs // k` blocks (phys = slot * bps + sub, row = phys * k).
    k = 0 makes an SWA-only pool. `torch_object` is the underlying
    torch.classes.ukv.TypePool (batch methods, counters, pickling).
    """

    def __init__(self, num_slots: int, k: int, bs: int = 128):
        self.torch_object = _torch_object("UnifiedTypePool", lambda: torch.classes.ukv.TypePool(num_slots, _ratio_of(k, bs), bs, 0),
                                          num_slots=num_slots, k=k, bs=bs)
        self.num_slots = num_slots
        self.k = k
        self.bs = bs
        self.bps = bs // k if k else 0
        self.enabled = num_slots > 0
        self._batch = BatchCalls(self.torch_object)

    def reserve_slot(self, s: int) -> bool:
        return self.torch_object.reserve_slot(s)

    def release_slot(self, s: int) -> None:
        self.torch_object.release_slot(s)

    def slot_is_free(self, s: int) -> bool:
        return self.torch_object.slot_is_free(s)

    def has_free_swa(self, n: int = 1) -> bool:
        return self.torch_object.has_free_swa(n)

    def has_free_compress(self, n: int = 1) -> bool:
        return self.torch_object.has_free_compress(n)

    @_raises_out_of_slots
    def alloc_swa(self) -> int:
        return self.torch_object.alloc_swa()

    def free_swa(self, p: int) -> None:
        self.torch_object.free_swa(p)

    def is_free_swa(self, p: int) -> bool:
        return self.torch_object.is_free_swa(p)

    def claim_swa(self, p: int) -> None:
        self.torch_object.claim_swa(p)

    @_raises_out_of_slots
    def alloc_compress(self) -> int:
        return self.torch_object.alloc_compress()

    def free_compress(self, p: int) -> None:
        self.torch_object.free_compress(p)

    @_raises_out_of_slots
    def alloc_compress_n(self, n: int) -> torch.Tensor:
        """Allocate n compress blocks at once (all or nothing), as an int64 tensor."""
        return self._batch.alloc_compress_n(n)

    def free_compress_many(self, ids: torch.Tensor) -> None:
        """Free a batch of compress blocks; the whole batch is validated first."""
        self._batch.free_compress_many(ids)


class _PoolView:
    """Read-only view of one of a coordinator's per-type pools (`coord.csa`, `coord.hca`)."""

    def __init__(self, coordinator: "torch.ScriptObject", type_index: int, k: int, num_slots: int, bs: int):
        self._c = coordinator
        self._t = type_index
        self.k = k
        self.num_slots = num_slots
        self.bs = bs
        self.bps = bs // k
        self.enabled = num_slots > 0

    def slot_is_free(self, s: int) -> bool:
        return self._c.pool_slot_is_free(self._t, s)

    def has_free_compress(self, n: int = 1) -> bool:
        return self._c.has_free_compress(self._t, n)

    def owner(self, s: int) -> str:
        return self._c.owner(self._t, s)


class UnifiedKvCoordinator:
    """The option-2 coordinator (upstream `UnifiedKvCoordinator`).

    One SWA slot space [0, num_swa_base) valid in every layer tensor, a CSA pool
    of n_csa_slots and an HCA pool of n_hca_slots. `set_swa_evict_cb(cb)`
    registers the SWA pool's eviction hook: when a compress allocation borrows a
    released slot that may still back a cached SWA block, cb(slot) is called
    once, before alloc_csa/alloc_hca returns, and before any other thread's
    allocation can receive a block of that slot. Evictions caused by calls
    made directly on `torch_object` are that caller's to take
    (`torch_object.take_evicted_swa()`).
    """

    CSA, HCA = 0, 1

    def __init__(self, num_swa_base: int, n_csa_slots: int, n_hca_slots: int, bs: int = 128):
        self.torch_object = _torch_object(
            "UnifiedKvCoordinator",
            lambda: torch.classes.ukv.Coordinator(num_swa_base, [_ratio_of(CSA_K, bs), _ratio_of(HCA_K, bs)],
                                                  [n_csa_slots, n_hca_slots], bs),
            num_swa_base=num_swa_base, n_csa_slots=n_csa_slots, n_hca_slots=n_hca_slots, bs=bs)
        self.num_swa_base = num_swa_base
        self.bs = bs
        self.enabled = num_swa_base > 0
        self.csa = _PoolView(self.torch_object, self.CSA, CSA_K, n_csa_slots, bs)
        self.hca = _PoolView(self.torch_object, self.HCA, HCA_K, n_hca_slots, bs)
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
        self.torch_object.free_swa(s)

    def is_free_swa(self, s: int) -> bool:
        return self.torch_object.is_free_swa(s)

    def claim_swa(self, s: int) -> None:
        self.torch_object.claim_swa(s)

    def has_free_swa(self, n: int = 1) -> bool:
        return self.torch_object.has_free_swa(n)

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
        return self._alloc_compress(self.CSA, self.csa.bps)

    def alloc_hca(self) -> int:
        return self._alloc_compress(self.HCA, self.hca.bps)

    def free_csa(self, p: int) -> None:
        self.torch_object.free_compress(self.CSA, p)

    def free_hca(self, p: int) -> None:
        self.torch_object.free_compress(self.HCA, p)

    def has_free_csa(self, n: int = 1) -> bool:
        return self.torch_object.has_free_compress(self.CSA, n)

    def has_free_hca(self, n: int = 1) -> bool:
        return self.torch_object.has_free_compress(self.HCA, n)

    def can_allocate_jointly(self, n_swa: int, n_csa: int, n_hca: int) -> bool:
        """Whether n_swa SWA blocks and n_csa / n_hca compress blocks can all be
        allocated, in any order, without one slot being counted for two roles."""
        return self.torch_object.can_allocate_jointly(n_swa, [n_csa, n_hca])
