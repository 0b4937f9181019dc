"""Ranges of one buffer taken in turn, each held until the work that uses it has ended.

The page-locked host buffer the tiers' run lists are uploaded from
(uploads.py) is read by the GPU asynchronously. It is cut into ranges in the
order they are asked for, back at the start where a range would run past
the end; a range is reused only after the events of the uses of its bytes,
which its taker waits for (on the host, before writing it)."""
from __future__ import annotations

import collections
from typing import Deque, List, Tuple

__all__ = ["RangeRing"]


class RangeRing:
    """Ranges of ``size`` bytes' buffer (see the module docstring)."""

    def __init__(self, size: int):
        self.size = size
        self._position = 0
        self._held: Deque[List] = collections.deque()  # [start, end, event or None]: disjoint

    def take(self, nbytes: int) -> Tuple[int, list]:
        """The start of the next range of ``nbytes`` (1..size), and the events not yet
        complete of the uses of its bytes before, to wait for before it is written."""
        if not 0 < nbytes <= self.size:
            raise ValueError(f"RangeRing.take: nbytes must be in 1..{self.size}, got {nbytes}")
        if self._position + nbytes > self.size:
            self._position = 0
        start, end = self._position, self._position + nbytes
        kept: Deque[List] = collections.deque()
        pending = []
        for held in self._held:
            if held[0] < end and start < held[1]:
                if held[2] is not None and not held[2].query():
                    pending.append(held[2])
            else:
                kept.append(held)
        kept.append([start, end, None])
        self._held, self._position = kept, end
        return start, pending

    def pending(self) -> list:
        """The events not yet complete of the uses of the ranges held now."""
        return [held[2] for held in self._held if held[2] is not None and not held[2].query()]

    def used(self, start: int, event) -> None:
        """The use of the range taken at ``start`` ends with ``event`` (None: it has ended)."""
        for held in self._held:
            if held[0] == start:
                held[2] = event
                return
        raise ValueError(f"RangeRing.used: no range taken at {start}")
