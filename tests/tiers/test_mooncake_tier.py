"""MooncakeTier against a real mooncake_master on loopback: objects round-trip
byte for byte between registered buffers, misuse raises naming the argument,
a wrong address or capacity fails construction with nothing left behind, and
a master that dies turns puts and gets into bounded-time failures until a new
one answers on the same address."""
import threading
import time
import urllib.request

import pytest
import torch

from support.mooncake_master import mooncake_master, shared_mooncake_master  # noqa: F401  (fixtures)
from ukv_torch.tiers.backend import TierBackend
from ukv_torch.tiers.mooncake_master import free_ports

MiB = 1 << 20
#: generous bound on one batch call against a dead master (Mooncake fails
#: at once on a closed connection; a reconnect attempt takes a few seconds)
DEAD_MASTER_BOUND_S = 60.0


def make_tier(master, capacity_bytes=32 * MiB):
    from ukv_torch.tiers.mooncake import MooncakeTier
    return MooncakeTier(master.master_address, master.metadata_url, capacity_bytes,
                        metrics_url=master.metrics_url)


def master_metric(master, name):
    with urllib.request.urlopen(master.metrics_url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


def objects(count, size, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g) for _ in range(count)]


def staged(tier, payloads):
    """One registered source buffer holding the payloads back to back, and
    its slices."""
    source = torch.cat(payloads)
    tier.register_buffer(source)
    return list(torch.split(source, [p.numel() for p in payloads]))


def call_within(bound_s, fn, *args):
    """fn(*args) on a thread; fails the test if it has not returned in bound_s."""
    result = []
    worker = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(bound_s)
    assert not worker.is_alive(), f"{fn.__name__} still running after {bound_s} s"
    return result[0], time.monotonic() - started


def test_objects_round_trip_between_registered_buffers(mooncake_master):
    sizes = [MiB, 3 * MiB // 2, 4096, 1]
    payloads = [p for size, seed in zip(sizes, range(4)) for p in objects(1, size, seed)]
    keys = [f"rt/{i}" for i in range(len(sizes))]
    with make_tier(mooncake_master) as tier:
        assert isinstance(tier, TierBackend) and tier.name == "mooncake"
        assert tier.put(keys, staged(tier, payloads)) == [True] * len(keys)
        destination = torch.zeros(10 * MiB, dtype=torch.uint8)
        tier.register_buffer(destination)
        slots = list(torch.split(destination, 2 * MiB))
        got = tier.get(keys + ["rt/absent"], slots[:len(keys) + 1])
        assert got == sizes + [-1]
        for payload, slot in zip(payloads, slots):
            assert torch.equal(slot[:payload.numel()], payload)
        assert tier.contains(keys + ["rt/absent"]) == [True] * len(keys) + [False]
        # an object larger than the buffer it is asked into is not read
        assert tier.get(keys[:1], [destination[:MiB // 2]]) == [-1]


def test_a_stored_key_keeps_its_first_object(mooncake_master):
    first, second = objects(2, MiB, seed=7)
    with make_tier(mooncake_master) as tier:
        a, b = staged(tier, [first, second])
        assert tier.put(["same"], [a]) == [True]
        assert tier.put(["same"], [b]) == [True]
        destination = torch.zeros(MiB, dtype=torch.uint8)
        tier.register_buffer(destination)
        assert tier.get(["same"], [destination]) == [MiB]
        assert torch.equal(destination, first)


def test_two_clients_share_one_store(mooncake_master):
    payload, = objects(1, 2 * MiB, seed=3)
    with make_tier(mooncake_master) as writer, make_tier(mooncake_master) as reader:
        assert writer.put(["shared"], staged(writer, [payload])) == [True]
        destination = torch.zeros(2 * MiB, dtype=torch.uint8)
        reader.register_buffer(destination)
        assert reader.get(["shared"], [destination]) == [2 * MiB]
        assert torch.equal(destination, payload)


def test_stats_count_this_client_and_the_whole_store(mooncake_master):
    payloads = objects(3, MiB, seed=5)
    with make_tier(mooncake_master, capacity_bytes=16 * MiB) as tier:
        tier.put(["s0", "s1", "s2"], staged(tier, payloads))
        destination = torch.zeros(MiB, dtype=torch.uint8)
        tier.register_buffer(destination)
        tier.get(["s0", "nope"], [destination, destination])
        stats = tier.stats()
        assert {k: stats[k] for k in ("puts", "gets", "hits", "misses", "errors")} == \
            dict(puts=3, gets=2, hits=1, misses=1, errors=0)
        assert stats["segment_bytes"] == 16 * MiB
        assert stats["capacity_bytes"] == master_metric(mooncake_master, "master_total_capacity_bytes") == 16 * MiB
        assert stats["objects"] == 3 and stats["bytes_used"] >= 3 * MiB and stats["evictions"] == 0


@pytest.mark.parametrize("call, match", [
    (lambda t, b: t.put(["k"], [torch.zeros(64, dtype=torch.uint8)]), r"buffers\[0\] is not inside"),
    (lambda t, b: t.put(["k", "l"], [b]), "2 keys and 1 buffers"),
    (lambda t, b: t.put([""], [b]), r"keys\[0\] must be a non-empty string"),
    (lambda t, b: t.get(["k"], [b.view(torch.int32)]), r"buffers\[0\] must be a non-empty contiguous uint8"),
    (lambda t, b: t.get(["k"], [b[::2]]), r"buffers\[0\] must be a non-empty contiguous uint8"),
    (lambda t, b: t.contains([7]), r"keys\[0\] must be a non-empty string"),
    (lambda t, b: t.register_buffer(b[:0]), "buffer must be a non-empty contiguous uint8"),
])
def test_misuse_raises_naming_the_argument(shared_mooncake_master, call, match):
    with make_tier(shared_mooncake_master) as tier:
        buffer = torch.zeros(4096, dtype=torch.uint8)
        tier.register_buffer(buffer)
        with pytest.raises(ValueError, match=match):
            call(tier, buffer)
        assert tier.stats()["puts"] == 0 and tier.contains(["k"]) == [False]


@pytest.mark.parametrize("capacity", [0, -MiB, True, 1.5 * MiB])
def test_capacity_must_be_positive(shared_mooncake_master, capacity):
    clients = master_metric(shared_mooncake_master, "master_active_clients")
    with pytest.raises(ValueError, match="capacity_bytes must be a positive int"):
        make_tier(shared_mooncake_master, capacity_bytes=capacity)
    assert master_metric(shared_mooncake_master, "master_active_clients") == clients


def test_wrong_addresses_fail_construction_with_nothing_made(mooncake_master):
    from ukv_torch.tiers.mooncake import MooncakeTier
    closed_port, = free_ports("127.0.0.1", 1)
    master, metadata = mooncake_master.master_address, mooncake_master.metadata_url
    with pytest.raises(ValueError, match="master_address must be 'host:port'"):
        MooncakeTier("127.0.0.1", metadata, MiB)
    with pytest.raises(ConnectionError, match="master_address='127.0.0.1:%d'" % closed_port):
        MooncakeTier(f"127.0.0.1:{closed_port}", metadata, MiB)
    with pytest.raises(ConnectionError, match="metadata_url="):
        MooncakeTier(master, f"http://127.0.0.1:{closed_port}/metadata", MiB)
    # Mooncake's own setup fails on a protocol it does not know: the half-set-up
    # client is closed, and the master never counts it
    with pytest.raises(ConnectionError, match="protocol='no-such-protocol'"):
        MooncakeTier(master, metadata, MiB, protocol="no-such-protocol")
    assert master_metric(mooncake_master, "master_active_clients") == 0
    assert master_metric(mooncake_master, "master_total_capacity_bytes") == 0


def test_a_dead_master_gives_bounded_failures_and_a_new_one_is_used(mooncake_master):
    before, after = objects(2, MiB, seed=11)
    with make_tier(mooncake_master) as tier:
        before_view, after_view = staged(tier, [before, after])
        destination = torch.zeros(MiB, dtype=torch.uint8)
        tier.register_buffer(destination)
        assert tier.put(["before"], [before_view]) == [True]

        mooncake_master.kill()
        stored, _ = call_within(DEAD_MASTER_BOUND_S, tier.put, ["during"], [after_view])
        read, _ = call_within(DEAD_MASTER_BOUND_S, tier.get, ["before"], [destination])
        assert stored == [False] and read == [-1]
        assert tier.stats()["errors"] >= 2 and tier.stats()["objects"] == -1

        # the client remounts its segment once a master answers again on the
        # same address; the old master's objects are gone with it
        mooncake_master.start()
        for _ in range(60):
            if tier.put(["after"], [after_view]) == [True]:
                break
            time.sleep(0.5)
        assert tier.get(["after"], [destination]) == [MiB]
        assert torch.equal(destination, after)
        assert tier.get(["before"], [destination]) == [-1]


def test_a_closed_tier_refuses_calls(shared_mooncake_master):
    tier = make_tier(shared_mooncake_master)
    tier.close()
    tier.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        tier.contains(["k"])


def test_importing_never_needs_mooncake():
    # importing the package, the tier modules and ukv_torch.disagg never imports mooncake
    import subprocess
    import sys
    code = ("import sys, ukv_torch, ukv_torch.tiers.mooncake, ukv_torch.tiers.mooncake_master, ukv_torch.disagg; "
            "print('mooncake' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
