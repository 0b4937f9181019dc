"""SaveBuffer: the device buffer a TierCache's saves gather into, its two halves
taken in turn. Checked against a model of its rule (piece k takes half k mod 2 and
waits for the copy of the piece that half held before, if that copy has not
ended), with events and a stream that record what was asked of them."""
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


def test_halves_alternate_and_a_piece_waits_only_for_its_half_s_copy_still_running():
    buffer, stream = SaveBuffer(300, None), Stream()
    first, second = Event(), Event()
    start, view = buffer.take(50, stream)  # a small first piece does not shift the next ones
    assert start == 0 and view.numel() == 50 and view.data_ptr() == buffer.buffer.data_ptr()
    buffer.copying(0, first)
    assert buffer.take(150, stream)[0] == 150
    buffer.copying(150, second)
    assert buffer.take(150, stream)[0] == 0  # over the first piece alone, whose copy still runs
    assert stream.waited == [first] and buffer.waits == 1
    second.done = True
    buffer.copying(0, Event())
    assert buffer.take(120, stream)[0] == 150  # the second piece's copy ended: no wait
    assert stream.waited == [first] and buffer.waits == 1


def test_a_random_run_matches_the_model():
    rng = random.Random(7)
    size = 1000
    buffer, stream = SaveBuffer(size, None), Stream()
    last = [None, None]  # the model: each half's last piece's copy
    waits = 0
    for k in range(2000):
        for event in last:
            if event is not None and rng.random() < 0.3:
                event.done = True
        nbytes = rng.randint(1, size // 2)
        half = k % 2
        expected = [last[half]] if last[half] is not None and not last[half].done else []
        before = len(stream.waited)
        got, view = buffer.take(nbytes, stream)
        assert (got, view.numel()) == (half * (size // 2), nbytes)
        assert stream.waited[before:] == expected
        waits += bool(expected)
        last[half] = Event()
        buffer.copying(got, last[half])
    assert buffer.waits == waits > 0


def test_the_cpu_waits_for_nothing():
    """Without a stream (copies on the CPU complete at once) no piece waits."""
    buffer = SaveBuffer(64, None)
    for _ in range(5):
        start, _ = buffer.take(30, None)
        buffer.copying(start, None)
    assert buffer.waits == 0


def test_a_piece_larger_than_half_and_an_unknown_start_are_refused_with_nothing_taken():
    buffer = SaveBuffer(64, None)
    for nbytes in (33, 0):
        with pytest.raises(ValueError, match=r"nbytes must be in 1..32 \(half the buffer\)"):
            buffer.take(nbytes, None)
    assert buffer.take(10, None)[0] == 0  # the refusals took no half
    with pytest.raises(ValueError, match="no half starts at 5"):
        buffer.copying(5, None)


@pytest.mark.gpu
def test_on_the_gpu_the_buffer_is_device_memory_allocated_once_when_made():
    buffer = SaveBuffer(1 << 20, torch.device("cuda"))
    assert buffer.buffer.is_cuda and buffer.buffer.numel() == 1 << 20
    _, first = buffer.take(1 << 18, torch.cuda.current_stream())
    buffer.copying(0, None)
    _, second = buffer.take(1 << 18, torch.cuda.current_stream())
    assert first.data_ptr() == buffer.buffer.data_ptr() and second.data_ptr() == first.data_ptr() + (1 << 19)
