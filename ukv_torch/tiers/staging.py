"""Host memory the KV tiers allocate ranges of: one buffer, allocated once
(pinned where CUDA copies it), and a first-fit allocator of 64-byte aligned
ranges in it. TierCache's staging is one (registered once with every backend,
which may read and write it in place by DMA or RDMA; each save or load batch
takes one contiguous range), and HostTier keeps its objects in another."""
from __future__ import annotations

import bisect
import mmap
import weakref
from typing import List, Optional, Tuple

import numpy as np
import torch

__all__ = ["Staging", "ALIGN", "host_bytes", "locked_host_bytes"]

ALIGN = 64  # every object starts on a 64-byte boundary
_PAGE = mmap.PAGESIZE
_locked = [0]  # bytes host_bytes has page-locked and not yet let go


def locked_host_bytes() -> int:
    """The host memory :func:`host_bytes` holds page-locked now, in bytes (whole pages)."""
    return _locked[0]


def _unlock(address: int, length: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)
    _locked[0] -= length


def aligned(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def host_bytes(size: int, pinned: bool) -> torch.Tensor:
    """``size`` bytes of host memory, page-locked when ``pinned``.

    Page-locked exactly: the pages are registered with the CUDA runtime
    (``cudaHostRegister``) and unregistered when the last view of them goes.
    ``pin_memory=True`` instead goes through torch's caching host allocator,
    which rounds every block up to a power of two, so a 48 GiB tier would lock
    64 GiB of the host's memory. The registered range is whole pages inside
    one allocation, so it never shares a page with other memory (a page
    registered twice is refused). ``Tensor.is_pinned()`` says False for it
    (torch knows only its own allocator's blocks); the driver knows it as
    page-locked, so copies to and from the GPU are asynchronous DMA."""
    if not pinned or size == 0:
        return torch.empty(size, dtype=torch.uint8)
    raw = np.empty(size + 2 * _PAGE, dtype=np.uint8)
    start = aligned(raw.ctypes.data, _PAGE) - raw.ctypes.data
    length = aligned(size, _PAGE)
    address = raw.ctypes.data + start
    err = int(torch.cuda.cudart().cudaHostRegister(address, length, 0))
    if err:
        raise RuntimeError(f"page-locking {size} bytes of host memory failed (CUDA error {err}): the host may "
                           f"lack that much lockable memory (ulimit -l)")
    _locked[0] += length
    # numpy clears an array's weak references before it frees the memory.
    weakref.finalize(raw, _unlock, address, length)
    return torch.from_numpy(raw)[start:start + size]


class Staging:
    """``size`` bytes of host memory (page-locked when ``pinned``: :func:`host_bytes`) and a first-fit
    allocator of ranges in it; ranges go back with :meth:`free`."""

    def __init__(self, size: int, pinned: bool):
        self.size = aligned(size)
        self.buffer = host_bytes(self.size, pinned)
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
