"""HostTier against a dict-and-list model of an LRU byte store, and the
construction errors of HostTier and TierCache (naming the argument, nothing
half-made)."""
import random
from collections import OrderedDict

import pytest
import torch

from ukv_torch.tiers import HostTier, TierCache

from support.tier_engine import TierEngine, host


def registered(tier, size=4096):
    buf = torch.zeros(size, dtype=torch.uint8)
    tier.register_buffer(buf)
    return buf


def test_lru_eviction_against_a_model():
    rng = random.Random(0)
    tier = HostTier(1000, pinned=False)
    buf = registered(tier)
    model = OrderedDict()  # key -> bytes, least recently used first
    for i in range(2000):
        key = f"k{rng.randrange(40)}"
        if rng.random() < 0.5:
            size = rng.randrange(1, 300)
            data = bytes(rng.randrange(256) for _ in range(size))
            buf[:size] = torch.tensor(list(data), dtype=torch.uint8)
            assert tier.put([key], [buf[:size]]) == [True]
            if key in model:
                model.move_to_end(key)
            else:
                while sum(map(len, model.values())) + size > 1000:
                    model.popitem(last=False)
                model[key] = data
        else:
            got = tier.get([key], [buf[:300]])[0]
            if key in model:
                model.move_to_end(key)
                assert got == len(model[key]) and bytes(buf[:got].tolist()) == model[key]
            else:
                assert got == -1
        assert tier.contains(list(model)) == [True] * len(model)
        assert tier.stats()["bytes_used"] == sum(map(len, model.values()))


def test_answers_for_what_does_not_fit():
    tier = HostTier(100, pinned=False)
    buf = registered(tier)
    assert tier.put(["big"], [buf[:101]]) == [False]
    assert tier.put(["a"], [buf[:50]]) == [True]
    assert tier.get(["a"], [buf[:49]]) == [-1]  # the buffer is too small
    assert tier.get(["missing"], [buf[:100]]) == [-1]


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, "1"])
def test_a_bad_capacity_names_the_argument(capacity):
    with pytest.raises(ValueError, match="capacity_bytes"):
        HostTier(capacity)


def test_buffers_must_be_registered_host_bytes():
    tier = HostTier(100, pinned=False)
    with pytest.raises(ValueError, match="register_buffer"):
        tier.put(["a"], [torch.zeros(4, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="uint8"):
        tier.register_buffer(torch.zeros(4, dtype=torch.int32))
    buf = registered(tier)
    with pytest.raises(ValueError, match="2 buffers"):
        tier.get(["a"], [buf[:1], buf[1:2]])


def test_a_tier_too_small_for_one_object_is_refused_before_anything_is_made():
    engine = TierEngine("static", [host()])
    largest = max(engine.tiers.layout.object_bytes(k) for k in (0, 1))
    small = HostTier(largest - 1, pinned=False)
    with pytest.raises(ValueError, match=r"capacity_bytes=\d+ is smaller than one tier object"):
        TierCache(engine.plan, engine.kv, [host(), small])
    assert small._registered == []  # no buffer was registered with it
    with pytest.raises(ValueError, match="staging_bytes"):
        TierCache(engine.plan, engine.kv, [host()], staging_bytes=largest)
    with pytest.raises(ValueError, match="backends"):
        TierCache(engine.plan, engine.kv, [])
