"""RangeRing: ranges of one buffer taken in turn (the upload ring's rule), checked
against a model: ranges in order, back at the start where one would run past the
end; a range returns the events not yet complete of the ranges it overlaps, which
it then replaces."""
import random

import pytest

from ukv_torch.tiers.range_ring import RangeRing


class Event:
    def __init__(self):
        self.done = False

    def query(self):
        return self.done


def test_ranges_follow_each_other_and_wrap_over_uses_still_running():
    ring = RangeRing(300)
    first, second = Event(), Event()
    assert ring.take(100) == (0, [])
    ring.used(0, first)
    assert ring.take(100) == (100, [])
    ring.used(100, second)
    second.done = True
    assert ring.take(150) == (0, [first])  # 200 + 150 > 300: back at the start, over both; the ended use is not
    ring.used(0, Event())
    assert ring.take(100) == (150, [])  # only [0, 150) is held, by a range not overlapped


def test_a_random_run_matches_the_model():
    rng = random.Random(7)
    size = 1000
    ring = RangeRing(size)
    held, position, waited = [], 0, 0  # the model: (start, end, event) still held
    for _ in range(2000):
        for _, _, event in held:
            if rng.random() < 0.3:
                event.done = True
        nbytes = rng.randint(1, size)
        if position + nbytes > size:
            position = 0
        start, end = position, position + nbytes
        overlapped = [h for h in held if h[0] < end and start < h[1]]
        expected = [e for _, _, e in overlapped if not e.done]
        held = [h for h in held if h not in overlapped]
        assert ring.take(nbytes) == (start, expected)
        waited += bool(expected)
        event = Event()
        ring.used(start, event)
        held.append((start, end, event))
        position = end
        assert ring.pending() == [e for _, _, e in held if not e.done]  # what a grown buffer waits for
    assert waited > 0


def test_a_range_larger_than_the_buffer_and_an_unknown_start_are_refused():
    ring = RangeRing(64)
    for nbytes in (65, 0):
        with pytest.raises(ValueError, match="nbytes must be in 1..64"):
            ring.take(nbytes)
    ring.take(10)
    with pytest.raises(ValueError, match="no range taken at 5"):
        ring.used(5, None)
