"""ukv_torch.BatchCalls must behave exactly like the torchbind batch methods it
replaces on hot paths: same ids, same state, same errors (and no change on an
error), the same eviction queue, safe next to other threads."""
import pickle
import random
import threading

import pytest
import torch

import ukv_torch
from ukv_torch import BatchCalls, OutOfSlots, UnifiedTypePool

NUM_SWA, NUM_BLOCKS, RATIOS = 64, 2048, [4, 128]


def coordinator():
    return torch.classes.ukv.Coordinator(NUM_SWA, RATIOS, ukv_torch.slot_counts(NUM_SWA, NUM_BLOCKS, RATIOS, 128), 128)


def pool():
    return torch.classes.ukv.TypePool(96, 4, 128, 0)


def outcome(fn):
    """(result, None) or (None, (exception type, message))."""
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 (the comparison is the test)
        return None, (type(exc), str(exc))


def random_batch_ops(rng, held, is_pool):
    """One random valid-or-invalid batch call, as (method name, args)."""
    role = rng.choice(["swa", "compress"])
    t = () if is_pool or role == "swa" else (rng.choice([0, 1, 0, 1, 7]),)  # 7: a bad type
    key = (role,) + t
    if rng.random() < 0.5 or not held.get(key):
        return f"alloc_{role}_n", t + (rng.choice([0, 1, 3, 16, 50, 10_000]),), key
    ids = list(held[key])
    rng.shuffle(ids)
    chosen = ids[: rng.randrange(1, len(ids) + 1)]
    if rng.random() < 0.15:
        chosen = chosen + chosen[:1]  # a double free inside one batch
    if rng.random() < 0.1:
        chosen = chosen + [10 ** 7]  # out of range
    return f"free_{role}_many", t + (torch.tensor(chosen, dtype=torch.int64),), key


@pytest.mark.parametrize("make", [coordinator, pool], ids=["coordinator", "pool"])
def test_same_calls_give_the_same_ids_state_and_errors_as_torchbind(make):
    ours, theirs = make(), make()
    fast = BatchCalls(ours)
    is_pool = make is pool
    rng = random.Random(5)
    held = {}
    errors = 0
    for _ in range(3000):
        name, args, key = random_batch_ops(rng, held, is_pool)
        before = ours.__getstate__()
        got, got_err = outcome(lambda: getattr(fast, name)(*args))
        want, want_err = outcome(lambda: getattr(theirs, name)(*args))
        assert got_err == want_err, name
        if got_err:
            errors += 1
            assert ours.__getstate__() == before, f"a failed {name} changed the state"
        elif name.startswith("alloc"):
            assert torch.equal(got, want)
            held.setdefault(key, set()).update(got.tolist())
        else:
            held[key] -= set(args[-1].tolist())
        assert ours.__getstate__() == theirs.__getstate__()
        if not is_pool:
            assert ours.take_evicted_swa() == theirs.take_evicted_swa()
    ours.check_invariants()
    assert errors > 100  # the invalid calls really happened


def test_borrowing_through_batch_calls_queues_the_evictions():
    c = coordinator()
    fast = BatchCalls(c)
    own = c.type_slots()[0] - NUM_SWA  # CSA's own region, in slots
    fast.alloc_compress_n(0, own * 4)  # 4 CSA blocks per slot: the own region is full
    swa = fast.alloc_swa_n(3)
    fast.free_swa_many(swa)
    borrowed = fast.alloc_compress_n(0, 4)  # one more slot: borrowed from SWA
    assert c.counters()["type0_borrows"] == 1
    assert len(c.take_evicted_swa()) == 1
    assert len(set(borrowed.tolist())) == 4


def test_bad_arguments_are_named():
    fast = BatchCalls(coordinator())
    with pytest.raises(ValueError, match="int64"):
        fast.free_swa_many(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D"):
        fast.free_swa_many(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="ids must be a 1-D int64 CPU tensor"):
        fast.free_swa_many([1, 2])
    with pytest.raises(TypeError):
        fast.alloc_swa_n("3")
    with pytest.raises(TypeError, match="TypePool or Coordinator"):
        BatchCalls(torch.classes.ukv.KvManager(ukv_torch.ServeConfig().encode(),
                                               ukv_torch.PoolSizes(num_logical_blocks=4, num_swa_blocks=4).encode()))
    with pytest.raises(TypeError, match="TypePool or Coordinator"):
        BatchCalls(3)


def test_drop_in_pool_batches_raise_out_of_slots_and_change_nothing():
    p = UnifiedTypePool(4, 32)
    ids = p.alloc_compress_n(10)
    before = p.torch_object.__getstate__()
    with pytest.raises(OutOfSlots, match="No free KV slots"):
        p.alloc_compress_n(7)  # 6 left
    assert p.torch_object.__getstate__() == before
    p.free_compress_many(ids)
    assert p.torch_object.free_slots() == 4


def test_pickled_batch_calls_drive_the_unpickled_object():
    c = coordinator()
    fast = BatchCalls(c)
    fast.alloc_swa_n(5)
    copy = pickle.loads(pickle.dumps(fast))
    assert copy.torch_object.__getstate__() == c.__getstate__()
    assert torch.equal(copy.alloc_swa_n(2), fast.alloc_swa_n(2))


def test_threads_mixing_batch_calls_and_torchbind_conserve_every_slot():
    c = coordinator()
    fast = BatchCalls(c)
    failures = []

    def worker(seed, use_fast):
        api = fast if use_fast else c
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(400):
                if rng.random() < 0.55 and c.has_free_swa(4):
                    try:
                        mine += api.alloc_swa_n(rng.randrange(1, 4)).tolist()
                    except RuntimeError:
                        pass  # another thread took the last slots between the check and the call
                elif mine:
                    k = rng.randrange(1, len(mine) + 1)
                    api.free_swa_many(torch.tensor(mine[:k]))
                    mine = mine[k:]
            if mine:
                api.free_swa_many(torch.tensor(mine))
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(s, s % 2 == 0)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    c.check_invariants()
    assert c.free_swa_slots() == NUM_SWA


@pytest.mark.parametrize("make", [coordinator, pool], ids=["coordinator", "pool"])
def test_into_fills_the_callers_tensor_with_the_ids_alloc_n_gives(make):
    ours, theirs = make(), make()
    fast, reference = BatchCalls(ours), BatchCalls(theirs)
    t = () if make is pool else (1,)
    for n in (0, 1, 5, 17):
        out = torch.full((n,), -9, dtype=torch.int64)
        fast.alloc_compress_into(*t, out)
        assert torch.equal(out, reference.alloc_compress_n(*t, n))
        swa = torch.full((n,), -9, dtype=torch.int64)
        fast.alloc_swa_into(swa)
        assert torch.equal(swa, reference.alloc_swa_n(n))
    assert ours.__getstate__() == theirs.__getstate__()


@pytest.mark.parametrize("bad", [torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int64),
                                 torch.zeros(8, dtype=torch.int64)[::2], [0, 0]],
                         ids=["int32", "2-D", "strided", "list"])
def test_into_refuses_a_bad_out_and_changes_nothing(bad):
    c = coordinator()
    fast = BatchCalls(c)
    before = c.__getstate__()
    with pytest.raises((ValueError, TypeError), match="out must be a"):
        fast.alloc_compress_into(0, bad)
    assert c.__getstate__() == before


def test_into_on_exhaustion_leaves_out_and_state_unchanged():
    p = pool()
    fast = BatchCalls(p)
    out = torch.full((96 * 4 + 1,), -9, dtype=torch.int64)  # one more block than the pool holds
    before = p.__getstate__()
    with pytest.raises(RuntimeError, match="No free KV slots"):
        fast.alloc_compress_into(out)
    assert p.__getstate__() == before
    assert bool((out == -9).all())
