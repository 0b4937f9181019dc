"""Thread safety: several Python threads hammering one allocator object.

The torch classes serialise every call with a mutex; these tests check that
nothing is lost or handed out twice under contention (every id has at most
one holder at a time, the invariants hold, and every block is conserved), and
that the drop-in delivers each eviction before any thread can use the slot.
"""
import random
import sys
import threading
import time

import pytest
import torch

from ukv_torch import UnifiedKvCoordinator


@pytest.fixture
def eager_thread_switching():
    """Switch threads as often as the interpreter can, to expose races."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


class Holders:
    """Which thread holds each id; a second holder at the same time is a bug."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holder = {}

    def take(self, key, thread):
        with self._lock:
            assert key not in self._holder, f"{key} handed to thread {thread} while thread {self._holder[key]} holds it"
            self._holder[key] = thread

    def give_back(self, key):
        with self._lock:
            del self._holder[key]


def hammer(threads, operations, work):
    errors = []

    def run(index):
        try:
            work(index, random.Random(index), operations)
        except BaseException as exc:  # reported after join
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def exhausted(exc):
    return str(exc).startswith("No free")


def test_threads_hammering_one_coordinator_conserve_every_slot_and_block(eager_thread_switching):
    ratios, slots, base = [4, 128], [10, 6], 6
    c = torch.classes.ukv.Coordinator(base, ratios, slots, 128)
    holders = Holders()
    held = {}  # thread -> the ("swa" | type, id) keys it holds

    def work(thread, rng, operations):
        mine = held.setdefault(thread, [])
        for _ in range(operations):
            r, t = rng.random(), rng.randrange(2)
            if r >= 0.65:
                if mine:
                    role, ident = key = mine.pop(rng.randrange(len(mine)))
                    holders.give_back(key)  # before the free: then another thread may receive it
                    c.free_swa(ident) if role == "swa" else c.free_compress(role, ident)
                continue
            try:
                if r < 0.2:
                    new = [("swa", c.alloc_swa())]
                elif r < 0.3:
                    new = [("swa", s) for s in c.alloc_swa_n(2).tolist()]
                elif r < 0.55:
                    new = [(t, c.alloc_compress(t))]
                else:
                    new = [(t, p) for p in c.alloc_compress_n(t, rng.choice([2, 5, 40])).tolist()]
            except RuntimeError as exc:
                assert exhausted(exc), exc
                continue
            for key in new:
                holders.take(key, thread)
            mine.extend(new)
            c.take_evicted_swa()

    hammer(4, 3000, work)
    c.check_invariants()
    everything = [key for mine in held.values() for key in mine]
    counters = dict(c.counters())
    assert counters["swa_evictions"] > 0 and counters["type0_borrows"] > 0  # the threads really contended
    assert sum(role == "swa" for role, _ in everything) == (
        counters["swa_allocs"] + counters["swa_claims"] - counters["swa_frees"])
    for t in range(2):
        assert sum(role == t for role, _ in everything) == (
            counters[f"type{t}_compress_allocs"] - counters[f"type{t}_compress_frees"])
    # Give everything back: every slot must come home.
    for role, ident in everything:
        c.free_swa(ident) if role == "swa" else c.free_compress(role, ident)
    c.check_invariants()
    assert c.free_swa_slots() == base
    for t, (ratio, n) in enumerate(zip(ratios, slots)):
        owners = [c.owner(t, slot) for slot in range(n)]
        assert set(owners) <= {"free", "reserved"} and all(o == "free" for o in owners[base:])
        assert c.free_compress_blocks(t) == owners.count("free") * ratio  # blocks per slot: 128 // k


def test_threads_hammering_one_type_pool_conserve_every_slot_and_block(eager_thread_switching):
    pool = torch.classes.ukv.TypePool(8, 4, 128, 3)
    holders = Holders()
    held = {}

    def work(thread, rng, operations):
        mine = held.setdefault(thread, [])
        for _ in range(operations):
            r = rng.random()
            if r >= 0.6:
                if mine:
                    role, ident = key = mine.pop(rng.randrange(len(mine)))
                    holders.give_back(key)
                    pool.free_swa(ident) if role == "swa" else pool.free_compress(ident)
                continue
            try:
                if r < 0.15:
                    new = [("swa", pool.alloc_swa())]
                elif r < 0.45:
                    new = [("compress", pool.alloc_compress())]
                else:
                    new = [("compress", p) for p in pool.alloc_compress_n(rng.choice([2, 3, 9])).tolist()]
            except RuntimeError as exc:
                assert exhausted(exc), exc
                continue
            for key in new:
                holders.take(key, thread)
            mine.extend(new)

    hammer(4, 3000, work)
    pool.check_invariants()
    everything = [key for mine in held.values() for key in mine]
    counters = dict(pool.counters())
    assert sum(role == "swa" for role, _ in everything) == counters["swa_allocs"] - counters["swa_frees"]
    assert sum(role == "compress" for role, _ in everything) == (
        counters["compress_allocs"] - counters["compress_frees"])
    for role, ident in everything:
        pool.free_swa(ident) if role == "swa" else pool.free_compress(ident)
    pool.check_invariants()
    assert pool.free_slots() == 8 and pool.free_compress_blocks() == 32


def test_drop_in_delivers_each_eviction_before_any_thread_gets_the_slot(eager_thread_switching):
    # Every SWA slot is released with a cached block and CSA has no own region,
    # so each slot's first CSA block evicts it. Whichever thread receives any
    # block of a slot, the callback for that slot must have finished by then.
    slots, threads = 512, 4
    coord = UnifiedKvCoordinator(slots, slots, slots)
    for slot in [coord.alloc_swa() for _ in range(slots)]:
        coord.free_swa(slot)
    evicted = set()

    def evict(slot):
        time.sleep(0)  # a real callback does work and may let other threads run
        evicted.add(slot)

    coord.set_swa_evict_cb(evict)
    received_before_eviction = []

    def work(thread, rng, operations):
        for _ in range(operations):
            slot = coord.alloc_csa() // coord.csa.bps
            if slot not in evicted:
                received_before_eviction.append(slot)

    hammer(threads, slots * coord.csa.bps // threads, work)
    assert received_before_eviction == []
    assert evicted == set(range(slots))
    coord.torch_object.check_invariants()
