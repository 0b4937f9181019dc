"""HostTier against a dict-and-list model of an LRU byte store, and the
construction errors of HostTier and TierCache (naming the argument, nothing
half-made)."""
import random
from collections import OrderedDict

import pytest
import torch

from ukv_torch.tiers import HostTier, TierCache
from ukv_torch.tiers.staging import aligned

from support.tier_engine import TierEngine, host


def registered(tier, size=4096):
    buf = torch.zeros(size, dtype=torch.uint8)
    tier.register_buffer(buf)
    return buf


def padded(n):
    """n bytes rounded up to whole 64-byte units."""
    return -(-n // 64) * 64


class ArenaModel:
    """An LRU store of byte strings in `capacity` bytes: each lies at the lowest
    64-byte boundary where its size rounded up to 64 bytes is free, and the
    least recently used go, one by one, until a new one fits. A reserved
    object holds its range, invisible and never evicted, until committed
    (stored) or given back."""

    def __init__(self, capacity):
        self.free = [True] * (capacity // 64 * 64)
        self.objects = OrderedDict()  # key -> (start, bytes), least recently used first
        self.reserved = {}  # key -> (start, size)

    def room(self, size):
        need = padded(size)
        while (start := self.first_fit(need)) is None:
            if not self.objects:
                return None
            _, (old_start, old) = self.objects.popitem(last=False)
            self.release(old_start, len(old))
        self.free[start: start + need] = [False] * need
        return start

    def release(self, start, size):
        self.free[start: start + padded(size)] = [True] * padded(size)

    def put(self, key, data):
        if key in self.objects:
            self.objects.move_to_end(key)
            return True
        start = None if key in self.reserved else self.room(len(data))
        if start is not None:
            self.objects[key] = (start, data)
        return start is not None

    def reserve(self, key, size):
        start = None if key in self.objects or key in self.reserved else self.room(size)
        if start is not None:
            self.reserved[key] = (start, size)
        return start is not None

    def commit(self, key, data):
        start, size = self.reserved.pop(key)
        if data is None:
            self.release(start, size)
        else:
            self.objects[key] = (start, data)

    def first_fit(self, need):
        return next((s for s in range(0, len(self.free) - need + 1, 64) if all(self.free[s: s + need])), None)


def test_lru_eviction_against_a_model():
    rng = random.Random(0)
    tier = HostTier(1000, pinned=False)
    buf = registered(tier)
    model = ArenaModel(1000)
    keys = [f"k{i}" for i in range(40)]
    views = {}  # reserved key -> (view, data)
    for i in range(3000):
        key, what = rng.choice(keys), rng.random()
        size = rng.randrange(1, 300)
        data = bytes(rng.randrange(256) for _ in range(size))
        if what < 0.3:
            buf[:size] = torch.tensor(list(data), dtype=torch.uint8)
            assert tier.put([key], [buf[:size]]) == [model.put(key, data)]
        elif what < 0.45:
            arena, (place,) = tier.reserve([key], [size])
            assert (place is not None) == model.reserve(key, size)
            if place is not None:
                start, reserved = place
                assert reserved == size and start % 64 == 0 and start + size <= arena.numel()
                view = arena[start: start + size]
                view.copy_(torch.tensor(list(data), dtype=torch.uint8))  # the caller's copy
                views[key] = (view, data)
        elif what < 0.6 and views:
            key = rng.choice(sorted(views))
            written = rng.random() < 0.8
            tier.commit([key], [written])
            data = views.pop(key)[1]
            model.commit(key, data if written else None)
        elif what < 0.8:
            got = tier.get([key], [buf[:300]])[0]
            if key in model.objects:
                model.objects.move_to_end(key)
                data = model.objects[key][1]
                assert got == len(data) and bytes(buf[:got].tolist()) == data
            else:
                assert got == -1
        else:
            arena, (place,) = tier.peek([key])
            if key in model.objects:
                model.objects.move_to_end(key)
                start, size = place
                assert bytes(arena[start: start + size].tolist()) == model.objects[key][1]
            else:
                assert place is None
        assert tier.contains(keys) == [k in model.objects for k in keys]
        assert tier.stats()["bytes_used"] == sum(len(d) for _, d in model.objects.values())
    assert model.reserved.keys() == views.keys()


def test_reservations_are_refused_by_name():
    tier = HostTier(1000, pinned=False)
    with pytest.raises(ValueError, match="2 keys but 1 sizes"):
        tier.reserve(["a", "b"], [1])
    with pytest.raises(ValueError, match="sizes must be ints >= 0"):
        tier.reserve(["a"], [-1])
    with pytest.raises(ValueError, match="sizes must be ints >= 0, got -1"):
        tier.reserve(["a", "b"], [10, -1])  # nothing reserved: "a" can be reserved after
    assert tier.reserve(["a"], [2000])[1] == [None]  # larger than the tier
    assert tier.reserve(["a"], [10])[1][0] is not None
    with pytest.raises(ValueError, match="'b' is not reserved"):
        tier.commit(["a", "b"], [True, True])  # nothing committed: "a" is still reserved
    assert tier.contains(["a"]) == [False]
    tier.commit(["a"], [True])
    assert tier.contains(["a"]) == [True] and tier.stats()["objects"] == 1


def test_answers_for_what_does_not_fit():
    tier = HostTier(100, pinned=False)  # 64 usable bytes: objects take whole 64-byte units
    buf = registered(tier)
    assert tier.stats()["capacity_bytes"] == 64
    assert tier.put(["big"], [buf[:65]]) == [False]
    assert tier.put(["a"], [buf[:50]]) == [True]
    assert tier.get(["a"], [buf[:49]]) == [-1]  # the buffer is too small
    assert tier.get(["missing"], [buf[:100]]) == [-1]


@pytest.mark.parametrize("capacity", [0, -1, 63, 1.5, True, "1"])
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
    layout = engine.tiers.layout
    pair = sum(aligned(layout.object_bytes(k)) for k in (0, 1))
    for bad in (2 * pair - 1, True, 2.0 * pair):
        fresh = host()
        with pytest.raises(ValueError, match=r"save_buffer_bytes must be an int that holds a block and its tail "
                                             rf"object twice \({2 * pair} bytes\)"):
            TierCache(engine.plan, engine.kv, [fresh], save_buffer_bytes=bad)
        assert fresh._registered == []
    assert TierCache(engine.plan, engine.kv, [host()], save_buffer_bytes=2 * pair).save_buffer.size == 2 * pair
    with pytest.raises(ValueError, match="backends"):
        TierCache(engine.plan, engine.kv, [])


@pytest.mark.gpu
def test_a_pinned_arena_locks_exactly_its_pages_and_lets_them_go():
    """HostTier's arena is page-locked by registering exactly its pages, not
    through torch's caching host allocator (which rounds a block up to a power
    of two); copies from it run on the GPU's copy engine; the pages are let go
    once the last view of them is gone."""
    import gc
    import mmap

    from ukv_torch.tiers.staging import locked_host_bytes

    size = (3 << 20) + 64  # a power-of-two allocator would lock 4 MiB for it
    pages = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    cached = torch.cuda.host_memory_stats().get("allocated_bytes.all.current", 0)
    locked = locked_host_bytes()
    tier = HostTier(size, pinned=True)
    arena = tier._arena.buffer
    address = arena.data_ptr()
    assert arena.numel() == size and address % mmap.PAGESIZE == 0 and page_locked(address)
    assert locked_host_bytes() == locked + pages
    assert torch.cuda.host_memory_stats().get("allocated_bytes.all.current", 0) == cached
    arena.copy_(torch.arange(size, dtype=torch.int64).remainder_(251).to(torch.uint8))
    on_gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time in front of the copy
    on_gpu.copy_(arena, non_blocking=True)
    assert not torch.cuda.current_stream().query()  # queued, not done: a copy from pageable memory waits
    assert torch.equal(on_gpu.cpu(), arena)
    view = arena[64:128]
    del tier, arena
    gc.collect()
    assert locked_host_bytes() == locked + pages  # a view still holds the pages
    del view
    gc.collect()
    assert locked_host_bytes() == locked  # (the driver is not asked of memory let go: that is an error it reports)


def page_locked(address):
    """Whether the CUDA driver knows ``address`` as page-locked host memory
    (``Tensor.is_pinned`` knows only torch's own allocator's blocks)."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    kind = ctypes.c_uint(0)
    memory_type, host = 2, 1  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_MEMORYTYPE_HOST
    rc = driver.cuPointerGetAttribute(ctypes.byref(kind), memory_type, ctypes.c_ulonglong(address))
    return rc == 0 and kind.value == host
