"""The device memory a TierCache's saves gather their objects into.

A save gathers and seals a piece of objects on the step's stream, then a side
stream copies it to host memory. Where each piece took a buffer of its own,
the saves in flight held as much device memory as the blocks published since
the copies last caught up (a whole 32K-token V4-Pro prefix saved at once:
1.4 GB, outside the plan's budget) and paid the caching allocator for every
piece. Here they share one buffer of a fixed size, allocated with the
TierCache (an allocation in a step may wait for the device), whose two halves
the pieces take in turn (a piece is at most half of it): a half is reused once
the copy of the piece it held has completed, which the step's stream waits
for on the device (never the host). So one piece is gathered while the one
before it is copied. (Ranges packed one after the other instead, back at the
start where one would run past the end, made a piece after a smaller first one
overlap both pieces before it: each gather then waited for the copy just
queued, and a 32K-token save ran its gathers and copies in turn, at 71% of
the pinned copy's speed on an H100.) Saves that outrun the copies therefore
slow the step's stream by the copies' time instead of taking more memory;
`waits` counts the pieces that waited.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

__all__ = ["SaveBuffer"]


class SaveBuffer:
    """``size`` bytes on ``device`` (None: the CPU, where copies complete at once), in two
    halves of ``size // 2`` bytes."""

    def __init__(self, size: int, device: Optional[torch.device]):
        self.size, self.half, self.device = size, size // 2, device
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device or "cpu")
        self.waits = 0  # pieces whose half's previous piece was still being copied
        self._next = 0
        self._copies: List[Optional[object]] = [None, None]  # each half's last copy's event (None: ended)

    def take(self, nbytes: int, stream) -> Tuple[int, torch.Tensor]:
        """The next half's first ``nbytes`` (1..size // 2): (its start, the tensor), with
        ``stream`` (the one the piece is gathered on; None on the CPU) made to wait for the
        copy of the piece the half held before, if it has not completed."""
        if not 0 < nbytes <= self.half:
            raise ValueError(f"SaveBuffer.take: nbytes must be in 1..{self.half} (half the buffer), got {nbytes}")
        half, self._next = self._next, 1 - self._next
        event, self._copies[half] = self._copies[half], None
        if stream is not None and event is not None and not event.query():
            stream.wait_event(event)
            self.waits += 1
        start = half * self.half
        return start, self.buffer[start: start + nbytes]

    def copying(self, start: int, event) -> None:
        """The copy of the piece in the half taken at ``start`` ends with ``event`` (None: it
        has ended): the half is reused only after it."""
        if start not in (0, self.half):
            raise ValueError(f"SaveBuffer.copying: no half starts at {start} (0 or {self.half})")
        self._copies[start // self.half] = event
