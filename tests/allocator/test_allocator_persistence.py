"""The allocator objects as values: pickling (pickle, copy.deepcopy,
torch.save / torch.load) continues identically, the same calls give the same
ids in two instances and in another process, inconsistent states are refused,
and the registered fake classes let a module holding the objects be traced."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch._library.fake_class_registry import find_fake_class, has_fake_class, maybe_to_fake_obj
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import support
import ukv_torch
from support.churn import churn
from support.copies import COPY_WAYS, copy_by
from ukv_torch import UnifiedKvCoordinator, UnifiedTypePool

QUALNAMES = {"TypePool": "__torch__.torch.classes.ukv.TypePool", "Coordinator": "__torch__.torch.classes.ukv.Coordinator"}


def state_of(obj):
    return getattr(obj, "torch_object", obj).__getstate__()


FRONT_ENDS = {
    "torch_type_pool": lambda: torch.classes.ukv.TypePool(6, 4, 128, 2),
    "torch_coordinator": lambda: torch.classes.ukv.Coordinator(4, [4, 128, 16], [6, 5, 6], 128),
    "drop_in_type_pool": lambda: UnifiedTypePool(6, 32),
    "drop_in_coordinator": lambda: UnifiedKvCoordinator(4, 6, 5),
}


@pytest.mark.parametrize("how", COPY_WAYS)
@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_a_copy_continues_exactly_like_the_original(front_end, how):
    original = FRONT_ENDS[front_end]()
    churn(original, seed=1, steps=400)
    clone = copy_by(how, original)
    assert state_of(clone) == state_of(original)
    assert churn(clone, seed=2, steps=400) == churn(original, seed=2, steps=400)
    assert state_of(clone) == state_of(original)
    churn(clone, seed=3, steps=50)  # the copy is independent of the original
    assert state_of(clone) != state_of(original)


def test_a_copied_drop_in_coordinator_keeps_delivering_evictions():
    c = UnifiedKvCoordinator(1, 1, 1)
    c.free_swa(c.alloc_swa())
    clone = copy.deepcopy(c)
    seen = []
    clone.set_swa_evict_cb(seen.append)
    clone.alloc_csa()
    assert seen == [0]


@pytest.mark.parametrize("name, make", [
    ("TypePool", lambda: torch.classes.ukv.TypePool(3, 4, 128, 1)),
    ("Coordinator", lambda: torch.classes.ukv.Coordinator(2, [4, 128], [3, 3], 128)),
])
def test_inconsistent_states_are_refused_on_unpickling(name, make):
    obj = make()
    obj.alloc_compress(0) if name == "Coordinator" else obj.alloc_compress()
    state, qualname = obj.__getstate__()

    def unpickle(values):  # what pickle.loads does with the object's reduction
        fresh = torch.ScriptObject.__new__(torch.ScriptObject)
        fresh.__setstate__((values, qualname))
        return fresh

    assert unpickle(list(state)).__getstate__() == (state, qualname)
    with pytest.raises(ValueError, match="state is truncated"):
        unpickle(state[:-1])
    with pytest.raises(ValueError, match="trailing values"):
        unpickle(state + [0])
    # Slot 0's owner (free in the pool, reserved in the coordinator's first
    # pool), claimed as compress-held: after the format header (3 values) and
    # the TypePool's sizes (4 values), or after the format header, the
    # Coordinator's sizes (4 + 2 per type) and its first pool's sizes.
    slot0_owner = 3 + 4 if name == "TypePool" else 3 + 4 + 2 * 2 + 4
    tampered = list(state)
    tampered[slot0_owner] = 3
    with pytest.raises(ValueError, match="state is inconsistent"):
        unpickle(tampered)
    # The format header: a state without one, of another kind or of another version is refused.
    with pytest.raises(ValueError, match="has no format header"):
        unpickle(state[3:])
    other_kind = list(state)
    other_kind[1] = 3 - other_kind[1]  # TypePool (1) <-> Coordinator (2)
    with pytest.raises(ValueError, match="not of a " + name):
        unpickle(other_kind)
    other_version = list(state)
    other_version[2] += 1
    with pytest.raises(ValueError, match="format version"):
        unpickle(other_version)


def test_two_instances_given_the_same_calls_give_the_same_ids():
    a, b = (torch.classes.ukv.Coordinator(64, [4, 128], [80, 66], 128) for _ in range(2))
    assert churn(a, seed=7, steps=5000) == churn(b, seed=7, steps=5000)
    assert a.__getstate__() == b.__getstate__()


def test_another_process_gives_the_same_ids():
    script = (
        "import json, sys, torch, ukv_torch\n"
        "from support.churn import churn\n"
        "c = torch.classes.ukv.Coordinator(64, [4, 128], [80, 66], 128)\n"
        "print(json.dumps([churn(c, seed=7, steps=3000), c.__getstate__()[0]]))\n"
    )
    # The child imports the ukv_torch this process imported, and the support package.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(ukv_torch.__file__)))
    tests_root = os.path.dirname(os.path.dirname(os.path.abspath(support.__file__)))
    env = dict(os.environ, PYTHONHASHSEED="12345")  # hash order differs from this process's
    env["PYTHONPATH"] = os.pathsep.join([package_root, tests_root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True).stdout
    here = torch.classes.ukv.Coordinator(64, [4, 128], [80, 66], 128)
    assert json.loads(out) == [churn(here, seed=7, steps=3000), here.__getstate__()[0]]


# --------------------------------------------------------------------------
# Fake classes


@pytest.mark.parametrize("name", sorted(QUALNAMES))
def test_fake_classes_are_registered(name):
    assert has_fake_class(QUALNAMES[name])


@pytest.mark.parametrize("name, make", [
    ("TypePool", lambda: torch.classes.ukv.TypePool(3, 4, 128, 1)),
    ("Coordinator", lambda: torch.classes.ukv.Coordinator(2, [4, 128], [3, 3], 128)),
])
def test_flatten_and_unflatten_carry_the_exact_state(name, make):
    obj = make()
    obj.alloc_swa()
    flat = obj.__obj_flatten__()
    assert [key for key, _ in flat] == ["state"]
    assert flat[0][1].dtype == torch.int64 and flat[0][1].tolist() == obj.__getstate__()[0]
    fake = find_fake_class(QUALNAMES[name]).__obj_unflatten__(flat)
    assert torch.equal(fake.state, flat[0][1])
    with FakeTensorMode() as mode:  # what export and compile do with a real object
        traced = maybe_to_fake_obj(mode, obj)
    assert traced.script_class_name == QUALNAMES[name]
    assert isinstance(traced.wrapped_obj.state, FakeTensor) and traced.wrapped_obj.state.shape == flat[0][1].shape


class HoldsAllocators(torch.nn.Module):
    """A model-side module keeping allocator objects as attributes; its forward
    is plain tensor code (host allocation never runs inside a traced graph)."""

    def __init__(self):
        super().__init__()
        self.pool = torch.classes.ukv.TypePool(3, 4, 128, 1)
        self.coordinator = torch.classes.ukv.Coordinator(2, [4, 128], [3, 3], 128)

    def forward(self, x):
        return x * 2 + 1


@pytest.mark.parametrize("strict", [False, True])
def test_a_module_holding_allocator_objects_exports(strict):
    module = HoldsAllocators()
    before = module.coordinator.__getstate__()
    exported = torch.export.export(module, (torch.ones(3),), strict=strict)
    assert torch.equal(exported.module()(torch.arange(3.0)), module(torch.arange(3.0)))
    assert module.coordinator.__getstate__() == before


def test_a_module_holding_allocator_objects_compiles():
    module = HoldsAllocators()
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.arange(3.0)), module(torch.arange(3.0)))
