"""Scenario tests of the allocator semantics (upstream's unified_chunk_pool and
ukv's fixes to it), each through the torch class and through the seed-compatible
drop-in. Expected ids are derived by hand from the rules; the model-based
randomized test (test_allocator_model.py) covers the space between them."""
import copy
import itertools
import math
import pickle

import pytest
import torch

from ukv_torch import OutOfSlots, UnifiedKvCoordinator, UnifiedTypePool, slot_counts, unified_slot_counts

CSA, HCA = 0, 1
CSA_K, HCA_K = 32, 1
CSA_RATIO, HCA_RATIO = 4, 128  # the torch classes name compress types by ratio (k = block_size // ratio)

# --------------------------------------------------------------------------
# One scenario, two front ends


def torch_pool(num_slots, k, bs=128):
    """The torch class built like the drop-in, from k rows per block (0: SWA-only)."""
    return torch.classes.ukv.TypePool(num_slots, bs // k if k else 0, bs, 0)


def state_of(obj):
    """The exact state snapshot of a torch object or of a drop-in's."""
    return getattr(obj, "torch_object", obj).__getstate__()


@pytest.fixture(params=[torch_pool, UnifiedTypePool], ids=["torch_class", "drop_in"])
def make_pool(request):
    """TypePool and UnifiedTypePool share the upstream pool method names."""
    return request.param


class SwaCalls:
    """The SWA methods, which the torch class and the drop-in name alike (on self.obj)."""

    def alloc_swa(self):
        return self.obj.alloc_swa()

    def free_swa(self, slot):
        self.obj.free_swa(slot)

    def claim_swa(self, slot):
        self.obj.claim_swa(slot)

    def is_free_swa(self, slot):
        return self.obj.is_free_swa(slot)

    def has_free_swa(self, n=1):
        return self.obj.has_free_swa(n)


class ViaTorchClass(SwaCalls):
    """Coordinator scenarios through torch.classes.ukv.Coordinator with the
    default CSA/HCA pair; evictions are taken after each allocation."""

    def __init__(self, num_swa_base, n_csa_slots, n_hca_slots, bs=128):
        ratios = [bs // CSA_K, bs // HCA_K]
        self.obj = torch.classes.ukv.Coordinator(num_swa_base, ratios, [n_csa_slots, n_hca_slots], bs)
        self.evicted = []

    def alloc(self, t):
        phys = self.obj.alloc_compress(t)
        self.evicted += self.obj.take_evicted_swa()
        return phys

    def free(self, t, phys):
        self.obj.free_compress(t, phys)

    def has_free(self, t, n=1):
        return self.obj.has_free_compress(t, n)

    def joint(self, n_swa, n_csa, n_hca):
        return self.obj.can_allocate_jointly(n_swa, [n_csa, n_hca])

    def state(self):
        return self.obj.__getstate__()


class ViaDropIn(SwaCalls):
    """The same scenarios through UnifiedKvCoordinator, evictions through its callback."""

    def __init__(self, num_swa_base, n_csa_slots, n_hca_slots, bs=128):
        self.obj = UnifiedKvCoordinator(num_swa_base, n_csa_slots, n_hca_slots, bs)
        self.evicted = []
        self.obj.set_swa_evict_cb(self.evicted.append)

    def alloc(self, t):
        return (self.obj.alloc_csa, self.obj.alloc_hca)[t]()

    def free(self, t, phys):
        (self.obj.free_csa, self.obj.free_hca)[t](phys)

    def has_free(self, t, n=1):
        return (self.obj.has_free_csa, self.obj.has_free_hca)[t](n)

    def joint(self, n_swa, n_csa, n_hca):
        return self.obj.can_allocate_jointly(n_swa, n_csa, n_hca)

    def state(self):
        return self.obj.torch_object.__getstate__()


@pytest.fixture(params=[ViaTorchClass, ViaDropIn], ids=["torch_class", "drop_in"])
def make_coordinator(request):
    return request.param


def assert_refused_without_change(obj_state, call, error, match):
    before = obj_state()
    with pytest.raises(error, match=match):
        call()
    assert obj_state() == before


# --------------------------------------------------------------------------
# Sizing (upstream's unified_slot_counts)


@pytest.mark.parametrize("bs", [128, 256])
def test_unified_slot_counts_is_the_upstream_formula(bs):
    for num_swa, nb in itertools.product([0, 1, 7, 4096], [0, 1, 3, 4, 5, 127, 128, 129, 65536]):
        expected = (num_swa + math.ceil(nb / (bs // CSA_K)), num_swa + math.ceil(nb / (bs // HCA_K)))
        assert unified_slot_counts(num_swa, nb, bs) == expected


@pytest.mark.parametrize("bs", [128, 256])
def test_slot_counts_covers_any_list_of_k(bs):
    ks = [32, 1, 8, 128, 4]
    for num_swa, nb in itertools.product([0, 3, 4096], [0, 1, 31, 32, 33, 65536]):
        assert slot_counts(num_swa, nb, [bs // k for k in ks], bs) == [num_swa + math.ceil(nb / (bs // k)) for k in ks]


def test_unified_capacity_covers_the_static_split():
    # "Correctness first": flag-on rows are at least flag-off rows, equal for CSA when NB % 4 == 0.
    for num_swa, nb in itertools.product([1, 16, 4096], [1, 3, 4, 100, 128, 65536]):
        n_csa, n_hca = unified_slot_counts(num_swa, nb)
        swa_rows = 128 * num_swa
        assert 128 * n_csa >= swa_rows + 32 * nb and (128 * n_csa == swa_rows + 32 * nb) == (nb % 4 == 0)
        assert 128 * n_hca >= swa_rows + nb


@pytest.mark.parametrize("args, argument", [
    ((4, 64, [48], 128), "compress_ratio"), ((-1, 64, [4], 128), "num_swa_blocks"),
    ((4, -1, [4], 128), "num_compress_blocks"), ((4, 64, [4], 0), "block_size"),
])
def test_slot_counts_rejects_bad_arguments_by_name(args, argument):
    with pytest.raises(ValueError, match=argument):
        slot_counts(*args)


@pytest.mark.parametrize("args", [(2**63 - 1, 1, [4], 128), (2**63 - 1, 2**63 - 1, [128], 128),
                                  (1, 2**63 - 1, [1], 128)])
def test_slot_counts_past_int64_are_refused_not_wrapped(args):
    """Regression: num_swa_blocks + the own slots overflowed int64 and came back negative."""
    with pytest.raises(ValueError, match="int32 row limit"):
        slot_counts(*args)
    with pytest.raises(ValueError, match="int32 row limit"):
        torch.ops.ukv.layer_rows(args[2][0], args[0], args[1], 128, True)


# --------------------------------------------------------------------------
# One type's pool (UnifiedTypePool)


def test_compress_ids_pack_sub_blocks_and_address_the_slot_rows(make_pool):
    pool = make_pool(3, CSA_K)
    ids = [pool.alloc_compress() for _ in range(5)]
    assert ids == [0, 1, 2, 3, 4]  # slot 0 subs 0..3, then slot 1
    for phys in ids:
        slot, first_row = phys // 4, phys * CSA_K
        assert slot * 128 <= first_row and first_row + CSA_K <= (slot + 1) * 128
    hca = make_pool(2, HCA_K, 256)
    assert [hca.alloc_compress() for _ in range(257)] == list(range(257))  # 256 blocks per slot at bs 256


def test_the_last_freed_block_returns_its_slot_to_the_back_of_the_free_fifo(make_pool):
    pool = make_pool(3, CSA_K)
    for _ in range(5):
        pool.alloc_compress()  # slot 0 full, slot 1 open
    for phys in range(4):
        pool.free_compress(phys)
    assert pool.slot_is_free(0)
    # Slot 1 is filled first, then slot 2 (ahead of slot 0 in the free FIFO), then slot 0.
    assert [pool.alloc_compress() for _ in range(11)] == [5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3]


def test_a_freed_block_is_reused_after_the_slots_already_open(make_pool):
    pool = make_pool(4, HCA_K)
    for _ in range(129):
        pool.alloc_compress()  # slot 0 full, slot 1 open
    pool.free_compress(5)      # slot 0 reopens behind slot 1
    assert [pool.alloc_compress() for _ in range(128)] == list(range(129, 256)) + [5]


def test_an_open_slot_hands_out_its_smallest_free_sub_block(make_pool):
    pool = make_pool(1, CSA_K)
    for _ in range(4):
        pool.alloc_compress()
    pool.free_compress(2)
    pool.free_compress(0)
    assert [pool.alloc_compress(), pool.alloc_compress()] == [0, 2]


def test_swa_role_is_fifo_and_claim_takes_a_specific_free_slot(make_pool):
    pool = make_pool(3, 0)  # k = 0: SWA-only
    assert [pool.alloc_swa(), pool.alloc_swa()] == [0, 1]
    pool.free_swa(0)                                       # to the back
    assert [pool.alloc_swa(), pool.alloc_swa()] == [2, 0]
    other = make_pool(3, 0)
    other.claim_swa(2)
    assert not other.is_free_swa(2) and other.is_free_swa(0)
    assert [other.alloc_swa(), other.alloc_swa()] == [0, 1]
    with pytest.raises(RuntimeError, match="^No free KV slots available$"):
        other.alloc_swa()


def test_reserved_slots_are_skipped_and_released_ones_go_to_the_back(make_pool):
    pool = make_pool(3, CSA_K)
    assert pool.reserve_slot(1) is True
    assert pool.reserve_slot(1) is False
    assert not pool.slot_is_free(1)
    assert [pool.alloc_compress() for _ in range(5)] == [0, 1, 2, 3, 8]  # slot 1 skipped
    pool.release_slot(1)
    pool.release_slot(1)  # releasing a free slot does nothing (upstream behaviour)
    assert pool.slot_is_free(1)
    assert [pool.alloc_compress() for _ in range(4)] == [9, 10, 11, 4]


def test_free_counts_are_exact(make_pool):
    pool = make_pool(3, CSA_K)
    assert pool.has_free_compress(12) and not pool.has_free_compress(13)
    phys = pool.alloc_compress()
    assert pool.has_free_compress(11) and not pool.has_free_compress(12)  # 3 in the open slot + 2 free slots
    assert pool.has_free_swa(2) and not pool.has_free_swa(3)
    pool.free_compress(phys)
    assert pool.has_free_swa(3) and pool.has_free_compress(12)
    disabled = make_pool(0, CSA_K)  # a disabled pool never blocks admission...
    assert disabled.has_free_swa(100) and disabled.has_free_compress(100)
    with pytest.raises(RuntimeError, match="^No free KV slots available$"):
        disabled.alloc_swa()       # ...but has nothing to hand out
    swa_only = make_pool(2, 0)
    assert swa_only.has_free_compress(10**9)
    with pytest.raises(ValueError, match="no compress role"):
        swa_only.alloc_compress()


def test_pool_ownership_errors_leave_the_pool_unchanged(make_pool):
    pool = make_pool(2, CSA_K)
    pool.free_compress(pool.alloc_compress())
    refused = [
        (lambda: pool.free_compress(0), RuntimeError, "not held"),             # double free
        (lambda: pool.free_compress(6), RuntimeError, "not held"),             # never allocated
        (lambda: pool.free_compress(8), ValueError, "out of range"),
        (lambda: pool.free_compress(-1), ValueError, "out of range"),
        (lambda: pool.free_swa(5), ValueError, "out of range"),
    ]
    for call, error, match in refused:
        assert_refused_without_change(lambda: state_of(pool), call, error, match)
    assert pool.alloc_compress() == 4  # slot 1 (slot 0 went to the back of the FIFO), sub 0
    refused = [
        (lambda: pool.free_compress(5), RuntimeError, "double free"),          # a free sub of an open slot
        (lambda: pool.free_swa(1), RuntimeError, "not held by SWA"),
        (lambda: pool.claim_swa(1), RuntimeError, "not free"),
        (lambda: pool.release_slot(1), RuntimeError, "not reserved"),
    ]
    for call, error, match in refused:
        assert_refused_without_change(lambda: state_of(pool), call, error, match)


# --------------------------------------------------------------------------
# The coordinator (UnifiedKvCoordinator and the fixes)


def test_swa_and_compress_start_in_their_own_regions(make_coordinator):
    c = make_coordinator(4, *unified_slot_counts(4, 8))
    assert c.alloc_swa() == 0
    assert c.alloc(CSA) == 4 * 4      # slot 4: the first of CSA's own region
    assert c.alloc(HCA) == 4 * 128    # slot 4 of the HCA tensor
    assert c.evicted == []


def test_without_frees_the_physical_rows_are_the_static_split_rows(make_coordinator):
    # Logical block b lands on CSA row swa_pages + 32b and HCA row swa_pages + b, so a
    # test that never frees cannot tell physical from logical addressing.
    num_swa, nb = 4, 64
    c = make_coordinator(num_swa, *unified_slot_counts(num_swa, nb))
    swa_pages = num_swa * 128
    assert [c.alloc(CSA) * CSA_K for _ in range(nb)] == [swa_pages + 32 * b for b in range(nb)]
    assert [c.alloc(HCA) * HCA_K for _ in range(nb)] == [swa_pages + b for b in range(nb)]
    assert [c.alloc_swa() for _ in range(num_swa)] == list(range(num_swa))


def test_compress_borrows_only_when_its_own_region_is_full_and_takes_the_coldest_slot(make_coordinator):
    c = make_coordinator(2, 3, 3)  # CSA own region: slot 2 (4 blocks)
    s0, s1 = c.alloc_swa(), c.alloc_swa()
    c.free_swa(s1)
    c.free_swa(s0)                 # s1 has been free longest
    assert [c.alloc(CSA) for _ in range(4)] == [8, 9, 10, 11]
    assert c.is_free_swa(s0) and c.is_free_swa(s1) and c.evicted == []
    assert c.alloc(CSA) == s1 * 4  # own region full: borrow the coldest released slot
    assert c.evicted == [s1]
    assert not c.is_free_swa(s1) and c.is_free_swa(s0)
    assert c.has_free_swa(1) and not c.has_free_swa(2)
    assert c.alloc_swa() == s0
    with pytest.raises(RuntimeError, match="^No free SWA slots available$"):
        c.alloc_swa()


def test_a_borrowed_slot_returns_to_swa_only_when_every_pool_has_freed_it(make_coordinator):
    c = make_coordinator(1, 1, 1)  # one shared slot, no own regions
    c.free_swa(c.alloc_swa())
    csa = [c.alloc(CSA) for _ in range(4)]
    assert csa == [0, 1, 2, 3] and c.alloc(HCA) == 0
    assert c.evicted == [0]        # evicted once, though two pools borrowed it
    for phys in csa[:3]:
        c.free(CSA, phys)
    assert not c.is_free_swa(0)
    c.free(CSA, csa[3])
    assert not c.is_free_swa(0) and not c.has_free_swa(1)  # HCA still holds it
    c.free(HCA, 0)
    assert c.is_free_swa(0) and c.has_free_swa(1)
    assert c.evicted == [0]        # its cache entry went with the first borrow
    assert c.alloc_swa() == 0
    c.free_swa(0)
    c.alloc(HCA)
    assert c.evicted == [0, 0]     # a new SWA tenancy, a new eviction


def test_swa_reclaiming_its_own_released_slot_does_not_evict(make_coordinator):
    c = make_coordinator(2, 2, 2)  # no own regions
    c.free_swa(c.alloc_swa())
    c.claim_swa(0)                 # SWA prefix-cache hit on its freed slot
    assert not c.is_free_swa(0)
    c.free_swa(0)
    assert c.evicted == []
    assert c.alloc(CSA) == 0 and c.evicted == [0]
    assert [c.alloc(CSA) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="^No free KV slots available$"):
        c.alloc(CSA)               # slot 1 was never released: compress may not take it


def test_claiming_a_borrowed_or_held_slot_is_refused_without_change(make_coordinator):
    c = make_coordinator(2, 2, 2)
    c.free_swa(c.alloc_swa())
    c.alloc(CSA)                   # borrows slot 0
    assert_refused_without_change(c.state, lambda: c.claim_swa(0), RuntimeError, "borrowed by compress")
    c.claim_swa(1)                 # never released: still SWA's to claim
    assert_refused_without_change(c.state, lambda: c.claim_swa(1), RuntimeError, "held by SWA")
    assert_refused_without_change(c.state, lambda: c.claim_swa(2), ValueError, "out of range")


def test_has_free_swa_stays_exact_through_borrow_and_return(make_coordinator):
    c = make_coordinator(3, 3, 3)  # no own regions
    slots = [c.alloc_swa() for _ in range(3)]
    assert not c.has_free_swa(1)
    for slot in slots:
        c.free_swa(slot)
    assert c.has_free_swa(3)
    csa, hca = c.alloc(CSA), c.alloc(HCA)  # both borrow the coldest slot, 0
    assert (csa // 4, hca // 128) == (0, 0)
    assert c.has_free_swa(2) and not c.has_free_swa(3)
    c.free(CSA, csa)
    assert not c.has_free_swa(3)
    c.free(HCA, hca)
    assert c.has_free_swa(3)


def test_joint_admission_refuses_the_double_count_upstream_crashed_on(make_coordinator):
    # SWA's only free slot is also the only slot CSA could borrow.
    c = make_coordinator(1, 2, 2)
    c.free_swa(c.alloc_swa())
    for _ in range(4):
        c.alloc(CSA)               # CSA's own region is full
    assert c.has_free_swa(1) and c.has_free(CSA, 1)  # upstream's two checks both say yes
    assert not c.joint(1, 1, 0)
    assert c.joint(1, 0, 0) and c.joint(0, 1, 0) and c.joint(1, 0, 128)  # HCA stays in its own region
    c.alloc(CSA)                   # and indeed: once CSA borrows the slot...
    with pytest.raises(RuntimeError, match="^No free SWA slots available$"):
        c.alloc_swa()              # ...the SWA allocation upstream admitted fails


def test_joint_admission_is_a_promise_in_every_order():
    c = torch.classes.ukv.Coordinator(3, [CSA_RATIO, HCA_RATIO], [4, 4], 128)  # own regions: 1 slot each
    for slot in [c.alloc_swa() for _ in range(3)][:2]:
        c.free_swa(slot)           # two released slots, one held
    admitted = 0
    for n_swa, n_csa, n_hca in itertools.product(range(3), range(7), [0, 1, 128, 129, 256]):
        if not c.can_allocate_jointly(n_swa, [n_csa, n_hca]):
            continue
        admitted += 1
        calls = ["swa"] * n_swa + [CSA] * min(n_csa, 6) + [HCA] * min(n_hca, 2)
        big_hca = max(n_hca - 2, 0)  # HCA's bulk is made in one batch, at each position in turn
        for order in set(itertools.permutations(calls)):
            for bulk_at in range(len(order) + 1):
                trial = copy.deepcopy(c)
                for i, role in enumerate(order + ("bulk",)):
                    if i == bulk_at:
                        trial.alloc_compress_n(HCA, big_hca)
                    if role == "swa":
                        trial.alloc_swa()
                    elif role != "bulk":
                        trial.alloc_compress(role)
    assert admitted > 10


def test_a_disabled_coordinator_ignores_demand_but_hands_out_nothing():
    c = UnifiedKvCoordinator(0, 0, 0)
    assert not c.enabled
    assert c.has_free_swa(10) and c.has_free_csa(10) and c.has_free_hca(10)
    assert c.can_allocate_jointly(5, 5, 5)  # as has_free_*: a disabled role is not managed here
    with pytest.raises(OutOfSlots, match="^No free SWA slots available$"):
        c.alloc_swa()
    with pytest.raises(OutOfSlots, match="^No free KV slots available$"):
        c.alloc_csa()


def test_coordinator_ownership_errors_leave_the_state_unchanged(make_coordinator):
    c = make_coordinator(2, 3, 3)
    s = c.alloc_swa()
    p = c.alloc(CSA)
    refused = [
        (lambda: c.free_swa(1), RuntimeError, "not held by SWA"),   # never allocated
        (lambda: c.free_swa(2), ValueError, "out of range"),
        (lambda: c.claim_swa(s), RuntimeError, "held by SWA"),
        (lambda: c.free(CSA, p + 1), RuntimeError, "not held"),
        (lambda: c.free(HCA, p), RuntimeError, "not held"),
        (lambda: c.free(HCA, 3 * 128), ValueError, "out of range"),
        (lambda: c.joint(-1, 0, 0), ValueError, "n_swa"),
        (lambda: c.joint(0, 10**6, -1), ValueError, r"compress_demand\[1\]"),
    ]
    for call, error, match in refused:
        assert_refused_without_change(c.state, call, error, match)
    c.free_swa(s)
    assert_refused_without_change(c.state, lambda: c.free_swa(s), RuntimeError, "double free")


def test_torch_coordinator_rejects_bad_types_and_batches_without_change():
    c = torch.classes.ukv.Coordinator(2, [CSA_RATIO, HCA_RATIO], [3, 3], 128)
    s, p = c.alloc_swa(), c.alloc_compress(CSA)
    refused = [
        (lambda: c.alloc_compress(2), ValueError, r"compress type 2 out of range \[0, 2\)"),
        (lambda: c.owner(-1, 0), ValueError, "compress type -1"),
        (lambda: c.can_allocate_jointly(0, [1]), ValueError, "one per compress type"),
        (lambda: c.free_swa_many(torch.tensor([s, s])), RuntimeError, "appears twice"),
        (lambda: c.free_swa_many(torch.tensor([s, 1])), RuntimeError, "not held by SWA"),
        (lambda: c.free_compress_many(CSA, torch.tensor([p, p + 1])), RuntimeError, "not held"),
        (lambda: c.free_compress_many(CSA, torch.tensor([p, 10**6])), ValueError, "out of range"),
    ]
    for call, error, match in refused:
        assert_refused_without_change(c.__getstate__, call, error, match)


# --------------------------------------------------------------------------
# Eviction: a borrowed slot's cached SWA block is dropped before compress writes there


def test_the_drop_in_evicts_once_before_the_allocating_call_returns():
    c = UnifiedKvCoordinator(1, 1, 1)  # one shared slot, no own regions: each tenancy is borrowed
    seen = []

    def evict(slot):
        # Compress already owns the slot: SWA can no longer take it or count it.
        assert not c.is_free_swa(slot) and not c.has_free_swa(1)
        seen.append(slot)

    c.set_swa_evict_cb(evict)
    for cycle in range(20):
        slot = c.alloc_swa()
        c.free_swa(slot)
        blocks = [c.alloc_csa()]
        assert seen[cycle:] == [slot]  # this call delivered this slot's eviction
        blocks += [c.alloc_csa() for _ in range(3)] + [c.alloc_hca()]
        assert len(seen) == cycle + 1       # more blocks of the same tenancy: no new eviction
        for phys in blocks[:4]:
            c.free_csa(phys)
        c.free_hca(blocks[4])


def test_without_a_callback_the_drop_in_still_drains_the_eviction_queue():
    c = UnifiedKvCoordinator(1, 1, 1)
    c.set_swa_evict_cb(lambda slot: None)
    c.set_swa_evict_cb(None)
    c.free_swa(c.alloc_swa())
    c.alloc_csa()
    assert c.torch_object.take_evicted_swa() == []
    assert c.torch_object.counters()["swa_evictions"] == 1


def test_the_torch_class_queues_evictions_in_order():
    c = torch.classes.ukv.Coordinator(3, [1], [3], 128)  # one block per slot, no own region
    assert c.alloc_swa_n(3).tolist() == [0, 1, 2]
    for slot in (2, 0, 1):
        c.free_swa(slot)
    assert c.alloc_compress_n(0, 3).tolist() == [2, 0, 1]  # coldest first
    assert c.take_evicted_swa() == [2, 0, 1]
    assert c.take_evicted_swa() == []


def test_the_torch_class_lends_never_used_swa_slots_only_when_asked():
    upstream = torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128)
    lending = torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128, True)
    assert not upstream.borrow_unreleased_swa() and lending.borrow_unreleased_swa()
    for c in (upstream, lending):
        c.alloc_compress_n(CSA, 4)  # the own region
    with pytest.raises(RuntimeError, match="No free KV slots available"):
        upstream.alloc_compress(CSA)
    assert lending.free_compress_blocks(CSA) == 2 * 4
    assert lending.alloc_compress(CSA) == 1 * 4  # slot 1: the never-used slot SWA would take last
    assert lending.counters()["unreleased_borrows"] == 1 and lending.take_evicted_swa() == []
    assert lending.alloc_swa() == 0
    clone = pickle.loads(pickle.dumps(lending))
    assert clone.borrow_unreleased_swa() and clone.__getstate__() == lending.__getstate__()


def test_counters_count_allocations_borrows_and_evictions():
    c = torch.classes.ukv.Coordinator(2, [CSA_RATIO, HCA_RATIO], [3, 3], 128)
    s0, s1 = c.alloc_swa(), c.alloc_swa()
    c.free_swa(s1)
    c.claim_swa(s1)
    c.free_swa(s1)
    ids = c.alloc_compress_n(CSA, 5)   # 4 in the own region, then a borrow of s1
    c.free_compress(CSA, int(ids[0]))
    assert dict(c.counters()) == {
        "swa_allocs": 2, "swa_frees": 2, "swa_claims": 1, "swa_evictions": 1, "unreleased_borrows": 0,
        "type0_compress_allocs": 5, "type0_compress_frees": 1, "type0_borrows": 1,
        "type1_compress_allocs": 0, "type1_compress_frees": 0, "type1_borrows": 0,
    }
    pool = torch.classes.ukv.TypePool(2, CSA_RATIO, 128, 1)
    pool.alloc_swa()
    pool.free_compress(pool.alloc_compress())
    assert dict(pool.counters()) == {"swa_allocs": 1, "swa_frees": 0, "compress_allocs": 1,
                                     "compress_frees": 1, "borrows": 0}


def test_owner_and_pool_views_report_each_role():
    c = UnifiedKvCoordinator(2, 3, 3)
    s = c.alloc_swa()
    c.free_swa(c.alloc_swa())          # slot 1 released
    p = c.alloc_csa()
    assert [c.csa.owner(slot) for slot in range(3)] == ["reserved", "free", "compress"]
    assert c.csa.owner(s) == c.hca.owner(s) == "reserved"   # SWA-held slots are reserved in every pool
    assert c.csa.slot_is_free(1) and not c.csa.slot_is_free(p // 4)
    pool = torch.classes.ukv.TypePool(3, 0, 128, 0)
    pool.reserve_slot(2)
    pool.alloc_swa()
    assert [pool.owner(slot) for slot in range(3)] == ["swa", "free", "reserved"]


# --------------------------------------------------------------------------
# Errors: exhaustion and bad constructor arguments


def test_out_of_slots_is_a_runtime_error_and_an_assertion_error_with_the_upstream_text():
    assert issubclass(OutOfSlots, RuntimeError) and issubclass(OutOfSlots, AssertionError)
    c = UnifiedKvCoordinator(1, 1, 1)
    c.alloc_swa()
    with pytest.raises(AssertionError) as info:   # code catching upstream's AssertionError keeps working
        c.alloc_swa()
    assert type(info.value) is OutOfSlots and str(info.value) == "No free SWA slots available"
    pool = UnifiedTypePool(1, CSA_K)
    for _ in range(4):
        pool.alloc_compress()
    with pytest.raises(OutOfSlots) as info:
        pool.alloc_compress()
    assert str(info.value) == "No free KV slots available"
    with pytest.raises(OutOfSlots, match=r"^No free KV slots available \(5 requested, 0 free\)$"):
        pool.alloc_compress_n(5)
    swa_pool = UnifiedTypePool(1, 0)
    swa_pool.alloc_swa()
    with pytest.raises(OutOfSlots, match="^No free KV slots available$"):
        swa_pool.alloc_swa()


def test_the_torch_classes_raise_exhaustion_as_runtime_error_with_the_same_text():
    c = torch.classes.ukv.Coordinator(1, [CSA_RATIO], [1], 128)
    c.alloc_swa()
    with pytest.raises(RuntimeError) as info:
        c.alloc_swa()
    assert not isinstance(info.value, OutOfSlots) and str(info.value) == "No free SWA slots available"
    with pytest.raises(RuntimeError, match=r"^No free SWA slots available \(1 requested, 0 free\)$"):
        c.alloc_swa_n(1)


def test_the_drop_in_turns_only_exhaustion_into_out_of_slots():
    c = UnifiedKvCoordinator(2, 3, 3)
    with pytest.raises(RuntimeError) as info:
        c.free_csa(9)
    assert not isinstance(info.value, OutOfSlots)


@pytest.mark.parametrize("make, argument", [
    (lambda: torch.classes.ukv.TypePool(-1, 4, 128, 0), "num_slots must be >= 0"),
    (lambda: torch.classes.ukv.TypePool(4, 33, 128, 0), "compress_ratio .* must divide block_size"),
    (lambda: torch.classes.ukv.TypePool(4, -1, 128, 0), "compress_ratio must be >= 0"),
    (lambda: torch.classes.ukv.TypePool(4, 256, 128, 0), "compress_ratio .* must divide block_size"),
    (lambda: torch.classes.ukv.TypePool(4, 4, 0, 0), "block_size must be > 0"),
    (lambda: torch.classes.ukv.TypePool(4, 4, 128, 5), "shared_slots must be in"),
    (lambda: torch.classes.ukv.TypePool(2**25, 4, 128, 0), "num_slots .* exceed the int32 row limit"),
    (lambda: torch.classes.ukv.Coordinator(-1, [4], [4], 128), "num_swa_base must be >= 0"),
    (lambda: torch.classes.ukv.Coordinator(4, [4], [3], 128), r"num_slots \(3\) must be >= num_swa_base"),
    (lambda: torch.classes.ukv.Coordinator(4, [4, 128], [6], 128),
     "compress_ratios and num_slots must have the same length"),
    (lambda: torch.classes.ukv.Coordinator(4, [0], [6], 128), "compress_ratios must be > 0"),
    (lambda: torch.classes.ukv.Coordinator(4, [48], [6], 128), "compress_ratio .* must divide block_size"),
    (lambda: torch.classes.ukv.Coordinator(4, [4], [6], 0), "block_size must be > 0"),
    (lambda: torch.classes.ukv.Coordinator(2**25, [], [], 128), "num_swa_base .* exceed the int32 row limit"),
])
def test_bad_constructor_arguments_are_value_errors_naming_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


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


def test_drop_in_attributes_are_the_upstream_ones():
    pool = UnifiedTypePool(5, CSA_K, 256)
    assert (pool.num_slots, pool.k, pool.bs, pool.bps, pool.enabled) == (5, 32, 256, 8, True)
    assert (UnifiedTypePool(5, 0).bps, UnifiedTypePool(0, 1).enabled) == (0, False)
    c = UnifiedKvCoordinator(4, 6, 5)
    assert (c.num_swa_base, c.bs, c.enabled, c.CSA, c.HCA) == (4, 128, True, 0, 1)
    assert (c.csa.k, c.csa.num_slots, c.csa.bps, c.csa.enabled) == (32, 6, 4, True)
    assert (c.hca.k, c.hca.num_slots, c.hca.bps) == (1, 5, 128)
    assert c.csa.has_free_compress(8) and not c.csa.has_free_compress(9)


# --------------------------------------------------------------------------
# Batch methods


def test_batch_allocation_gives_the_ids_single_calls_would():
    single, batch = torch_pool(4, CSA_K), torch_pool(4, CSA_K)
    for pool in (single, batch):  # a non-trivial start: slot 0 open with subs 0 and 2 free
        pool.alloc_compress()
        pool.alloc_compress()
        pool.free_compress(0)
    expected = [single.alloc_compress() for _ in range(7)]
    ids = batch.alloc_compress_n(7)
    assert ids.dtype == torch.int64 and ids.is_contiguous() and ids.tolist() == expected
    assert batch.__getstate__() == single.__getstate__()
    assert batch.alloc_swa_n(2).tolist() == [single.alloc_swa(), single.alloc_swa()]
    assert batch.alloc_compress_n(0).tolist() == []


@pytest.mark.parametrize("make, alloc_n, message", [
    (lambda: torch_pool(2, CSA_K), lambda p: p.alloc_compress_n(9), r"No free KV slots available \(9 requested, 8 free\)"),
    (lambda: torch_pool(2, CSA_K), lambda p: p.alloc_swa_n(3), r"No free KV slots available \(3 requested, 2 free\)"),
    (lambda: torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128), lambda c: c.alloc_swa_n(3),
     r"No free SWA slots available \(3 requested, 2 free\)"),
    (lambda: torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128), lambda c: c.alloc_compress_n(0, 5),
     r"No free KV slots available \(5 requested, 4 free\)"),
])
def test_batch_allocation_is_all_or_nothing(make, alloc_n, message):
    obj = make()
    assert_refused_without_change(obj.__getstate__, lambda: alloc_n(obj), RuntimeError, message)
    with pytest.raises(ValueError, match="n must be >= 0"):
        obj.alloc_swa_n(-1)


def test_batch_free_validates_the_whole_batch_before_freeing_anything():
    pool = torch_pool(2, CSA_K)
    ids = pool.alloc_compress_n(5)
    refused = [
        (torch.tensor([0, 1, 1]), RuntimeError, "id 1 appears twice"),
        (torch.tensor([0, 1, 6]), RuntimeError, "compress id 6 is not held"),
        (torch.tensor([0, 1, 8]), ValueError, "out of range"),
        (ids.to(torch.int32), ValueError, "ids must be int64"),
        (ids.view(1, 5), ValueError, "ids must be a 1-D tensor"),
        (torch.empty(2, dtype=torch.int64, device="meta"), ValueError, "ids must be a CPU tensor"),
    ]
    for batch, error, match in refused:
        assert_refused_without_change(pool.__getstate__, lambda: pool.free_compress_many(batch), error, match)
    spread = torch.stack([ids, torch.full_like(ids, -1)], dim=1).flatten()[::2]
    assert not spread.is_contiguous()
    pool.free_compress_many(spread)  # any strides
    assert pool.free_compress_blocks() == 8


def test_drop_in_pool_batch_methods():
    pool = UnifiedTypePool(2, CSA_K)
    ids = pool.alloc_compress_n(6)
    assert ids.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(OutOfSlots):
        pool.alloc_compress_n(3)
    pool.free_compress_many(ids[1:])
    assert pool.has_free_compress(7) and not pool.has_free_compress(8)


@pytest.mark.parametrize("make, free_many", [
    (lambda: torch_pool(4, 32), lambda pool, ids: pool.free_compress_many(ids)),
    (lambda: torch_pool(4, 32), lambda pool, ids: pool.free_swa_many(ids)),
    (lambda: torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128),
     lambda coord, ids: coord.free_compress_many(0, ids)),
    (lambda: torch.classes.ukv.Coordinator(2, [CSA_RATIO], [3], 128), lambda coord, ids: coord.free_swa_many(ids)),
])
def test_a_missing_batch_tensor_is_a_clear_value_error(make, free_many):
    obj = make()
    assert_refused_without_change(obj.__getstate__, lambda: free_many(obj, None), ValueError,
                                  r"must be a 1-D int64 CPU tensor, got None")
