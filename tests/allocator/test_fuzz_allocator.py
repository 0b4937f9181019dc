"""Property-based fuzzing of the allocator: the torch classes TypePool and
Coordinator, the drop-ins UnifiedTypePool and UnifiedKvCoordinator, and the
sizing functions, against the pure-Python model (ukv_torch/testing/allocator_model.py) and
upstream's sizing formulas (unified_slot_counts, the layer rows).

  * Constructors with sizes around the int32 row limit, pools of 0 and 1
    slots, bad compress ratios / k / block_size / shared counts, int64 extremes: the model's
    verdict, a refusal being a ValueError naming the model's argument; a pool
    that is built hands out only ids whose rows fit the int32 row range.
  * Every method with arguments of any kind (ints at the int64 extremes,
    bools, floats, strings, None, lists; batch tensors of any dtype, rank,
    device, stride, empty): the model's answer or refusal call for call, and
    a refused call (or a query) leaves the serialized state unchanged.
  * Sizing near the int32 row limit: the formula's value or a ValueError,
    never a wrapped number.

The model-based runs of test_allocator_model.py drive long sequences of
valid and invalid calls; these add the argument kinds and the limits.
"""
from collections import Counter

import pytest
import torch
from hypothesis import given, strategies as st

import ukv_torch
from support.fuzz_support import ID_LAYOUTS, fuzz_settings, in_layout
from support.outcomes import assert_same_outcome, model_outcome, torch_outcome
from ukv_torch.testing.allocator_model import (MAX_ROWS, CoordinatorModel, InvalidArgument, PoolModel,
                                               coordinator_model, pool_model, reference_layer_rows,
                                               reference_type_slots)

INT64_EXTREMES = [2**63 - 1, -(2**63)]
BLOCK_SIZES = [-1, 0, 1, 4, 16, 128, 256, 2**16, 2**20, 2**31, 2**40]


def slot_counts_near_the_row_limit(block_size):
    """Slot counts: small ones, the int32 row limit +-1 where that is few slots
    (a pool's memory grows with its slots), and values far past it."""
    limit = MAX_ROWS // block_size if block_size > 0 else 0
    near = [limit - 1, limit, limit + 1] if 0 < limit <= 1 << 15 else []
    return st.one_of(st.integers(-2, 40), st.sampled_from(near + [2**31, 2**62] + INT64_EXTREMES))


def rows_per_block(block_size):
    """k (the drop-ins): divisors with few blocks per slot (their sub-block maps stay small), and bad values."""
    good = [block_size // d for d in (1, 4, 32) if block_size > 0 and block_size % d == 0]
    return st.sampled_from(good + [0, -1, 3, 48, 2**40])


def compress_ratios(block_size):
    """Compress ratios (the torch classes): few blocks per slot, as rows_per_block, and bad values."""
    good = [d for d in (1, 4, 32) if block_size > 0 and block_size % d == 0]
    return st.sampled_from(good + [0, -1, 3, 48, 2**40])


def refusal_names(argument, message):
    assert argument in message, f"the refusal {message!r} does not name {argument!r}"


def built_or_refused(model_make, torch_make):
    """(model, torch object) when the model accepts the arguments; else the torch
    side must refuse with a ValueError naming the model's argument: (None, None)."""
    try:
        model = model_make()
    except InvalidArgument as exc:
        with pytest.raises(ValueError) as refused:
            torch_make()
        refusal_names(exc.argument, str(refused.value))
        return None, None
    return model, torch_make()


@st.composite
def pool_arguments(draw, per_block=compress_ratios):
    """(num_slots, compress ratio, block_size, shared_slots); k in place of the ratio with per_block=rows_per_block."""
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    num_slots = draw(slot_counts_near_the_row_limit(block_size))
    per_slot = draw(per_block(block_size))
    shared = draw(st.one_of(st.integers(-1, 3), st.just(num_slots), st.sampled_from(INT64_EXTREMES)))
    return num_slots, per_slot, block_size, shared


def check_pool(model, pool, num_slots, ratio, block_size, shared):
    k = model.k
    assert (pool.num_slots(), pool.k(), pool.compress_ratio(), pool.block_size(), pool.shared_slots(),
            pool.blocks_per_slot()) == (num_slots, k, ratio, block_size, shared, model.blocks_per_slot)
    assert (pool.free_slots(), pool.free_compress_blocks()) == (model.free_slots(), model.free_compress_blocks())
    if num_slots and k:  # the first compress block addresses rows inside the int32 range
        phys = pool.alloc_compress()
        assert phys == model.alloc_compress() and (phys + 1) * k <= num_slots * block_size <= MAX_ROWS
    if num_slots and model.slot_is_free(num_slots - 1):  # so does the last slot
        pool.claim_swa(num_slots - 1)
        model.claim_swa(num_slots - 1)
        assert num_slots * block_size <= MAX_ROWS


@given(args=pool_arguments(rows_per_block))
@fuzz_settings(150)
def test_drop_in_pool_constructor_names_its_own_arguments(args):
    num_slots, k, block_size, _ = args
    try:
        PoolModel(num_slots, k, block_size)
    except InvalidArgument as exc:
        given = rf"num_slots={num_slots}, k={k}, bs={block_size}"
        with pytest.raises(ValueError, match=rf"^UnifiedTypePool\({given}\): ") as e:
            ukv_torch.UnifiedTypePool(num_slots, k, block_size)
        refusal_names(exc.argument, str(e.value))
        return
    pool = ukv_torch.UnifiedTypePool(num_slots, k, block_size)
    assert (pool.num_slots, pool.k, pool.bs, pool.enabled) == (num_slots, k, block_size, num_slots > 0)


@st.composite
def coordinator_arguments(draw):
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    sizes = slot_counts_near_the_row_limit(block_size)
    base = draw(sizes)
    types = draw(st.integers(0, 3))
    ratios = [draw(compress_ratios(block_size)) for _ in range(types)]
    slots = [draw(st.one_of(sizes, st.just(base), st.just(min(base + 1, 2**63 - 1)))) for _ in range(types + draw(
        st.sampled_from([0, 0, 0, 1, -1]) if types else st.just(0)))]
    return base, ratios, slots, block_size


def check_coordinator(model, coord, base, ratios, slots, block_size):
    ks = model.ks()
    assert (coord.num_swa_base(), coord.compress_ratios(), coord.ks(), coord.type_slots()) == (base, ratios, ks, slots)
    assert coord.free_swa_slots() == model.free_swa_slots()
    for t in range(len(ks)):
        assert coord.free_compress_blocks(t) == model.free_compress_blocks(t)
        if slots[t] > base:  # the own region's first block: rows inside the int32 range
            phys = coord.alloc_compress(t)
            assert phys == model.alloc_compress(t) and (phys + 1) * ks[t] <= slots[t] * block_size <= MAX_ROWS


# The models built from the torch classes' arguments (compress ratios, checked first).
CONSTRUCTORS = {"TypePool": (pool_arguments, pool_model, check_pool),
                "Coordinator": (coordinator_arguments, coordinator_model, check_coordinator)}


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_constructors_near_the_int32_row_limit_build_the_model_or_refuse_naming_it(name):
    arguments, make_model, check = CONSTRUCTORS[name]

    @fuzz_settings(300)
    @given(args=arguments())
    def case(args):
        model, obj = built_or_refused(lambda: make_model(*args), lambda: getattr(torch.classes.ukv, name)(*args))
        if model is not None:
            check(model, obj, *args)
            obj.check_invariants()

    case()


@given(base=st.integers(-1, 6), n_csa=st.integers(-1, 9), n_hca=st.integers(-1, 9),
       bs=st.sampled_from([0, 32, 128, 256]))
@fuzz_settings(150)
def test_drop_in_coordinator_constructor_names_its_own_arguments(base, n_csa, n_hca, bs):
    try:
        if bs <= 0:  # the drop-in derives the compress ratios from bs first, so it names a bad bs first
            raise InvalidArgument("block_size")
        CoordinatorModel(base, [32, 1], [n_csa, n_hca], bs)
    except InvalidArgument as exc:
        with pytest.raises(ValueError, match=rf"^UnifiedKvCoordinator\(num_swa_base={base}, ") as e:
            ukv_torch.UnifiedKvCoordinator(base, n_csa, n_hca, bs)
        refusal_names(exc.argument, str(e.value))
        return
    coord = ukv_torch.UnifiedKvCoordinator(base, n_csa, n_hca, bs)
    assert (coord.num_swa_base, coord.csa.num_slots, coord.hca.num_slots) == (base, n_csa, n_hca)


# ---------------------------------------------------------------- methods --
INTS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31 - 1, 2**31] + INT64_EXTREMES), st.booleans())
NOT_INTS = st.sampled_from([None, 1.5, "1", [1]])


@st.composite
def an_int(draw):
    """(argument, whether the model can take it): mostly ints, sometimes a wrong type."""
    if draw(st.integers(0, 9)) == 0:
        return draw(NOT_INTS), False
    return draw(INTS), True


@st.composite
def an_id_batch(draw):
    """(tensor argument, ids for the model or None when the tensor is malformed)."""
    ids = draw(st.lists(st.one_of(st.integers(-1, 40), st.sampled_from(INT64_EXTREMES)), max_size=6))
    layout = draw(st.sampled_from(ID_LAYOUTS))
    return in_layout(ids, layout), (ids if layout in ("contiguous", "strided") else None)


# method -> kinds of its arguments ("i" an int, "T" an id batch); queries never change the state.
POOL_METHODS = {"reserve_slot": "i", "release_slot": "i", "slot_is_free": "i", "owner": "i", "alloc_swa": "",
                "free_swa": "i", "claim_swa": "i", "is_free_swa": "i", "has_free_swa": "i", "alloc_swa_n": "i",
                "free_swa_many": "T", "alloc_compress": "", "free_compress": "i", "has_free_compress": "i",
                "alloc_compress_n": "i", "free_compress_many": "T", "free_slots": "", "free_compress_blocks": ""}
COORDINATOR_METHODS = {"alloc_swa": "", "free_swa": "i", "claim_swa": "i", "is_free_swa": "i", "has_free_swa": "i",
                       "free_swa_slots": "", "alloc_swa_n": "i", "free_swa_many": "T", "alloc_compress": "i",
                       "free_compress": "ii", "has_free_compress": "ii", "free_compress_blocks": "i",
                       "alloc_compress_n": "ii", "free_compress_many": "iT", "take_evicted_swa": "",
                       "owner": "ii", "pool_slot_is_free": "ii"}
QUERIES = {"slot_is_free", "owner", "is_free_swa", "has_free_swa", "has_free_compress", "free_slots",
           "free_compress_blocks", "free_swa_slots", "pool_slot_is_free"}
# One compress type's pool through its own methods (upstream's coord.csa / coord.hca), fuzzed among the rest.
COORDINATOR_POOL_METHODS = {"pool_reserve_slot": "ii", "pool_release_slot": "ii", "pool_alloc_swa": "i",
                            "pool_free_swa": "ii", "pool_claim_swa": "ii", "pool_has_free_swa": "ii",
                            "pool_free_slots": "i"}
QUERIES.update({"pool_has_free_swa", "pool_free_slots"})


def draw_arguments(data, kinds):
    """(arguments for the torch side, for the model or None when one is malformed)."""
    drawn = [data.draw(an_int() if kind == "i" else an_id_batch(), label=kind) for kind in kinds]
    ok = all(m is not None and m is not False for _, m in drawn)
    return [a for a, _ in drawn], ([a if kind == "i" else m for (a, m), kind in zip(drawn, kinds)] if ok else None)


def warm_up(data, model, obj, methods):
    """A few calls with small ints, made on both sides when the model takes them, to leave the fresh state."""
    names = sorted(name for name, kinds in methods.items() if "T" not in kinds)
    for name in data.draw(st.lists(st.sampled_from(names), max_size=12), label="warm-up"):
        args = [data.draw(st.integers(0, 8)) for _ in methods[name]]
        if model_outcome(lambda: getattr(model, name)(*args))[0] == "ok":
            getattr(obj, name)(*args)


def torch_call(fn):
    """torch_outcome of fn, and the refusal's message ("" when it succeeded)."""
    messages = []

    def recording():
        try:
            return fn()
        except Exception as exc:
            messages.append(str(exc))
            raise
    return torch_outcome(recording), "".join(messages)


def fuzz_methods(data, obj, model, methods, torch_object, outcomes):
    """Random calls of `methods` on obj and the model; torch_object has the state."""
    warm_up(data, model, obj, methods)
    for _ in range(data.draw(st.integers(1, 12), label="calls")):
        name = data.draw(st.sampled_from(sorted(methods)), label="method")
        args, model_args = draw_arguments(data, methods[name])
        before = torch_object.__getstate__()
        actual, message = torch_call(lambda: getattr(obj, name)(*args))
        if model_args is None:
            assert actual[0] in ("invalid", "bad_call"), f"{name}{tuple(args)}: {actual}"
        else:
            assert_same_outcome(model_outcome(lambda: getattr(model, name)(*model_args)), actual, name)
        if actual[0] == "invalid" and model_args is not None:  # a bad value: named by the refusing operation
            assert message.split(":")[0] in TORCH_OPERATION.get(name, name), f"{name}{tuple(args)}: {message!r}"
        outcomes[actual[0]] += 1
        if actual[0] != "ok" or name in QUERIES:
            assert torch_object.__getstate__() == before, f"{name}{tuple(args)} ({actual[0]}) changed the state"
        torch_object.check_invariants()


class DropInCoordinatorModel:
    """The model under the drop-in coordinator's method names (CSA type 0, HCA type 1)."""

    def __init__(self, model):
        self.model = model
        for name in ("alloc_swa", "free_swa", "claim_swa", "is_free_swa", "has_free_swa"):
            setattr(self, name, getattr(model, name))
        for t, role in enumerate(("csa", "hca")):
            setattr(self, f"alloc_{role}", lambda t=t: model.alloc_compress(t))
            setattr(self, f"free_{role}", lambda p, t=t: model.free_compress(t, p))
            setattr(self, f"has_free_{role}", lambda n=1, t=t: model.has_free_compress(t, n))


DROP_IN_COORDINATOR_METHODS = {"alloc_swa": "", "free_swa": "i", "claim_swa": "i", "is_free_swa": "i",
                               "has_free_swa": "i", **{f"{op}_{role}": kinds for role in ("csa", "hca") for op, kinds
                                                       in (("alloc", ""), ("free", "i"), ("has_free", "i"))}}
QUERIES.update({"has_free_csa", "has_free_hca"})
# The torch-class operation behind a drop-in method, which its refusals name.
TORCH_OPERATION = {f"{op}_{role}": f"{op}_compress" for role in ("csa", "hca") for op in ("alloc", "free", "has_free")}


def pool_pair(*args):
    return pool_model(*args), torch.classes.ukv.TypePool(*args)


def coordinator_pair(*args):
    return coordinator_model(*args), torch.classes.ukv.Coordinator(*args)


SHAPES = {
    # a name: (model, torch object) factories; pools of 0 and 1 slots included
    "pool": lambda: pool_pair(5, 4, 128, 2),
    "pool_one_slot": lambda: pool_pair(1, 4, 4, 1),
    "pool_zero_slots": lambda: pool_pair(0, 4, 128, 0),
    "pool_swa_only": lambda: pool_pair(3, 0, 128, 0),
    "coordinator": lambda: coordinator_pair(3, [4, 128], [5, 4], 128),
    "coordinator_one_slot": lambda: coordinator_pair(1, [4], [1], 8),
    "coordinator_zero_slots": lambda: coordinator_pair(0, [4, 128], [0, 0], 128),
}


def drop_in_pool():
    pool = ukv_torch.UnifiedTypePool(4, 32, 128)
    methods = {name: kinds for name, kinds in POOL_METHODS.items() if hasattr(pool, name)}
    return PoolModel(4, 32, 128), pool, methods, pool.torch_object


def drop_in_coordinator():
    coord = ukv_torch.UnifiedKvCoordinator(3, 5, 4)
    return (DropInCoordinatorModel(CoordinatorModel(3, [32, 1], [5, 4])), coord, DROP_IN_COORDINATOR_METHODS,
            coord.torch_object)


def with_methods(make):
    model, obj = make()
    return model, obj, POOL_METHODS if isinstance(model, PoolModel) else COORDINATOR_METHODS, obj


def coordinator_with_pool_methods(*args):
    model, obj = coordinator_pair(*args)
    return model, obj, {**COORDINATOR_METHODS, **COORDINATOR_POOL_METHODS}, obj


FRONT_ENDS = {**{name: (lambda make=make: with_methods(make)) for name, make in SHAPES.items()},
              "drop_in_pool": drop_in_pool, "drop_in_coordinator": drop_in_coordinator,
              "coordinator_pool_methods": lambda: coordinator_with_pool_methods(3, [4, 128], [5, 4], 128),
              "coordinator_pool_methods_one_slot": lambda: coordinator_with_pool_methods(1, [4], [1], 8)}


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_every_method_with_any_argument_matches_the_model_or_changes_nothing(front_end):
    outcomes = Counter()

    @fuzz_settings(120)
    @given(data=st.data())
    def case(data):
        model, obj, methods, torch_object = FRONT_ENDS[front_end]()
        fuzz_methods(data, obj, model, methods, torch_object, outcomes)

    case()
    assert outcomes["ok"] > 0 and outcomes["invalid"] + outcomes["bad_call"] > 0, outcomes


# ----------------------------------------------------------------- sizing --
def near_row_limit(unit):
    """Counts around the int32 row limit for `unit` rows each, small ones and int64 extremes."""
    limit = MAX_ROWS // unit
    return st.one_of(st.integers(-1, 70), st.sampled_from([limit - 1, limit, limit + 1, 2**62] + INT64_EXTREMES))


@st.composite
def sizing_arguments(draw):
    block_size = draw(st.sampled_from([-1, 0, 1, 128, 256, 2**20, 2**31]))
    ratio = draw(st.sampled_from([0, 1, 3, 4, 128, 256, -4]))
    unit = max(block_size, 1)
    return ratio, draw(near_row_limit(unit)), draw(near_row_limit(max(unit // max(ratio, 1), 1))), block_size


def sizing_verdict(ratio, num_swa, nb, block_size, unified):
    """The rows of the layer tensor, or None when an argument is out of its domain or
    the rows pass the int32 limit (every row index a kernel reads is int32)."""
    if block_size <= 0 or ratio < 0 or (ratio and block_size % ratio) or num_swa < 0 or nb < 0:
        return None
    rows = reference_layer_rows(ratio, num_swa, nb, block_size, unified)
    parts_fit = num_swa * block_size <= MAX_ROWS and (not ratio or unified or nb * (block_size // ratio) <= MAX_ROWS)
    return rows if parts_fit and rows <= MAX_ROWS else None


@given(args=sizing_arguments(), unified=st.booleans())
@fuzz_settings(400)
def test_sizing_near_the_int32_row_limit_is_exact_or_refused(args, unified):
    ratio, num_swa, nb, block_size = args
    expected = sizing_verdict(ratio, num_swa, nb, block_size, unified)
    if expected is None:
        with pytest.raises(ValueError, match="block_size|compress_ratio|num_swa_blocks|num_compress_blocks|row limit"):
            torch.ops.ukv.layer_rows(ratio, num_swa, nb, block_size, unified)
    else:
        assert torch.ops.ukv.layer_rows(ratio, num_swa, nb, block_size, unified) == expected
    if unified and ratio > 0 and block_size > 0 and block_size % ratio == 0:  # pools are sized the same way
        k = block_size // ratio
        if expected is None:
            with pytest.raises(ValueError, match="num_swa_blocks|num_compress_blocks|row limit"):
                ukv_torch.slot_counts(num_swa, nb, [ratio], block_size)
        else:
            assert ukv_torch.slot_counts(num_swa, nb, [ratio], block_size) == [reference_type_slots(num_swa, nb, k,
                                                                                                      block_size)]
