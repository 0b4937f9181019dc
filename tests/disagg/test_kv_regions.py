"""The staging buffer's runs (kv_regions.staged) against a byte-by-byte model:
every byte the rows hold goes to its piece's place in the buffer, and runs that
continue in both the transfer buffer and the staging buffer are one."""
import numpy as np
import pytest

from ukv_torch.disagg.kv_regions import Staging, staged


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
