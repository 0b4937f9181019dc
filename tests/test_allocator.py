"""Scenario tests of the allocator through torch.classes.ukv and the drop-ins."""
import sys
import threading
import time

import pytest
import torch

from ukv_torch import UnifiedKvCoordinator, UnifiedTypePool


@pytest.fixture
def eager_thread_switching():
    """Switch threads as often as the interpreter can, to expose races."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


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

    def allocate():
        for _ in range(slots * coord.csa.bps // threads):
            slot = coord.alloc_csa() // coord.csa.bps
            if slot not in evicted:
                received_before_eviction.append(slot)

    workers = [threading.Thread(target=allocate) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert received_before_eviction == []
    assert evicted == set(range(slots))
    coord.torch_object.check_invariants()


@pytest.mark.parametrize("make, free_many", [
    (lambda: torch.classes.ukv.TypePool(4, 32, 128, 0), lambda pool, ids: pool.free_compress_many(ids)),
    (lambda: torch.classes.ukv.TypePool(4, 32, 128, 0), lambda pool, ids: pool.free_swa_many(ids)),
    (lambda: torch.classes.ukv.Coordinator(2, [32], [3], 128), lambda coord, ids: coord.free_compress_many(0, ids)),
    (lambda: torch.classes.ukv.Coordinator(2, [32], [3], 128), lambda coord, ids: coord.free_swa_many(ids)),
])
def test_a_missing_batch_tensor_is_a_clear_value_error(make, free_many):
    obj = make()
    before = obj.__getstate__()
    with pytest.raises(ValueError, match=r"must be a 1-D int64 CPU tensor, got None"):
        free_many(obj, None)
    assert obj.__getstate__() == before


@pytest.mark.parametrize("make, named, reason", [
    (lambda: UnifiedTypePool(-1, 32), "num_slots=-1", "num_slots must be >= 0"),
    (lambda: UnifiedTypePool(4, 33), "k=33", "k (rows per compress block) must divide block_size"),
    (lambda: UnifiedTypePool(4, 32, 0), "bs=0", "block_size must be > 0"),
    (lambda: UnifiedKvCoordinator(-1, 4, 4), "num_swa_base=-1", "num_swa_base must be >= 0"),
    (lambda: UnifiedKvCoordinator(4, 3, 5), "n_csa_slots=3", "compress type 0: num_slots (3) must be >= num_swa_base"),
    (lambda: UnifiedKvCoordinator(4, 6, 3), "n_hca_slots=3", "compress type 1: num_slots (3) must be >= num_swa_base"),
    (lambda: UnifiedKvCoordinator(4, 6, 5, 0), "bs=0", "block_size must be > 0"),
])
def test_drop_in_constructor_errors_name_the_drop_in_arguments(make, named, reason):
    with pytest.raises(ValueError) as info:
        make()
    assert named in str(info.value) and reason in str(info.value)
