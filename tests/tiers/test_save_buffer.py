"""SaveBuffer: the device buffer a TierCache's saves gather into, taken in turn.
Checked against a model of its rule (ranges in order, back at the start where
one would run past the end; a range waits for the copies of the pieces that
held any of its bytes, until a later range took them), with events and a
stream that record what was asked of them."""
import random

import pytest
import torch

from ukv_torch.tiers.save_buffer import SaveBuffer


class Event:
    def __init__(self):
        self.done = False

    def query(self):
        return self.done


class Stream:
    def __init__(self):
        self.waited = []

    def wait_event(self, event):
        self.waited.append(event)


def test_ranges_follow_each_other_and_wrap_waiting_only_for_copies_still_running():
    buffer, stream = SaveBuffer(300, None), Stream()
    first, second = Event(), Event()
    start, view = buffer.take(100, stream)
    assert start == 0 and view.numel() == 100 and view.data_ptr() == buffer.buffer.data_ptr()
    buffer.copying(0, first)
    assert buffer.take(100, stream)[0] == 100
    buffer.copying(100, second)
    second.done = True
    assert buffer.take(150, stream)[0] == 0  # 200 + 150 > 300: back at the start, over both
    assert stream.waited == [first] and buffer.waits == 1  # the finished copy is not waited for
    buffer.copying(0, Event())
    assert buffer.take(100, stream)[0] == 150  # only [0, 150) is held, by a piece not overlapped
    assert stream.waited == [first] and buffer.waits == 1


def test_a_random_run_matches_the_model():
    rng = random.Random(7)
    size = 1000
    buffer, stream = SaveBuffer(size, None), Stream()
    held, position, waits = [], 0, 0  # the model: (start, end, event) still held
    for _ in range(2000):
        for _, _, event in held:
            if rng.random() < 0.3:
                event.done = True
        nbytes = rng.randint(1, size)
        if position + nbytes > size:
            position = 0
        start, end = position, position + nbytes
        overlapped = [h for h in held if h[0] < end and start < h[1]]
        expected_waits = [e for _, _, e in overlapped if not e.done]
        held = [h for h in held if h not in overlapped]
        before = len(stream.waited)
        got, view = buffer.take(nbytes, stream)
        assert (got, view.numel()) == (start, nbytes)
        assert stream.waited[before:] == expected_waits
        waits += bool(expected_waits)
        event = Event()
        buffer.copying(start, event)
        held.append((start, end, event))
        position = end
        assert buffer._ring.pending() == [e for _, _, e in held if not e.done]  # what a grown buffer waits for
    assert buffer.waits == waits > 0


def test_the_cpu_waits_for_nothing():
    """Without a stream (copies on the CPU complete at once) no range waits."""
    buffer = SaveBuffer(64, None)
    for _ in range(5):
        start, _ = buffer.take(40, None)
        buffer.copying(start, None)
    assert buffer.waits == 0


def test_a_range_larger_than_the_buffer_and_an_unknown_start_are_refused():
    buffer = SaveBuffer(64, None)
    with pytest.raises(ValueError, match="nbytes must be in 1..64"):
        buffer.take(65, None)
    with pytest.raises(ValueError, match="nbytes must be in 1..64"):
        buffer.take(0, None)
    buffer.take(10, None)
    with pytest.raises(ValueError, match="no range taken at 5"):
        buffer.copying(5, None)


@pytest.mark.gpu
def test_on_the_gpu_the_buffer_is_device_memory_allocated_once_when_made():
    buffer = SaveBuffer(1 << 20, torch.device("cuda"))
    assert buffer.buffer.is_cuda and buffer.buffer.numel() == 1 << 20
    _, first = buffer.take(1 << 19, torch.cuda.current_stream())
    buffer.copying(0, None)
    _, second = buffer.take(1 << 19, torch.cuda.current_stream())
    assert first.data_ptr() == buffer.buffer.data_ptr() and second.data_ptr() == first.data_ptr() + (1 << 19)
