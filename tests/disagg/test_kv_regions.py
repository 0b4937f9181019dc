"""A side's runs against the bytes they name. KvRegions.runs against
gather_sequence's buffer: each run's memory holds the bytes at its offsets.
The staging buffer's runs (kv_regions.staged) against a byte-by-byte model:
every byte the rows hold goes to its piece's place in the buffer, and runs that
continue in both the transfer buffer and the staging buffer are one."""
import numpy as np
import pytest
import torch
from support.disagg_pools import pool, prefill, prompt

from ukv_torch.disagg.kv_regions import KvRegions, Staging, staged


def expected_places(runs, starts, places, base):
    """{buffer offset: staging address} of every byte the rows hold: its piece's place
    plus its offset in the piece."""
    out = {}
    for offset, _, size in runs.tolist():
        for o in range(offset, offset + size):
            k = int(np.searchsorted(starts, o, side="right")) - 1
            out[o] = base + int(places[k]) + o - int(starts[k])
    return out


def places_of(staged_runs):
    """{buffer offset: staging address} as the staged runs (offset, address, bytes) say."""
    return {o: address + o - offset for offset, address, size in staged_runs.tolist()
            for o in range(offset, offset + size)}


@pytest.mark.parametrize("seed", range(40))
def test_staged_runs_place_every_byte_in_its_piece_and_are_merged(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    sizes = rng.integers(1, 40, n)
    gaps = rng.integers(0, 2, n) * rng.integers(1, 16, n)  # a cached prefix or another layer's bytes between
    offsets = np.cumsum(np.concatenate([[rng.integers(0, 8)], (sizes + gaps)[:-1]]))
    runs = np.stack([offsets, rng.integers(0, 1 << 30, n), sizes], axis=1).astype(np.int64)
    total = int(offsets[-1] + sizes[-1]) + int(rng.integers(0, 8))
    starts = np.unique(np.concatenate([[0], rng.integers(0, total, int(rng.integers(1, 6))), [total]]))
    staging = Staging(int(rng.integers(total // 2 + 40, 2 * total + 80)), "test")
    places, _ = staging.place(np.diff(starts))
    got = staged(runs, starts.astype(np.int64), places, staging)
    base = staging.buffer.data_ptr()
    assert places_of(got) == expected_places(runs, starts, places, base)
    # merged: no run continues the one before it in both buffers
    ends = got[:-1, 0] + got[:-1, 2]
    assert not np.any((ends == got[1:, 0]) & (got[:-1, 1] + got[:-1, 2] == got[1:, 1]))


def memory_bytes(pool, address: int, size: int) -> bytes:
    """``size`` bytes at ``address`` of one of the pool's KV tensors."""
    for t in pool.tensors():
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if start <= address and address + size <= start + storage.nbytes():
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            return bytes(whole[address - start: address - start + size].numpy())
    raise AssertionError(f"address {address:#x} (+{size}) lies in no KV tensor")


@pytest.mark.parametrize("layout, page", [("row_space", 32), ("row_space", 64), ("elastic", 0), ("static", 0)])
@pytest.mark.parametrize("skip_below", [0, 128, 300])
def test_a_sequence_s_runs_name_the_bytes_gather_sequence_puts_at_their_offsets(layout, page, skip_below):
    """Every run (offset, address, bytes) of KvRegions.runs holds the bytes that
    gather_sequence (the in-process path) puts at its buffer offsets; the runs
    follow each other in offset order without overlapping, and hold every byte
    of the buffer, or fewer with skip_below (a prefix the receiver holds)."""
    p = pool(layout, page=page, seed=3)
    prefill(p, 1, prompt(200, seed=1))   # another sequence first: the second one's rows are not the first rows
    prefill(p, 2, prompt(700, seed=2))
    export = p.mgr.describe_sequence(2)
    regions = KvRegions(p.plan, p.kv)
    buffer = bytes(p.sequence_bytes(2).numpy())
    runs = regions.runs(export, skip_below)
    assert (np.diff(runs[:, 0]) >= runs[:-1, 2]).all()  # in offset order, none overlapping
    for offset, address, size in runs.tolist():
        assert memory_bytes(p, address, size) == buffer[offset: offset + size]
    if not skip_below:
        assert int(runs[:, 2].sum()) == len(buffer)
    else:
        assert 0 < int(runs[:, 2].sum()) < len(buffer)
