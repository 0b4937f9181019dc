"""Model-based randomized test of torch.classes.ukv.TypePool and Coordinator.

Random operations, valid and invalid, on every method of both torch classes
(batch methods with duplicate, foreign and out-of-range ids and badly typed
tensors included) run call for call against ukv_torch/testing/allocator_model.py. After
every operation:

  * the torch object and the model return the same ids and answers, or refuse
    the same way (ValueError / RuntimeError / the upstream OutOfSlots text);
  * a refused operation, and every query, left the state snapshot unchanged;
  * a RowLedger, derived only from the ids handed out and freed, places every
    SWA block and compress block in its block_size-row range of each tensor
    and finds no row range owned by two roles or two blocks, and the torch
    object's owner() of every slot and is_free_swa() of every SWA slot agree
    with it;
  * every free count and every counter equals the model's.

can_allocate_jointly is checked against first principles (allocations_succeed
simulates orders on the model) and, when it admits, its promise is kept by
really performing the allocations in a random interleaving.

Every Coordinator shape runs twice: with upstream borrowing (compress borrows
only slots SWA released) and with borrow_unreleased_swa (compress may also be
lent slots SWA never used).
"""
import copy
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

from support.copies import COPY_WAYS, copy_by
from support.outcomes import assert_same_outcome, model_outcome, torch_outcome
from ukv_torch import OutOfSlots, UnifiedKvCoordinator
from ukv_torch.testing.allocator_model import COMPRESS, FREE, RESERVED, SWA, CoordinatorModel, PoolModel

class IdBag:
    """Ids currently held, with O(1) add, remove and random choice."""

    def __init__(self):
        self._ids, self._index = [], {}

    def add(self, item):
        assert item not in self._index, f"id {item} handed out twice"
        self._index[item] = len(self._ids)
        self._ids.append(item)

    def remove(self, item):
        i = self._index.pop(item)
        last = self._ids.pop()
        if i < len(self._ids):
            self._ids[i] = last
            self._index[last] = i

    def __contains__(self, item):
        return item in self._index

    def __len__(self):
        return len(self._ids)

    def choice(self, rng):
        return rng.choice(self._ids)

    def sample(self, rng, n):
        return rng.sample(self._ids, min(n, len(self._ids)))


# --------------------------------------------------------------------------
# Row ownership, derived from the ids alone


class RowLedger:
    """Which role holds each block_size-row range of each tensor, derived only
    from the ids the allocator handed out and took back, by the addressing
    rules: SWA slot s is rows [s*bs, (s+1)*bs) of every tensor it is valid in;
    compress block p of a type with k rows per block is rows [p*k, (p+1)*k) of
    that type's tensor."""

    def __init__(self, block_size, swa_slots, type_ks, type_slots, coordinated, lends_unreleased=False):
        # coordinated: a Coordinator, whose SWA slots span every type's tensor
        # and which every pool sees as reserved; else a TypePool used alone.
        # lends_unreleased: the Coordinator may lend compress an SWA slot SWA
        # never released, which from then on is free in every pool.
        self.bs = block_size
        self.lends_unreleased = lends_unreleased
        self.swa_slots = swa_slots
        self.ks, self.rows = list(type_ks), [n * block_size for n in type_slots]
        self.coordinated = coordinated
        self.swa_held = IdBag()
        self.swa_released = set()   # Coordinator: SWA slots SWA freed and has not taken back
        self.reserved = set()       # TypePool: slots reserved through reserve_slot
        # Coordinator: per type, slots its pool holds through its own methods
        # (upstream's coord.csa / coord.hca): SWA blocks of that tensor alone, reservations.
        self.pool_swa = [set() for _ in type_ks]
        self.pool_reserved = [set() for _ in type_ks]
        self.compress_held = [IdBag() for _ in type_ks]
        self.first_rows = [dict() for _ in type_ks]     # first row -> block holding it
        self.blocks_in_slot = [Counter() for _ in type_ks]

    def swa_taken(self, slot):
        assert 0 <= slot < self.swa_slots, f"SWA slot {slot} outside the SWA space"
        tensors = range(len(self.ks)) if self.coordinated else [0]
        for t in tensors:
            assert self.blocks_in_slot[t][slot] == 0, f"SWA slot {slot} overlaps compress rows of tensor {t}"
        assert slot not in self.reserved, f"SWA took reserved slot {slot}"
        if self.coordinated:
            for t in tensors:
                assert not self.pool_holds(t, slot), f"SWA slot {slot} overlaps pool {t}'s own tenancy"
        self.swa_held.add(slot)
        self.swa_released.discard(slot)

    def swa_freed(self, slot):
        self.swa_held.remove(slot)
        self.swa_released.add(slot)

    def compress_taken(self, t, phys):
        k = self.ks[t]
        first, last = phys * k, phys * k + k - 1
        slot = first // self.bs
        assert 0 <= first and last < self.rows[t], f"type {t} block {phys}: rows outside the tensor"
        assert last // self.bs == slot, f"type {t} block {phys}: rows cross a slot boundary"
        assert first not in self.first_rows[t], f"type {t} rows {first}.. owned by two blocks"
        assert slot not in self.swa_held, f"type {t} block {phys} overlaps SWA slot {slot}"
        assert slot not in self.reserved, f"type {t} block {phys} in reserved slot {slot}"
        assert not self.pool_holds(t, slot), f"type {t} block {phys} in slot {slot} its pool holds otherwise"
        if self.coordinated and slot < self.swa_slots and slot not in self.swa_released:
            assert self.lends_unreleased, f"type {t} borrowed SWA slot {slot} that SWA never released"
            self.swa_released.add(slot)  # lent: free in every pool from now on
        self.compress_held[t].add(phys)
        self.first_rows[t][first] = phys
        self.blocks_in_slot[t][slot] += 1

    def compress_freed(self, t, phys):
        self.compress_held[t].remove(phys)
        del self.first_rows[t][phys * self.ks[t]]
        self.blocks_in_slot[t][phys * self.ks[t] // self.bs] -= 1

    def pool_holds(self, t, slot):
        return slot in self.pool_swa[t] or slot in self.pool_reserved[t]

    def pool_taken(self, t, slot, reserved=False):
        """Coordinator: type t's pool took slot through its own methods."""
        assert 0 <= slot < self.rows[t] // self.bs, f"pool {t} took slot {slot} outside its tensor"
        assert self.blocks_in_slot[t][slot] == 0, f"pool {t} took slot {slot}, which holds its compress blocks"
        assert not self.pool_holds(t, slot), f"pool {t} took slot {slot} twice"
        if slot < self.swa_slots:
            assert slot in self.swa_released and slot not in self.swa_held, \
                f"pool {t} took SWA slot {slot}, which SWA holds or never released"
        (self.pool_reserved if reserved else self.pool_swa)[t].add(slot)

    def pool_released(self, t, slot):
        self.pool_reserved[t].discard(slot)  # releasing a free slot does nothing

    def pool_swa_freed(self, t, slot):
        self.pool_swa[t].remove(slot)

    def expected_owner(self, t, slot):
        if self.blocks_in_slot[t][slot]:
            return COMPRESS
        if self.coordinated and slot in self.pool_swa[t]:
            return SWA
        if self.coordinated and slot in self.pool_reserved[t]:
            return RESERVED
        if self.coordinated:  # Coordinator: SWA's slots are reserved in every pool
            return RESERVED if slot < self.swa_slots and slot not in self.swa_released else FREE
        if slot in self.swa_held:
            return SWA
        return RESERVED if slot in self.reserved else FREE

    def expected_swa_free(self, slot):
        """SWA may take a slot it does not hold unless a compress pool holds blocks in it
        (or holds it through its own methods)."""
        return (slot not in self.swa_held and not any(b[slot] for b in self.blocks_in_slot)
                and not any(self.pool_holds(t, slot) for t in range(len(self.ks))))


# --------------------------------------------------------------------------
# Random arguments


def random_n(rng, blocks_per_slot, free):
    return rng.choice([-1, 0, 1, 2, 3, blocks_per_slot, blocks_per_slot + 1, free, free + 1,
                       rng.randint(0, 2 * blocks_per_slot + 2)])


def pick_id(rng, held, id_range):
    """Mostly a held id (a valid free), else any id in range, else out of range."""
    r = rng.random()
    if held and r < 0.8:
        return held.choice(rng)
    if r < 0.93 and id_range > 0:
        return rng.randrange(id_range)
    return rng.choice([-1, id_range, id_range + 5, 2**40, -(2**40)])


def random_batch(rng, held, id_range):
    """(tensor for the torch object, ids for the model or None when the tensor
    itself is malformed). Mostly a valid batch of held ids."""
    ids = held.sample(rng, rng.choice([0, 1, 2, 3, 5, 8]))
    r = rng.random()
    if r < 0.06 and ids:
        ids.append(rng.choice(ids))                                   # duplicate
    elif r < 0.12:
        ids.insert(rng.randrange(len(ids) + 1), pick_id(rng, None, id_range))  # foreign / out of range
    r = rng.random()
    if r < 0.03:
        return torch.tensor(ids, dtype=torch.int64).to(rng.choice([torch.int32, torch.float64, torch.int16])), None
    if r < 0.05:
        return torch.tensor([ids], dtype=torch.int64), None           # 2-D
    if r < 0.06:
        return torch.tensor(ids[0] if ids else 0, dtype=torch.int64), None  # 0-D
    if r < 0.12:
        spread = torch.tensor([x for i in ids for x in (i, -7)], dtype=torch.int64)
        return spread[::2], ids                                       # non-contiguous but valid
    return torch.tensor(ids, dtype=torch.int64), ids


def bad_call(rng, obj, method_names):
    """A call with a wrongly typed argument: the schema must reject it. (None
    for a Tensor argument passes the schema as an undefined tensor; the
    scenario tests cover it.)"""
    name = rng.choice(method_names)
    args = ["x", 1.5, [1, 2]] + ([] if name.endswith("_many") else [None])
    return lambda: getattr(obj, name)(rng.choice(args))


def round_trip(obj, rng):
    return copy_by(rng.choice(COPY_WAYS), obj)


# --------------------------------------------------------------------------
# The driver


@dataclass
class Op:
    """One random operation."""

    name: str
    call: Callable                      # on the torch object
    model: Optional[Callable] = None    # the same call on the model
    judge: Optional[Callable] = None    # checks the torch outcome by its own rule instead
    effect: Optional[Callable] = None   # updates the ledger from a successful result
    query: bool = False                 # must not change the state even when it succeeds
    expect: Optional[str] = None        # the refusal of a malformed call ("invalid", "bad_call")
    promised: bool = False              # an allocation an admission check promised


class Run:
    """Drives one torch object and its model through random operations."""

    ALLOCS = {"alloc_swa", "alloc_swa_n", "claim_swa", "alloc_compress", "alloc_compress_n"}
    FREES = {"free_swa", "free_swa_many", "free_compress", "free_compress_many"}
    OPS = []  # (operation, weight)
    SCALE = {}  # operation -> weight factor of this run

    def __init__(self, seed, obj, model, ledger):
        self.rng = random.Random(seed)
        self.obj, self.model, self.ledger = obj, model, ledger
        self.outcomes = Counter()   # (operation, outcome kind), for the coverage assertions
        self.promised = deque()     # allocations an admission check promised, performed next
        self.filling = True

    def run(self, num_ops):
        for step in range(num_ops):
            self.filling = (step // 250) % 2 == 0  # alternate phases sweep between empty and exhausted
            self.step(self.promised.popleft() if self.promised else self.random_op())
        return self.outcomes

    def random_op(self):
        names = [name for name, _ in self.OPS]
        bias = {**dict.fromkeys(self.ALLOCS, 2.0 if self.filling else 0.5),
                **dict.fromkeys(self.FREES, 0.5 if self.filling else 2.0)}
        weights = [w * bias.get(name, 1.0) * self.SCALE.get(name, 1.0) for name, w in self.OPS]
        name = self.rng.choices(names, weights)[0]
        return getattr(self, "op_" + name)()

    def step(self, op):
        before = self.obj.__getstate__()
        actual = torch_outcome(op.call)
        if op.expect is not None:
            assert actual[0] == op.expect, f"{op.name}: expected {op.expect}, torch {actual}"
        elif op.judge is not None:
            op.judge(actual)
        else:
            assert_same_outcome(model_outcome(op.model), actual, op.name)
        if op.promised:
            assert actual[0] == "ok", f"an admitted allocation failed: {actual}"
            self.outcomes["promised allocation", actual[0]] += 1
        self.outcomes[op.name, actual[0]] += 1
        if actual[0] != "ok" or op.query:
            assert self.obj.__getstate__() == before, f"{op.name} ({actual[0]}) changed the state"
        elif op.effect is not None:
            op.effect(actual[1])
        self.check_all()

    # --- operations both classes share ---
    def op_check_invariants(self):
        return Op("check_invariants", lambda: self.obj.check_invariants(), lambda: None, query=True)

    def op_round_trip(self):
        def replace(_):
            clone = round_trip(self.obj, self.rng)
            assert clone.__getstate__() == self.obj.__getstate__()
            assert clone.__obj_flatten__()[0][1].tolist() == self.obj.__getstate__()[0]
            self.obj = clone  # later operations continue on the copy
        return Op("round_trip", lambda: None, lambda: None, effect=replace)

    def swa_free_batch(self, id_range):
        tensor, ids = random_batch(self.rng, self.ledger.swa_held, id_range)

        def effect(_):
            for slot in ids:
                self.ledger.swa_freed(slot)
        if ids is None:
            return Op("free_swa_many", lambda: self.obj.free_swa_many(tensor), expect="invalid")
        return Op("free_swa_many", lambda: self.obj.free_swa_many(tensor), lambda: self.model.free_swa_many(ids),
                  effect=effect)

    def swa_taken_all(self, slots):
        for slot in slots:
            self.ledger.swa_taken(slot)


# One compress type's pool through its own methods (upstream's coord.csa / coord.hca).
POOL_METHOD_OPS = [
    ("pool_reserve_slot", 1), ("pool_release_slot", 1), ("pool_alloc_swa", 1), ("pool_free_swa", 1),
    ("pool_claim_swa", 1), ("pool_has_free_swa", 0.3), ("pool_free_slots", 0.3),
]


class CoordinatorRun(Run):
    OPS = [
        ("alloc_swa", 8), ("free_swa", 8), ("claim_swa", 3), ("is_free_swa", 1), ("has_free_swa", 1),
        ("free_swa_slots", 0.5), ("alloc_swa_n", 3), ("free_swa_many", 3),
        ("alloc_compress", 10), ("free_compress", 10), ("has_free_compress", 1), ("free_compress_blocks", 0.5),
        ("alloc_compress_n", 4), ("free_compress_many", 4), ("can_allocate_jointly", 8),
        ("take_evicted_swa", 3), ("owner", 1), ("pool_slot_is_free", 1), ("counters", 0.5),
        ("check_invariants", 0.3), ("getters", 0.3), ("round_trip", 0.2), ("bad_call", 0.3),
    ]

    def __init__(self, seed, num_swa_base, ks, num_slots, block_size, borrow_unreleased_swa=False):
        ratios = [block_size // k for k in ks]  # the torch class names compress types by ratio
        if borrow_unreleased_swa:
            obj = torch.classes.ukv.Coordinator(num_swa_base, ratios, num_slots, block_size, borrow_unreleased_swa)
        else:  # the constructor call without the option
            obj = torch.classes.ukv.Coordinator(num_swa_base, ratios, num_slots, block_size)
        model = CoordinatorModel(num_swa_base, ks, num_slots, block_size, borrow_unreleased_swa)
        ledger = RowLedger(block_size, num_swa_base, ks, num_slots, coordinated=True,
                           lends_unreleased=borrow_unreleased_swa)
        super().__init__(seed, obj, model, ledger)
        if borrow_unreleased_swa:
            # SWA takes slots more rarely, so compress often runs out while
            # some SWA slots were never used: the lending path.
            self.SCALE = dict.fromkeys(["alloc_swa", "alloc_swa_n", "claim_swa"], 0.2)
        self.base, self.types = num_swa_base, len(ks)
        self.bps = [block_size // k for k in ks]
        self.type_slots = num_slots

    def pick_type(self):
        if self.types and self.rng.random() < 0.95:
            return self.rng.randrange(self.types)
        return self.rng.choice([-1, self.types])

    def valid_type(self, t):
        return 0 <= t < self.types

    def compress_ids(self, t):
        return self.type_slots[t] * self.bps[t] if self.valid_type(t) else 4

    def held(self, t):
        return self.ledger.compress_held[t] if self.valid_type(t) else IdBag()

    def boundary_n(self, t):
        """A compress count near the type's interesting boundaries."""
        if not self.valid_type(t):
            return random_n(self.rng, 1, 0)
        return random_n(self.rng, self.bps[t], self.model.free_compress_blocks(t))

    # --- SWA role ---
    def op_alloc_swa(self):
        return Op("alloc_swa", lambda: self.obj.alloc_swa(), self.model.alloc_swa, effect=self.ledger.swa_taken)

    def op_free_swa(self):
        slot = pick_id(self.rng, self.ledger.swa_held, self.base)
        return Op("free_swa", lambda: self.obj.free_swa(slot), lambda: self.model.free_swa(slot),
                  effect=lambda _: self.ledger.swa_freed(slot))

    def op_claim_swa(self):
        slot = self.rng.randrange(-1, self.base + 1)
        return Op("claim_swa", lambda: self.obj.claim_swa(slot), lambda: self.model.claim_swa(slot),
                  effect=lambda _: self.ledger.swa_taken(slot))

    def op_is_free_swa(self):
        slot = self.rng.randrange(-1, self.base + 1)
        return Op("is_free_swa", lambda: self.obj.is_free_swa(slot), lambda: self.model.is_free_swa(slot),
                  query=True)

    def op_has_free_swa(self):
        n = self.rng.randrange(-1, self.base + 2)
        return Op("has_free_swa", lambda: self.obj.has_free_swa(n), lambda: self.model.has_free_swa(n), query=True)

    def op_free_swa_slots(self):
        return Op("free_swa_slots", lambda: self.obj.free_swa_slots(), self.model.free_swa_slots, query=True)

    def op_alloc_swa_n(self):
        n = self.rng.choice([-1, 0, 1, 2, 3, self.base, self.base + 1])
        return Op("alloc_swa_n", lambda: self.obj.alloc_swa_n(n), lambda: self.model.alloc_swa_n(n),
                  effect=self.swa_taken_all)

    def op_free_swa_many(self):
        return self.swa_free_batch(self.base)

    # --- compress role ---
    def op_alloc_compress(self):
        t = self.pick_type()
        return Op("alloc_compress", lambda: self.obj.alloc_compress(t), lambda: self.model.alloc_compress(t),
                  effect=lambda phys: self.ledger.compress_taken(t, phys))

    def op_free_compress(self):
        t = self.pick_type()
        phys = pick_id(self.rng, self.held(t), self.compress_ids(t))
        return Op("free_compress", lambda: self.obj.free_compress(t, phys), lambda: self.model.free_compress(t, phys),
                  effect=lambda _: self.ledger.compress_freed(t, phys))

    def op_has_free_compress(self):
        t = self.pick_type()
        n = self.boundary_n(t)
        return Op("has_free_compress", lambda: self.obj.has_free_compress(t, n),
                  lambda: self.model.has_free_compress(t, n), query=True)

    def op_free_compress_blocks(self):
        t = self.pick_type()
        return Op("free_compress_blocks", lambda: self.obj.free_compress_blocks(t),
                  lambda: self.model.free_compress_blocks(t), query=True)

    def op_alloc_compress_n(self):
        t = self.pick_type()
        n = self.boundary_n(t)

        def effect(ids):
            for phys in ids:
                self.ledger.compress_taken(t, phys)
        return Op("alloc_compress_n", lambda: self.obj.alloc_compress_n(t, n),
                  lambda: self.model.alloc_compress_n(t, n), effect=effect)

    def op_free_compress_many(self):
        t = self.pick_type()
        tensor, ids = random_batch(self.rng, self.held(t), self.compress_ids(t))
        call = lambda: self.obj.free_compress_many(t, tensor)  # noqa: E731
        if ids is None:
            return Op("free_compress_many", call, expect="invalid")

        def effect(_):
            for phys in ids:
                self.ledger.compress_freed(t, phys)
        return Op("free_compress_many", call, lambda: self.model.free_compress_many(t, ids), effect=effect)

    # --- joint admission ---
    def op_can_allocate_jointly(self):
        free_swa = self.model.free_swa_slots()
        n_swa = self.rng.choice([0, 0, 1, 1, 2, 3, free_swa, free_swa + 1])
        demand = []
        for t in range(self.types):
            free = self.model.free_compress_blocks(t)
            demand.append(self.rng.choice([0, 0, 1, 2, self.bps[t], self.bps[t] + 1, free, free + 1,
                                           self.rng.randint(0, free + 1)]))
        if self.rng.random() < 0.05:  # a malformed request
            if demand and self.rng.random() < 0.5:
                demand[self.rng.randrange(len(demand))] = -1
            elif self.rng.random() < 0.5:
                n_swa = -1
            else:
                demand.append(0)

        def judge(actual):
            expected = model_outcome(lambda: self.model.joint_admission_bounds(n_swa, demand))
            if expected[0] != "ok":
                assert_same_outcome(expected, actual, "can_allocate_jointly")
                return
            assert actual[0] == "ok", f"can_allocate_jointly({n_swa}, {demand}): {actual}"
            must_admit, must_refuse = expected[1]
            assert not (must_admit and must_refuse)
            if actual[1]:
                assert not must_refuse, f"admitted ({n_swa}, {demand}), which no order can satisfy"
                self.keep_promise(n_swa, demand)
            else:
                assert not must_admit, f"refused ({n_swa}, {demand}), which cannot fail in any order"
        return Op("can_allocate_jointly", self.joint_admission_call(n_swa, demand), judge=judge, query=True)

    def joint_admission_call(self, n_swa, demand):
        return lambda: self.obj.can_allocate_jointly(n_swa, demand)

    def keep_promise(self, n_swa, demand):
        """An admitted demand succeeds in every order: check the extreme orders
        and two random ones on the model, and sometimes really allocate."""
        swa, compress = ["swa"] * n_swa, [t for t, d in enumerate(demand) for _ in range(d)]
        orders = [swa + compress, compress + swa, compress[::-1] + swa]
        for _ in range(2):
            mixed = swa + compress
            self.rng.shuffle(mixed)
            orders.append(mixed)
        for order in orders:
            assert self.model.allocations_succeed(order), f"admitted ({n_swa}, {demand}) fails in order {order}"
        if self.rng.random() < 0.3:
            self.promised.extend(self.promised_allocation(role) for role in orders[-1] if self.role_enabled(role))

    def role_enabled(self, role):
        """A disabled role (no SWA space, a pool of 0 slots) ignores its demand."""
        return self.base > 0 if role == "swa" else self.type_slots[role] > 0

    def promised_allocation(self, role):
        op = self.op_alloc_swa() if role == "swa" else self.op_alloc_compress_of(role)
        op.promised = True
        return op

    def op_alloc_compress_of(self, t):
        return Op("alloc_compress", lambda: self.obj.alloc_compress(t), lambda: self.model.alloc_compress(t),
                  effect=lambda phys: self.ledger.compress_taken(t, phys))

    # --- eviction, introspection, serialization ---
    def op_take_evicted_swa(self):
        return Op("take_evicted_swa", lambda: self.obj.take_evicted_swa(), self.model.take_evicted_swa)

    def op_owner(self):
        t, slot = self.pick_type(), self.rng.randrange(-1, max(self.type_slots, default=0) + 1)
        return Op("owner", lambda: self.obj.owner(t, slot), lambda: self.model.owner(t, slot), query=True)

    def op_pool_slot_is_free(self):
        t, slot = self.pick_type(), self.rng.randrange(-1, max(self.type_slots, default=0) + 1)
        return Op("pool_slot_is_free", lambda: self.obj.pool_slot_is_free(t, slot),
                  lambda: self.model.pool_slot_is_free(t, slot), query=True)

    def op_counters(self):
        return Op("counters", lambda: dict(self.obj.counters()), self.model.all_counters, query=True)

    # --- one type's pool through its own methods ---
    def pool_method(self, t, name):
        """The torch call of pool method `name` (reserve_slot, alloc_swa, free_slots, ...) of type t."""
        method = getattr(self.obj, "pool_" + name)
        return lambda *args: method(t, *args)

    def took(self, effect):
        """The effect of a call that may take a released shared slot (evictions are taken separately here)."""
        return effect

    def any_pool_slot(self, t):
        return self.rng.randrange(-1, (self.type_slots[t] if self.valid_type(t) else 2) + 1)

    def pool_held(self, t, held):
        """Mostly a slot of `held` (type t's own tenancies), else any slot."""
        slots = sorted(held[t]) if self.valid_type(t) else []
        return self.rng.choice(slots) if slots and self.rng.random() < 0.8 else self.any_pool_slot(t)

    def pool_op(self, t, name, *args, effect=None, query=False):
        """The Op of pool method `name` of type t, on the torch object and on the model."""
        return Op("pool_" + name, lambda: self.pool_method(t, name)(*args),
                  lambda: getattr(self.model, "pool_" + name)(t, *args), effect=effect, query=query)

    def pool_taking(self, name, reserved=False):
        """A call of type t's pool taking any slot (an SWA block, or a reservation)."""
        t = self.pick_type()
        slot = self.any_pool_slot(t)

        def effect(result):
            if result is not False:  # reserve_slot says False when the slot is not free
                self.ledger.pool_taken(t, slot, reserved)
        return self.pool_op(t, name, slot, effect=self.took(effect))

    def pool_giving_back(self, name, held, forget):
        """A call of type t's pool giving back mostly a slot of `held` (its own tenancies)."""
        t = self.pick_type()
        slot = self.pool_held(t, held)
        return self.pool_op(t, name, slot, effect=lambda _: forget(t, slot))

    def op_pool_reserve_slot(self):
        return self.pool_taking("reserve_slot", reserved=True)

    def op_pool_release_slot(self):
        return self.pool_giving_back("release_slot", self.ledger.pool_reserved, self.ledger.pool_released)

    def op_pool_alloc_swa(self):
        t = self.pick_type()
        return self.pool_op(t, "alloc_swa", effect=self.took(lambda slot: self.ledger.pool_taken(t, slot)))

    def op_pool_free_swa(self):
        return self.pool_giving_back("free_swa", self.ledger.pool_swa, self.ledger.pool_swa_freed)

    def op_pool_claim_swa(self):
        return self.pool_taking("claim_swa")

    def op_pool_has_free_swa(self):
        t = self.pick_type()
        n = self.rng.randrange(-1, (self.type_slots[t] if self.valid_type(t) else 2) + 2)
        return self.pool_op(t, "has_free_swa", n, query=True)

    def op_pool_free_slots(self):
        return self.pool_op(self.pick_type(), "free_slots", query=True)

    def op_getters(self):
        o, m = self.obj, self.model
        return Op("getters", lambda: (o.num_swa_base(), o.block_size(), o.num_types(), o.ks(), o.compress_ratios(),
                                      o.type_slots(), o.borrow_unreleased_swa()),
                  lambda: (m.num_swa_base, m.block_size, m.num_types(), m.ks(), m.compress_ratios(),
                           m.type_slots(), m.borrow_unreleased_swa), query=True)

    def op_bad_call(self):
        names = ["free_swa", "claim_swa", "alloc_compress", "is_free_swa", "free_swa_many", "alloc_swa_n"]
        return Op("bad_call", bad_call(self.rng, self.obj, names), expect="bad_call", query=True)

    # --- checks after every operation ---
    def check_all(self):
        obj, model, ledger = self.obj, self.model, self.ledger
        for t in range(self.types):
            for slot in range(self.type_slots[t]):
                assert obj.owner(t, slot) == ledger.expected_owner(t, slot), f"type {t} slot {slot}"
            assert obj.free_compress_blocks(t) == model.free_compress_blocks(t), f"type {t} free blocks"
            assert obj.pool_free_slots(t) == model.pools[t].free_slots(), f"type {t} free slots"
        for slot in range(self.base):
            assert obj.is_free_swa(slot) == ledger.expected_swa_free(slot), f"is_free_swa({slot})"
        assert obj.free_swa_slots() == model.free_swa_slots()


class DropInRun(CoordinatorRun):
    """The seed-compatible UnifiedKvCoordinator against the same model: its
    calls go through the drop-in, its evictions through the callback, which
    must have delivered exactly the model's evictions when each allocation
    returns. The checks after every operation read its torch object."""

    OPS = [
        ("alloc_swa", 8), ("free_swa", 8), ("claim_swa", 3), ("is_free_swa", 1), ("has_free_swa", 1),
        ("alloc_compress", 12), ("free_compress", 12), ("has_free_compress", 1),
        ("can_allocate_jointly", 3), ("round_trip", 0.2),
    ]

    def __init__(self, seed, num_swa_base, n_csa_slots, n_hca_slots):
        super().__init__(seed, num_swa_base, [32, 1], [n_csa_slots, n_hca_slots], 128)
        self.drop_in = UnifiedKvCoordinator(num_swa_base, n_csa_slots, n_hca_slots)
        self.delivered = []
        self.drop_in.set_swa_evict_cb(self.delivered.append)
        self.obj = self.drop_in.torch_object

    def pick_type(self):
        return self.rng.randrange(2)

    @staticmethod
    def upstream_allocation(call):
        """A drop-in allocation: exhaustion must be OutOfSlots."""
        def checked(*args):
            try:
                return call(*args)
            except RuntimeError as exc:
                assert not str(exc).startswith("No free") or isinstance(exc, OutOfSlots), exc
                raise
        return checked

    def delivered_then(self, effect):
        """After a successful allocation: the callback has already delivered
        exactly the evictions the model made, nothing later can have added any."""
        def checked(value):
            assert self.delivered == self.model.take_evicted_swa(), "evictions not delivered before return"
            self.delivered.clear()
            effect(value)
        return checked

    def op_alloc_swa(self):
        return Op("alloc_swa", self.upstream_allocation(lambda: self.drop_in.alloc_swa()), self.model.alloc_swa,
                  effect=self.ledger.swa_taken)

    def op_free_swa(self):
        slot = pick_id(self.rng, self.ledger.swa_held, self.base)
        return Op("free_swa", lambda: self.drop_in.free_swa(slot), lambda: self.model.free_swa(slot),
                  effect=lambda _: self.ledger.swa_freed(slot))

    def op_claim_swa(self):
        slot = self.rng.randrange(-1, self.base + 1)
        return Op("claim_swa", lambda: self.drop_in.claim_swa(slot), lambda: self.model.claim_swa(slot),
                  effect=lambda _: self.ledger.swa_taken(slot))

    def op_is_free_swa(self):
        slot = self.rng.randrange(-1, self.base + 1)
        return Op("is_free_swa", lambda: self.drop_in.is_free_swa(slot), lambda: self.model.is_free_swa(slot),
                  query=True)

    def op_has_free_swa(self):
        n = self.rng.randrange(-1, self.base + 2)
        return Op("has_free_swa", lambda: self.drop_in.has_free_swa(n), lambda: self.model.has_free_swa(n),
                  query=True)

    def op_alloc_compress_of(self, t):
        alloc = (self.drop_in.alloc_csa, self.drop_in.alloc_hca)[t]
        return Op("alloc_compress", self.upstream_allocation(alloc), lambda: self.model.alloc_compress(t),
                  effect=self.delivered_then(lambda phys: self.ledger.compress_taken(t, phys)))

    def op_alloc_compress(self):
        return self.op_alloc_compress_of(self.pick_type())

    def op_free_compress(self):
        t = self.pick_type()
        phys = pick_id(self.rng, self.held(t), self.compress_ids(t))
        free = (self.drop_in.free_csa, self.drop_in.free_hca)[t]
        return Op("free_compress", lambda: free(phys), lambda: self.model.free_compress(t, phys),
                  effect=lambda _: self.ledger.compress_freed(t, phys))

    def op_has_free_compress(self):
        t = self.pick_type()
        n = self.boundary_n(t)
        has_free = (self.drop_in.has_free_csa, self.drop_in.has_free_hca)[t]
        return Op("has_free_compress", lambda: has_free(n), lambda: self.model.has_free_compress(t, n), query=True)

    def joint_admission_call(self, n_swa, demand):
        if len(demand) != 2:  # a malformed demand has no drop-in spelling
            return super().joint_admission_call(n_swa, demand)
        return lambda: self.drop_in.can_allocate_jointly(n_swa, *demand)

    # --- the pools coord.csa / coord.hca (PoolMethodsDropInRun) ---
    POOL_NAMES = {"free_slots": "num_free_slots"}  # the drop-in pools' names of the torch pool_* methods

    def pool_method(self, t, name):
        pool = (self.drop_in.csa, self.drop_in.hca)[t]
        return self.upstream_allocation(getattr(pool, self.POOL_NAMES.get(name, name)))

    def took(self, effect):
        return self.delivered_then(effect)

    def op_pool_alloc_compress(self):
        t = self.pick_type()
        return Op("pool_alloc_compress", self.pool_method(t, "alloc_compress"), lambda: self.model.alloc_compress(t),
                  effect=self.delivered_then(lambda phys: self.ledger.compress_taken(t, phys)))

    def op_pool_free_compress(self):
        t = self.pick_type()
        phys = pick_id(self.rng, self.held(t), self.compress_ids(t))
        return Op("pool_free_compress", lambda: self.pool_method(t, "free_compress")(phys),
                  lambda: self.model.free_compress(t, phys), effect=lambda _: self.ledger.compress_freed(t, phys))

    def op_round_trip(self):
        def replace(_):
            clone = copy.deepcopy(self.drop_in)  # shares the callback, which appends to self.delivered
            assert clone.torch_object.__getstate__() == self.obj.__getstate__()
            self.drop_in, self.obj = clone, clone.torch_object
        return Op("round_trip", lambda: None, lambda: None, effect=replace)


class PoolMethodsRun(CoordinatorRun):
    """CoordinatorRun with the pool methods of each compress type mixed in."""

    OPS = CoordinatorRun.OPS + POOL_METHOD_OPS
    ALLOCS = Run.ALLOCS | {"pool_alloc_swa", "pool_claim_swa", "pool_reserve_slot"}
    FREES = Run.FREES | {"pool_free_swa", "pool_release_slot"}


class PoolMethodsDropInRun(DropInRun):
    """DropInRun with the methods of its pools coord.csa / coord.hca mixed in."""

    OPS = DropInRun.OPS + POOL_METHOD_OPS + [("pool_alloc_compress", 2), ("pool_free_compress", 2)]
    ALLOCS = PoolMethodsRun.ALLOCS | {"pool_alloc_compress"}
    FREES = PoolMethodsRun.FREES | {"pool_free_compress"}


class PoolRun(Run):
    OPS = [
        ("reserve_slot", 2), ("release_slot", 2), ("slot_is_free", 1), ("owner", 1),
        ("alloc_swa", 6), ("free_swa", 6), ("claim_swa", 2), ("is_free_swa", 1), ("has_free_swa", 1),
        ("alloc_swa_n", 2), ("free_swa_many", 2),
        ("alloc_compress", 10), ("free_compress", 10), ("has_free_compress", 1),
        ("alloc_compress_n", 4), ("free_compress_many", 4),
        ("free_slots", 0.5), ("free_compress_blocks", 0.5), ("counters", 0.5),
        ("check_invariants", 0.3), ("getters", 0.3), ("round_trip", 0.2), ("bad_call", 0.3),
    ]

    def __init__(self, seed, num_slots, k, block_size, shared_slots):
        obj = torch.classes.ukv.TypePool(num_slots, block_size // k if k else 0, block_size, shared_slots)
        model = PoolModel(num_slots, k, block_size, shared_slots)
        # A k = 0 pool has no compress blocks; its ledger tensor still needs a k.
        ledger = RowLedger(block_size, num_slots, [k or block_size], [num_slots], coordinated=False)
        super().__init__(seed, obj, model, ledger)
        self.n, self.bps = num_slots, model.blocks_per_slot
        self.compress_ids = num_slots * max(self.bps, 1)

    def any_slot(self):
        return self.rng.randrange(-1, self.n + 1)

    def op_reserve_slot(self):
        slot = self.any_slot()

        def effect(reserved):
            if reserved:
                self.ledger.reserved.add(slot)
        return Op("reserve_slot", lambda: self.obj.reserve_slot(slot), lambda: self.model.reserve_slot(slot),
                  effect=effect)

    def op_release_slot(self):
        reserved = sorted(self.ledger.reserved)
        slot = self.rng.choice(reserved) if reserved and self.rng.random() < 0.7 else self.any_slot()
        return Op("release_slot", lambda: self.obj.release_slot(slot), lambda: self.model.release_slot(slot),
                  effect=lambda _: self.ledger.reserved.discard(slot))

    def op_slot_is_free(self):
        slot = self.any_slot()
        return Op("slot_is_free", lambda: self.obj.slot_is_free(slot), lambda: self.model.slot_is_free(slot),
                  query=True)

    def op_owner(self):
        slot = self.any_slot()
        return Op("owner", lambda: self.obj.owner(slot), lambda: self.model.owner(slot), query=True)

    def op_alloc_swa(self):
        return Op("alloc_swa", lambda: self.obj.alloc_swa(), self.model.alloc_swa, effect=self.ledger.swa_taken)

    def op_free_swa(self):
        slot = pick_id(self.rng, self.ledger.swa_held, self.n)
        return Op("free_swa", lambda: self.obj.free_swa(slot), lambda: self.model.free_swa(slot),
                  effect=lambda _: self.ledger.swa_freed(slot))

    def op_claim_swa(self):
        slot = self.any_slot()
        return Op("claim_swa", lambda: self.obj.claim_swa(slot), lambda: self.model.claim_swa(slot),
                  effect=lambda _: self.ledger.swa_taken(slot))

    def op_is_free_swa(self):
        slot = self.any_slot()
        return Op("is_free_swa", lambda: self.obj.is_free_swa(slot), lambda: self.model.is_free_swa(slot),
                  query=True)

    def op_has_free_swa(self):
        n = self.rng.randrange(-1, self.n + 2)
        return Op("has_free_swa", lambda: self.obj.has_free_swa(n), lambda: self.model.has_free_swa(n), query=True)

    def op_alloc_swa_n(self):
        n = self.rng.choice([-1, 0, 1, 2, self.n, self.n + 1])
        return Op("alloc_swa_n", lambda: self.obj.alloc_swa_n(n), lambda: self.model.alloc_swa_n(n),
                  effect=self.swa_taken_all)

    def op_free_swa_many(self):
        return self.swa_free_batch(self.n)

    def op_alloc_compress(self):
        return Op("alloc_compress", lambda: self.obj.alloc_compress(), self.model.alloc_compress,
                  effect=lambda phys: self.ledger.compress_taken(0, phys))

    def op_free_compress(self):
        phys = pick_id(self.rng, self.ledger.compress_held[0], self.compress_ids)
        return Op("free_compress", lambda: self.obj.free_compress(phys), lambda: self.model.free_compress(phys),
                  effect=lambda _: self.ledger.compress_freed(0, phys))

    def op_has_free_compress(self):
        n = random_n(self.rng, max(self.bps, 1), self.model.free_compress_blocks())
        return Op("has_free_compress", lambda: self.obj.has_free_compress(n),
                  lambda: self.model.has_free_compress(n), query=True)

    def op_alloc_compress_n(self):
        n = random_n(self.rng, max(self.bps, 1), self.model.free_compress_blocks())

        def effect(ids):
            for phys in ids:
                self.ledger.compress_taken(0, phys)
        return Op("alloc_compress_n", lambda: self.obj.alloc_compress_n(n), lambda: self.model.alloc_compress_n(n),
                  effect=effect)

    def op_free_compress_many(self):
        tensor, ids = random_batch(self.rng, self.ledger.compress_held[0], self.compress_ids)
        call = lambda: self.obj.free_compress_many(tensor)  # noqa: E731
        if ids is None:
            return Op("free_compress_many", call, expect="invalid")

        def effect(_):
            for phys in ids:
                self.ledger.compress_freed(0, phys)
        return Op("free_compress_many", call, lambda: self.model.free_compress_many(ids), effect=effect)

    def op_free_slots(self):
        return Op("free_slots", lambda: self.obj.free_slots(), self.model.free_slots, query=True)

    def op_free_compress_blocks(self):
        return Op("free_compress_blocks", lambda: self.obj.free_compress_blocks(), self.model.free_compress_blocks,
                  query=True)

    def op_counters(self):
        return Op("counters", lambda: dict(self.obj.counters()), lambda: dict(self.model.counters), query=True)

    def op_getters(self):
        o, m = self.obj, self.model
        return Op("getters", lambda: (o.num_slots(), o.k(), o.compress_ratio(), o.block_size(), o.shared_slots(),
                                      o.blocks_per_slot()),
                  lambda: (m.num_slots, m.k, m.compress_ratio, m.block_size, m.shared_slots, m.blocks_per_slot),
                  query=True)

    def op_bad_call(self):
        names = ["reserve_slot", "free_swa", "claim_swa", "free_compress", "free_compress_many", "alloc_compress_n"]
        return Op("bad_call", bad_call(self.rng, self.obj, names), expect="bad_call", query=True)

    def check_all(self):
        obj, model, ledger = self.obj, self.model, self.ledger
        for slot in range(self.n):
            assert obj.owner(slot) == ledger.expected_owner(0, slot), f"slot {slot}"
        assert obj.free_slots() == model.free_slots()
        assert obj.free_compress_blocks() == model.free_compress_blocks()


# --------------------------------------------------------------------------
# The runs: fixed seeds, several shapes, >= 100,000 operations in all

COORDINATOR_SHAPES = {
    # name: (num_swa_base, ks, num_slots, block_size), (runs, operations per run)
    "v4_pair": ((4, [32, 1], [6, 5], 128), (4, 5_000)),
    "block256_three_types": ((3, [32, 1, 256], [5, 4, 4], 256), (4, 4_000)),
    "no_own_region": ((3, [128, 64], [3, 3], 128), (4, 3_000)),
    "three_types_no_own_region": ((3, [128, 128, 64], [3, 3, 4], 128), (2, 3_000)),
    "pools_of_one_slot": ((1, [2, 8], [1, 1], 8), (2, 3_000)),
    "swa_disabled": ((0, [4, 16], [3, 2], 16), (1, 5_000)),
    "pools_of_zero_slots": ((0, [32, 1], [0, 0], 128), (1, 2_000)),
    "swa_only": ((5, [], [], 128), (1, 4_000)),
}

POOL_SHAPES = {
    # name: (num_slots, k, block_size, shared_slots), (runs, operations per run)
    "csa": ((6, 32, 128, 2), (2, 5_000)),
    "hca_block256": ((4, 1, 256, 1), (2, 4_000)),
    "swa_only_k0": ((5, 0, 128, 2), (1, 5_000)),
    "one_block_per_slot": ((4, 128, 128, 4), (1, 5_000)),
    "one_slot": ((1, 4, 16, 0), (1, 3_000)),
    "zero_slots": ((0, 32, 128, 0), (1, 2_000)),
}

DROP_IN_SHAPES = {
    # name: (num_swa_base, n_csa_slots, n_hca_slots), (runs, operations per run)
    "v4_pair": ((4, 6, 5), (2, 3_000)),
    "no_own_region": ((3, 3, 3), (2, 3_000)),
}

POOL_METHOD_SHAPES = {
    # Coordinator shapes whose runs mix in the pool methods: (runs, operations per run) as above
    "v4_pair": ((4, [32, 1], [6, 5], 128), (2, 3_000)),
    "no_own_region": ((3, [128, 64], [3, 3], 128), (2, 3_000)),
    "pools_of_one_slot": ((1, [2, 8], [1, 1], 8), (2, 2_000)),
}

BORROW_MODES = {"upstream_borrowing": False, "borrow_unreleased": True}

COORDINATOR_OPERATIONS = sum(runs * ops for _, (runs, ops) in COORDINATOR_SHAPES.values())
TOTAL_OPERATIONS = (COORDINATOR_OPERATIONS * len(BORROW_MODES) +
                    sum(runs * ops for _, (runs, ops) in [*POOL_SHAPES.values(), *DROP_IN_SHAPES.values()]))


def test_the_runs_total_at_least_100k_operations():
    assert TOTAL_OPERATIONS - COORDINATOR_OPERATIONS >= 100_000  # without the option
    assert COORDINATOR_OPERATIONS >= 50_000  # the Coordinator with it


def assert_coverage(outcomes, ops, must_succeed, must_refuse):
    seen_ops = {op for op, _ in outcomes}
    assert {name for name, _ in ops} <= seen_ops
    for op in must_succeed:
        assert outcomes[op, "ok"] > 0, f"{op} never succeeded"
    for op, kind in must_refuse:
        assert outcomes[op, kind] > 0, f"{op} was never refused as {kind}"


def run_all(make_run, name, runs, ops):
    """Several independent runs (fresh objects, distinct fixed seeds): short
    runs from a fresh state reach more distinct states than one long run."""
    outcomes = Counter()
    for i in range(runs):
        run = make_run(f"{name}/{i}")
        outcomes += run.run(ops)
        run.obj.check_invariants()
    return outcomes, run


@pytest.mark.parametrize("mode", sorted(BORROW_MODES))
@pytest.mark.parametrize("name", sorted(COORDINATOR_SHAPES))
def test_coordinator_matches_model(name, mode):
    (base, ks, slots, bs), (runs, ops) = COORDINATOR_SHAPES[name]
    borrow_unreleased = BORROW_MODES[mode]
    if borrow_unreleased:  # more fresh starts: lending needs SWA slots never used yet
        runs, ops = runs * 4, ops // 4
    made = []

    def make_run(seed):
        made.append(CoordinatorRun(seed, base, ks, slots, bs, borrow_unreleased))
        return made[-1]
    outcomes, _ = run_all(make_run, f"{name}/{mode}" if borrow_unreleased else name, runs, ops)
    refusals = [("free_swa", "invalid"), ("free_swa_many", "invalid"), ("alloc_compress", "invalid"),
                ("bad_call", "bad_call")]
    succeed = ["take_evicted_swa", "round_trip", "counters"]
    if base:
        refusals += [("alloc_swa", "exhausted"), ("free_swa", "state"), ("claim_swa", "state"),
                     ("free_swa_many", "state")]
        succeed += ["alloc_swa", "free_swa", "claim_swa", "free_swa_many", "alloc_swa_n"]
    if ks and all(slots):
        refusals += [("alloc_compress", "exhausted"), ("free_compress", "state"), ("free_compress_many", "state"),
                     ("alloc_compress_n", "exhausted")]
        succeed += ["alloc_compress", "free_compress", "alloc_compress_n", "free_compress_many"]
    assert_coverage(outcomes, CoordinatorRun.OPS, succeed, refusals)
    if base and ks:
        counters = sum((Counter(r.model.all_counters()) for r in made), Counter())  # over all runs
        assert counters["swa_evictions"] > 0 and sum(counters[f"type{t}_borrows"] for t in range(len(ks))) > 0
        assert outcomes["promised allocation", "ok"] > 0
        assert (counters["unreleased_borrows"] > 0) == borrow_unreleased


@pytest.mark.parametrize("name", sorted(DROP_IN_SHAPES))
def test_drop_in_coordinator_matches_model(name):
    shape, (runs, ops) = DROP_IN_SHAPES[name]
    outcomes, run = run_all(lambda seed: DropInRun(seed, *shape), "drop_in/" + name, runs, ops)
    assert_coverage(outcomes, DropInRun.OPS, ["alloc_swa", "free_swa", "claim_swa", "alloc_compress", "free_compress"],
                    [("alloc_swa", "exhausted"), ("alloc_compress", "exhausted"), ("free_swa", "state"),
                     ("free_compress", "state"), ("free_compress", "invalid")])
    assert run.model.counters["swa_evictions"] > 0 and outcomes["promised allocation", "ok"] > 0


POOL_METHODS_MUST_SUCCEED = ["pool_reserve_slot", "pool_release_slot", "pool_alloc_swa", "pool_free_swa",
                             "pool_claim_swa", "pool_has_free_swa", "pool_free_slots"]
POOL_METHODS_MUST_REFUSE = [("pool_release_slot", "state"), ("pool_free_swa", "state"), ("pool_claim_swa", "state"),
                            ("pool_alloc_swa", "exhausted"), ("pool_free_swa", "invalid")]


@pytest.mark.parametrize("mode", sorted(BORROW_MODES))
@pytest.mark.parametrize("name", sorted(POOL_METHOD_SHAPES))
def test_coordinator_pool_methods_match_model(name, mode):
    """Each type's pool used through its own methods among every other call:
    the model's ids and refusals, SWA's free list and evictions exact, no row
    range held by two roles."""
    (base, ks, slots, bs), (runs, ops) = POOL_METHOD_SHAPES[name]
    made = []

    def make_run(seed):
        made.append(PoolMethodsRun(seed, base, ks, slots, bs, BORROW_MODES[mode]))
        return made[-1]
    outcomes, _ = run_all(make_run, f"pool_methods/{name}/{mode}", runs, ops)
    assert_coverage(outcomes, PoolMethodsRun.OPS, POOL_METHODS_MUST_SUCCEED, POOL_METHODS_MUST_REFUSE)
    counters = sum((Counter(r.model.all_counters()) for r in made), Counter())
    assert counters["swa_evictions"] > 0


@pytest.mark.parametrize("name", sorted(DROP_IN_SHAPES))
def test_drop_in_pools_match_model(name):
    """The same through coord.csa / coord.hca of the drop-in, evictions delivered before each call returns."""
    shape, (runs, ops) = DROP_IN_SHAPES[name]
    outcomes, run = run_all(lambda seed: PoolMethodsDropInRun(seed, *shape), "drop_in_pools/" + name, runs, ops)
    assert_coverage(outcomes, PoolMethodsDropInRun.OPS,
                    POOL_METHODS_MUST_SUCCEED + ["pool_alloc_compress", "pool_free_compress"],
                    POOL_METHODS_MUST_REFUSE + [("pool_free_compress", "state"), ("pool_alloc_compress", "exhausted")])
    assert run.model.counters["swa_evictions"] > 0


@pytest.mark.parametrize("name", sorted(POOL_SHAPES))
def test_type_pool_matches_model(name):
    (n, k, bs, shared), (runs, ops) = POOL_SHAPES[name]
    outcomes, run = run_all(lambda seed: PoolRun(seed, n, k, bs, shared), name, runs, ops)
    refusals = [("free_swa", "invalid"), ("free_compress", "invalid"), ("bad_call", "bad_call")]
    succeed = ["round_trip", "counters"]
    if n:
        refusals += [("alloc_swa", "exhausted"), ("free_swa", "state"), ("claim_swa", "state"),
                     ("release_slot", "state")]
        succeed += ["alloc_swa", "free_swa", "reserve_slot", "release_slot", "alloc_swa_n", "free_swa_many"]
    if n and k:
        refusals += [("alloc_compress", "exhausted"), ("free_compress", "state"), ("free_compress_many", "state")]
        succeed += ["alloc_compress", "free_compress", "alloc_compress_n", "free_compress_many"]
    assert_coverage(outcomes, PoolRun.OPS, succeed, refusals)
    if n and k and 0 < shared < n:
        assert run.model.counters["borrows"] > 0
