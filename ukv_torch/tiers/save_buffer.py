"""The device memory a TierCache's saves gather their objects into.

A save gathers and seals a piece of objects on the step's stream, then a side
stream copies it to host memory. Where each piece took a buffer of its own,
the saves in flight held as much device memory as the blocks published since
the copies last caught up (a whole 32K-token V4-Pro prefix saved at once:
1.4 GB, outside the plan's budget) and paid the caching allocator for every
piece. Here they share one buffer of a fixed size, allocated with the
TierCache (an allocation in a step may wait for the device) and taken in
turn (range_ring.py): a range is reused once the copy of the piece it held
has completed, which the step's stream waits for on the device (never the
host). Saves that outrun the copies therefore slow the step's
stream by the copies' time instead of taking more memory; `waits` counts the
pieces that waited.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .range_ring import RangeRing

__all__ = ["SaveBuffer"]


class SaveBuffer:
    """``size`` bytes on ``device`` (None: the CPU, where copies complete at once)."""

    def __init__(self, size: int, device: Optional[torch.device]):
        self.size, self.device = size, device
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device or "cpu")
        self.waits = 0  # pieces whose range's previous piece was still being copied
        self._ring = RangeRing(size)

    def take(self, nbytes: int, stream) -> Tuple[int, torch.Tensor]:
        """The next range of ``nbytes`` (1..size): (its start, the tensor), with ``stream``
        (the one the piece is gathered on; None on the CPU) made to wait for the copies
        of the pieces that held any of its bytes."""
        start, pending = self._ring.take(nbytes)
        if stream is not None:
            for event in pending:
                stream.wait_event(event)
            self.waits += bool(pending)
        return start, self.buffer[start: start + nbytes]

    def copying(self, start: int, event) -> None:
        """The copy of the piece in the range taken at ``start`` ends with ``event`` (None: it
        has ended): the range is reused only after it."""
        self._ring.used(start, event)
