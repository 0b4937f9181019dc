"""Host memory the KV tiers allocate ranges of: one buffer, allocated once
(pinned where CUDA copies it), and a first-fit allocator of 64-byte aligned
ranges in it. TierCache's staging is one (registered once with every backend,
which may read and write it in place by DMA or RDMA; each save or load batch
takes one contiguous range), and HostTier keeps its objects in another."""
from __future__ import annotations

import bisect
from typing import List, Optional, Tuple

import torch

__all__ = ["Staging", "ALIGN"]

ALIGN = 64  # every object starts on a 64-byte boundary


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Staging:
    """``size`` bytes of host memory (pinned when ``pinned``) and a first-fit
    allocator of ranges in it; ranges go back with :meth:`free`."""

    def __init__(self, size: int, pinned: bool):
        self.size = aligned(size)
        self.buffer = torch.empty(self.size, dtype=torch.uint8, pin_memory=pinned)
        self._free: List[Tuple[int, int]] = [(0, self.size)]  # (start, length), sorted by start

    def take(self, n: int) -> Optional[int]:
        """The start of a free range of ``n`` bytes, or None when none is that large."""
        n = aligned(n)
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, length - n)
                return start
        return None

    def free(self, start: int, n: int) -> None:
        n = aligned(n)
        i = bisect.bisect_left(self._free, (start, 0))
        self._free.insert(i, (start, n))
        # Merge with the neighbours, so large ranges form again.
        if i + 1 < len(self._free) and start + n == self._free[i + 1][0]:
            self._free[i] = (start, n + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
            prev = self._free.pop(i - 1)
            self._free[i - 1] = (prev[0], prev[1] + self._free[i - 1][1])

    def free_bytes(self) -> int:
        return sum(length for _, length in self._free)
