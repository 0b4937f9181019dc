"""The drop-ins under upstream's names.

Every constructor keyword, attribute, method and parameter name of upstream's
`unified_chunk_pool` module (ROCm/ATOM 978243b05) is called here
the way upstream code calls it, by keyword. Results are compared with the
pure-Python model (ukv_torch/testing/allocator_model.py), called positionally,
or with values derived by hand. A bad argument (wrong type, id out of range)
must be refused with an error naming the parameter, leaving the state
unchanged.
"""
import pytest

from ukv_torch import OutOfSlots, UnifiedKvCoordinator, UnifiedTypePool, unified_slot_counts
from ukv_torch.testing.allocator_model import CoordinatorModel, PoolModel

CSA, HCA = 0, 1


def assert_refused_without_change(obj, call, error, match):
    before = obj.torch_object.__getstate__()
    with pytest.raises(error, match=match):
        call()
    assert obj.torch_object.__getstate__() == before


def replay(steps, call_drop_in, call_model, after=lambda: None):
    """Each (method, keyword arguments) step on the drop-in, by keyword, and on
    the model, positionally: the same result, then `after()`'s checks."""
    for name, kwargs in steps:
        got = call_drop_in(name, kwargs)
        expected = call_model(name, list(kwargs.values()))
        assert got == expected, f"{name}({kwargs}): drop-in {got!r}, model {expected!r}"
        after()


# --------------------------------------------------------------------------
# Constructors: block_size= (upstream's keyword), bs= (the older spelling)


def test_constructors_take_upstreams_block_size_keyword():
    assert unified_slot_counts(num_swa_blocks=2, num_compress_blocks=17, block_size=256) == (2 + 3, 2 + 1)
    pool = UnifiedTypePool(num_slots=5, k=32, block_size=256)
    assert (pool.num_slots, pool.k, pool.block_size, pool.blocks_per_slot, pool.enabled) == (5, 32, 256, 8, True)
    assert (pool.torch_object.block_size(), pool.torch_object.compress_ratio()) == (256, 8)
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=5, n_hca_slots=3, block_size=256)
    assert (coord.enabled, coord.num_swa_base, coord.block_size) == (True, 2, 256)
    assert (coord.torch_object.block_size(), coord.torch_object.compress_ratios()) == (256, [8, 256])
    for drop_in in (UnifiedTypePool(4, 0), UnifiedKvCoordinator(1, 1, 1)):
        assert drop_in.block_size == 128 and type(drop_in.block_size) is int  # upstream's default
    assert unified_slot_counts(2, 17) == (2 + 5, 2 + 1)
    assert not UnifiedKvCoordinator(num_swa_base=0, n_csa_slots=0, n_hca_slots=0, block_size=128).enabled


def test_bs_is_still_accepted_and_giving_both_is_a_type_error():
    assert UnifiedTypePool(4, 32, 256).block_size == 256  # positional, as before
    assert UnifiedTypePool(4, 32, bs=256).block_size == 256
    assert UnifiedKvCoordinator(2, 3, 3, bs=256).block_size == 256
    assert unified_slot_counts(2, 17, bs=256) == unified_slot_counts(2, 17, 256)
    both = [
        (lambda: UnifiedTypePool(4, 32, block_size=128, bs=128), "UnifiedTypePool"),
        (lambda: UnifiedTypePool(4, 32, 128, bs=128), "UnifiedTypePool"),
        (lambda: UnifiedKvCoordinator(2, 3, 3, block_size=256, bs=256), "UnifiedKvCoordinator"),
        (lambda: unified_slot_counts(2, 17, block_size=128, bs=128), "unified_slot_counts"),
    ]
    for make, name in both:
        with pytest.raises(TypeError, match=rf"^{name}\(\) got both block_size and bs"):
            make()


@pytest.mark.parametrize("make, error, match", [
    (lambda: UnifiedTypePool(4, 32, block_size="128"), TypeError, "UnifiedTypePool: block_size must be an int, got str"),
    (lambda: UnifiedTypePool(4, 32, bs=1.5), TypeError, "UnifiedTypePool: bs must be an int, got float"),
    (lambda: UnifiedTypePool(4, 32, block_size=0), ValueError, r"block_size must be > 0"),
    (lambda: UnifiedTypePool(4, 32, block_size=48), ValueError, r"k \(rows per compress block\) must divide block_size"),
    (lambda: UnifiedTypePool(num_slots=None, k=32), TypeError, "UnifiedTypePool: num_slots must be an int"),
    (lambda: UnifiedTypePool(num_slots=4, k="32"), TypeError, "UnifiedTypePool: k must be an int"),
    (lambda: UnifiedKvCoordinator(2, 3, 3, block_size=None), TypeError,
     "UnifiedKvCoordinator: block_size must be an int, got NoneType"),
    (lambda: UnifiedKvCoordinator(2, 3, 3, block_size=-128), ValueError, "block_size must be > 0"),
    (lambda: UnifiedKvCoordinator(num_swa_base=2.0, n_csa_slots=3, n_hca_slots=3), TypeError,
     "UnifiedKvCoordinator: num_swa_base must be an int"),
    (lambda: UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=[3], n_hca_slots=3), TypeError,
     "UnifiedKvCoordinator: n_csa_slots must be an int"),
    (lambda: UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=3, n_hca_slots="3"), TypeError,
     "UnifiedKvCoordinator: n_hca_slots must be an int"),
    (lambda: unified_slot_counts(2, 17, block_size="256"), TypeError,
     "unified_slot_counts: block_size must be an int, got str"),
    (lambda: unified_slot_counts(2, 17, block_size=0), ValueError, "block_size must be > 0"),
])
def test_bad_constructor_keywords_are_refused_naming_them(make, error, match):
    with pytest.raises(error, match=match):
        make()


# --------------------------------------------------------------------------
# UnifiedTypePool: every method by upstream's parameter name


POOL_MODEL_NAMES = {"num_free_slots": "free_slots"}


def test_pool_methods_by_upstream_keyword_match_the_model():
    pool, model = UnifiedTypePool(num_slots=3, k=32, block_size=128), PoolModel(3, 32, 128)
    steps = [
        ("num_free_slots", {}), ("has_free_swa", dict(n_blocks=3)), ("has_free_swa", dict(n_blocks=4)),
        ("has_free_compress", dict(n_blocks=12)), ("has_free_compress", dict(n_blocks=13)),
        ("alloc_swa", {}), ("is_free_swa", dict(phys=0)), ("free_swa", dict(phys=0)), ("is_free_swa", dict(phys=0)),
        ("claim_swa", dict(phys=2)), ("slot_is_free", dict(s=2)), ("has_free_swa", dict(n_blocks=2)),
        ("has_free_swa", dict(n_blocks=3)), ("reserve_slot", dict(s=1)), ("reserve_slot", dict(s=1)),
        ("slot_is_free", dict(s=1)), ("alloc_compress", {}), ("alloc_compress", {}), ("num_free_slots", {}),
        ("has_free_compress", dict(n_blocks=2)), ("has_free_compress", dict(n_blocks=3)),
        ("free_compress", dict(phys=1)), ("free_compress", dict(phys=0)), ("release_slot", dict(s=1)),
        ("release_slot", dict(s=1)), ("slot_is_free", dict(s=1)), ("free_swa", dict(phys=2)), ("num_free_slots", {}),
    ]

    def same_counts():
        assert pool.num_free_slots() == model.free_slots()
        assert pool.has_free_compress(model.free_compress_blocks())
        assert not pool.has_free_compress(model.free_compress_blocks() + 1)

    replay(steps, lambda name, kwargs: getattr(pool, name)(**kwargs),
           lambda name, args: getattr(model, POOL_MODEL_NAMES.get(name, name))(*args), same_counts)
    # By hand: slots went back to the free FIFO in the order 0 (last compress block), 1 (released), 2 (SWA).
    assert [pool.alloc_compress() for _ in range(5)] == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------
# UnifiedKvCoordinator: every method by upstream's parameter name


def coordinator_model_call(model, name, args):
    """The model's call for a coordinator method name (alloc_csa -> alloc_compress(0), ...)."""
    role = name.rsplit("_", 1)[-1]
    if role in ("csa", "hca"):
        t = CSA if role == "csa" else HCA
        return getattr(model, name[: -len(role)] + "compress")(t, *args)
    return getattr(model, name)(*args)


def test_coordinator_methods_by_upstream_keyword_match_the_model():
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=3, n_hca_slots=3, block_size=128)
    model = CoordinatorModel(2, [32, 1], [3, 3], 128)
    delivered = []
    coord.set_swa_evict_cb(cb=delivered.append)
    model_evicted = []
    steps = [
        ("has_free_swa", dict(n=2)), ("has_free_swa", dict(n=3)), ("alloc_swa", {}), ("alloc_swa", {}),
        ("has_free_swa", dict(n=1)), ("free_swa", dict(s=1)), ("free_swa", dict(s=0)), ("is_free_swa", dict(s=1)),
        ("claim_swa", dict(s=0)), ("is_free_swa", dict(s=0)), ("has_free_csa", dict(n=8)),
        ("has_free_csa", dict(n=9)), ("has_free_hca", dict(n=256)), ("has_free_hca", dict(n=257)),
        *[("alloc_csa", {})] * 5, ("is_free_swa", dict(s=1)), ("has_free_swa", dict(n=1)), ("alloc_hca", {}),
        ("free_csa", dict(phys=4)), ("is_free_swa", dict(s=1)), ("free_csa", dict(phys=9)),
        ("free_hca", dict(phys=256)), ("free_swa", dict(s=0)), ("has_free_swa", dict(n=2)),
    ]

    def evictions_delivered():
        model_evicted.extend(model.take_evicted_swa())
        assert delivered == model_evicted

    replay(steps, lambda name, kwargs: getattr(coord, name)(**kwargs),
           lambda name, args: coordinator_model_call(model, name, args), evictions_delivered)
    assert delivered == [1]  # the CSA borrow of slot 1 (coldest) evicted its cached SWA block once


# --------------------------------------------------------------------------
# The coordinator's pools coord.csa / coord.hca: the whole pool interface


POOL_ATTRIBUTES = [("csa", CSA, 32, 4, 4), ("hca", HCA, 1, 3, 128)]


@pytest.mark.parametrize("name, t, k, num_slots, blocks_per_slot", POOL_ATTRIBUTES)
def test_coordinator_pools_have_upstreams_attributes(name, t, k, num_slots, blocks_per_slot):
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=4, n_hca_slots=3)
    pool = getattr(coord, name)
    assert (pool.k, pool.num_slots, pool.block_size, pool.blocks_per_slot, pool.enabled) == (
        k, num_slots, 128, blocks_per_slot, True)
    assert (pool.bs, pool.bps) == (128, blocks_per_slot)  # the older names remain
    assert pool.num_free_slots() == num_slots - 2         # the SWA space is reserved in every pool
    assert coord.torch_object.pool_free_slots(t) == num_slots - 2


COORDINATOR_POOL_MODEL = {
    "reserve_slot": "pool_reserve_slot", "release_slot": "pool_release_slot", "slot_is_free": "pool_slot_is_free",
    "is_free_swa": "pool_slot_is_free", "has_free_swa": "pool_has_free_swa", "num_free_slots": "pool_free_slots",
    "alloc_swa": "pool_alloc_swa", "free_swa": "pool_free_swa", "claim_swa": "pool_claim_swa",
    "has_free_compress": "has_free_compress", "alloc_compress": "alloc_compress", "free_compress": "free_compress",
}


def test_coordinator_pool_methods_by_upstream_keyword_match_the_model():
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=3, n_hca_slots=3)
    model = CoordinatorModel(2, [32, 1], [3, 3], 128)
    delivered, model_evicted = [], []
    coord.set_swa_evict_cb(delivered.append)
    coord.free_swa(s=coord.alloc_swa())  # slot 0 released with a cached SWA block
    model.free_swa(model.alloc_swa())
    steps = [
        ("csa", "num_free_slots", {}), ("csa", "has_free_swa", dict(n_blocks=2)),
        ("csa", "has_free_swa", dict(n_blocks=3)), ("hca", "is_free_swa", dict(phys=0)),
        ("hca", "slot_is_free", dict(s=1)), ("csa", "reserve_slot", dict(s=1)), ("csa", "reserve_slot", dict(s=2)),
        ("csa", "reserve_slot", dict(s=2)), ("csa", "has_free_compress", dict(n_blocks=4)),
        ("csa", "has_free_compress", dict(n_blocks=5)), ("csa", "alloc_swa", {}), ("hca", "alloc_swa", {}),
        ("hca", "has_free_swa", dict(n_blocks=2)), ("hca", "claim_swa", dict(phys=2)),
        ("csa", "free_swa", dict(phys=0)), ("hca", "free_swa", dict(phys=0)), ("csa", "release_slot", dict(s=2)),
        ("csa", "alloc_compress", {}), ("csa", "free_compress", dict(phys=8)), ("hca", "free_swa", dict(phys=2)),
        ("hca", "alloc_compress", {}), ("hca", "free_compress", dict(phys=256)), ("csa", "claim_swa", dict(phys=0)),
        ("csa", "num_free_slots", {}), ("hca", "num_free_slots", {}),
    ]

    def pool_call(name, kwargs):
        role, method = name
        return getattr(getattr(coord, role), method)(**kwargs)

    def model_call(name, args):
        role, method = name
        return getattr(model, COORDINATOR_POOL_MODEL[method])(CSA if role == "csa" else HCA, *args)

    def swa_side_exact():
        model_evicted.extend(model.take_evicted_swa())
        assert delivered == model_evicted
        assert [coord.is_free_swa(s) for s in range(2)] == [model.is_free_swa(s) for s in range(2)]
        for t in (CSA, HCA):
            assert [coord.torch_object.owner(t, s) for s in range(3)] == [model.owner(t, s) for s in range(3)]
        coord.torch_object.check_invariants()

    replay([((role, method), kwargs) for role, method, kwargs in steps], pool_call, model_call, swa_side_exact)
    assert delivered == [0]  # CSA's SWA block in released slot 0 evicted its cached SWA block, once


def test_coordinator_pools_by_hand():
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=3, n_hca_slots=3)
    seen = []

    def evict(slot):
        assert not coord.is_free_swa(slot)  # already out of SWA's reach when the callback runs
        seen.append(slot)

    coord.set_swa_evict_cb(evict)
    assert coord.csa.num_free_slots() == 1 and coord.csa.has_free_swa(n_blocks=1)
    assert not coord.csa.has_free_swa(n_blocks=2)
    coord.free_swa(s=coord.alloc_swa())            # slot 0: released, cached
    assert coord.csa.num_free_slots() == 2 and coord.csa.is_free_swa(phys=0)
    assert coord.csa.alloc_swa() == 0 and seen == [0]  # the pool's shared slots first; evicted before returning
    assert not coord.is_free_swa(s=0) and coord.has_free_swa(n=1) and not coord.has_free_swa(n=2)
    assert coord.hca.reserve_slot(s=2) is True     # its own region, as upstream
    assert coord.hca.reserve_slot(s=1) is False    # never used by SWA: the SWA space's
    assert coord.alloc_swa() == 1
    coord.csa.free_swa(phys=0)
    assert coord.is_free_swa(s=0) and coord.has_free_swa(n=1)
    assert coord.hca.alloc_compress() == 0 and seen == [0]  # borrowed again: its cache entry is long gone
    with pytest.raises(OutOfSlots, match="^No free KV slots available$"):
        coord.hca.alloc_swa()                       # slot 0 compress, 1 SWA, 2 reserved
    coord.hca.release_slot(s=2)
    assert coord.hca.alloc_swa() == 2 and coord.hca.num_free_slots() == 0
    coord.hca.free_compress(phys=0)
    assert coord.is_free_swa(s=0) and coord.hca.num_free_slots() == 1


def test_coordinator_pools_refuse_what_would_corrupt_the_swa_space():
    coord = UnifiedKvCoordinator(num_swa_base=2, n_csa_slots=3, n_hca_slots=3)
    s = coord.alloc_swa()
    coord.free_swa(s=coord.alloc_swa())  # slot 1 released, free in both pools
    refused = [
        (lambda: coord.csa.release_slot(s=s), "release_slot: slot 0 is reserved for the SWA space \\(held by SWA\\)"),
        (lambda: coord.hca.reserve_slot(s=1), "reserve_slot: slot 1 is in the SWA space"),
    ]
    for call, match in refused:
        assert_refused_without_change(coord, call, RuntimeError, match)
    coord.csa.claim_swa(phys=1)
    assert_refused_without_change(coord, lambda: coord.claim_swa(s=1), RuntimeError, "not free")
    assert_refused_without_change(coord, lambda: coord.csa.release_slot(s=1), RuntimeError, "not reserved")


# --------------------------------------------------------------------------
# Bad arguments: a clear error naming the parameter, the state unchanged


def pool_and_coordinator():
    pool = UnifiedTypePool(4, 32)
    pool.alloc_compress()
    coord = UnifiedKvCoordinator(2, 3, 3)
    coord.free_swa(coord.alloc_swa())
    coord.alloc_csa()
    return {"pool": (pool, pool), "coord": (coord, coord), "csa": (coord.csa, coord), "hca": (coord.hca, coord)}


# (object, method, parameter, an id out of range, the operation a range error names)
ID_PARAMETERS = [
    *[(obj, m, "s", 99, m) for obj in ("pool", "csa", "hca") for m in ("reserve_slot", "release_slot", "slot_is_free")],
    *[(obj, m, "phys", 99, m) for obj in ("pool", "csa", "hca") for m in ("free_swa", "claim_swa")],
    ("pool", "is_free_swa", "phys", 99, "is_free_swa"), ("csa", "is_free_swa", "phys", 99, "slot_is_free"),
    ("hca", "is_free_swa", "phys", 99, "slot_is_free"),
    ("pool", "free_compress", "phys", 16, "free_compress"), ("csa", "free_compress", "phys", 12, "free_compress"),
    ("hca", "free_compress", "phys", 3 * 128, "free_compress"),
    *[("coord", m, "s", 2, m) for m in ("free_swa", "is_free_swa", "claim_swa")],
    ("coord", "free_csa", "phys", 12, "free_compress"), ("coord", "free_hca", "phys", 3 * 128, "free_compress"),
]
COUNT_PARAMETERS = [
    *[(obj, m, "n_blocks") for obj in ("pool", "csa", "hca") for m in ("has_free_swa", "has_free_compress")],
    *[("coord", m, "n") for m in ("has_free_swa", "has_free_csa", "has_free_hca")],
]


@pytest.mark.parametrize("obj, method, parameter", [(o, m, p) for o, m, p, _, _ in ID_PARAMETERS] + COUNT_PARAMETERS)
@pytest.mark.parametrize("value", ["1", 1.5, None, [1]], ids=["str", "float", "None", "list"])
def test_a_wrongly_typed_argument_is_a_type_error_naming_the_parameter(obj, method, parameter, value):
    target, owner = pool_and_coordinator()[obj]
    call = getattr(target, method)
    assert_refused_without_change(owner, lambda: call(**{parameter: value}), TypeError,
                                  rf"^{method}: {parameter} must be an int, got {type(value).__name__}$")


@pytest.mark.parametrize("obj, method, parameter, too_big, operation", ID_PARAMETERS)
def test_an_id_out_of_range_is_a_value_error_naming_the_parameter(obj, method, parameter, too_big, operation):
    target, owner = pool_and_coordinator()[obj]
    call = getattr(target, method)
    for value in (-1, too_big, 2**63 - 1):
        assert_refused_without_change(owner, lambda: call(**{parameter: value}), ValueError,
                                      rf"^{operation}: .* out of range .* \({parameter}={value}\)$")


def test_an_int_like_argument_is_taken_as_its_int():
    import numpy as np  # an engine may pass numpy ints, as upstream's set lookups accept them
    pool = UnifiedTypePool(4, 32)
    pool.claim_swa(phys=np.int64(2))
    assert not pool.is_free_swa(phys=np.int32(2)) and pool.has_free_swa(n_blocks=np.int64(3))
    pool.free_swa(phys=np.int64(2))
    assert pool.num_free_slots() == 4
