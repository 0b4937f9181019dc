"""The device memory a TierCache's saves gather their objects into.

A save gathers and seals a piece of objects on the step's stream, then a side
stream copies it to host memory. Where each piece took a buffer of its own,
the saves in flight held as much device memory as the blocks published since
the copies last caught up (a whole 32K-token V4-Pro prefix saved at once:
1.4 GB, outside the plan's budget) and paid the caching allocator for every
piece. Here they share one buffer of a fixed size, allocated at the first save
and taken in turn: a range is reused once the copy of the piece it held has
completed, which the step's stream waits for on the device (never the host).
Saves that outrun the copies therefore slow the step's stream by the copies'
time instead of taking more memory; `waits` counts the pieces that waited.
"""
from __future__ import annotations

import collections
from typing import Deque, List, Optional, Tuple

import torch

__all__ = ["SaveBuffer"]


class SaveBuffer:
    """``size`` bytes on ``device`` (None: the CPU, where copies complete at once), taken
    in ranges in turn, back at the start where a range would run past the end."""

    def __init__(self, size: int, device: Optional[torch.device]):
        self.size, self.device = size, device
        self.buffer: Optional[torch.Tensor] = None  # allocated at the first take
        self.waits = 0  # ranges whose previous piece's copy was still running when taken
        self._position = 0
        # (start, end, the copy's event) of ranges whose pieces' copies may still run: disjoint
        self._held: Deque[List] = collections.deque()

    def take(self, nbytes: int, stream) -> Tuple[int, torch.Tensor]:
        """The next range of ``nbytes`` (at most ``size``): (its start, the tensor), with
        ``stream`` (the one the piece is gathered on; None on the CPU) made to wait for the
        copies of the pieces that held any of its bytes."""
        if not 0 < nbytes <= self.size:
            raise ValueError(f"SaveBuffer.take: nbytes must be in 1..{self.size}, got {nbytes}")
        if self.buffer is None:
            self.buffer = torch.empty(self.size, dtype=torch.uint8, device=self.device or "cpu")
        if self._position + nbytes > self.size:
            self._position = 0
        start, end = self._position, self._position + nbytes
        kept: Deque[List] = collections.deque()
        waited = False
        for held in self._held:
            if held[0] < end and start < held[1]:
                event = held[2]
                if event is not None and stream is not None and not event.query():
                    stream.wait_event(event)
                    waited = True
            else:
                kept.append(held)
        kept.append([start, end, None])
        self._held, self._position = kept, end
        self.waits += waited
        return start, self.buffer[start:end]

    def copying(self, start: int, event) -> None:
        """The copy of the piece in the range taken at ``start`` ends with ``event`` (None: it
        has ended): the range is reused only after it."""
        for held in self._held:
            if held[0] == start:
                held[2] = event
                return
        raise ValueError(f"SaveBuffer.copying: no range taken at {start}")
