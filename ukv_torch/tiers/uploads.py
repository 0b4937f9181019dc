"""Run lists to the GPU without a host sync and without torch's pin_memory.

A save or load uploads small int64 run lists for its gather and scatter
calls. A copy from pageable memory would wait for the stream's earlier work
(every gather before it), so they go through page-locked memory. Through
``Tensor.pin_memory`` each took 0.1-3 ms of host time on an H100 host (a
pointer query, then a block of torch's caching host allocator): ~5 ms of a
32K-token save's 20, spent before the first copies start. Here they are
written into one page-locked buffer, registered once (staging.host_bytes),
whose ranges are taken in turn (range_ring.py) and reused once the copy
that read them has completed (a host wait only if the ring comes round to a
copy still queued: a buffer of many uploads' bytes). The buffer is
registered when the ring is made: registering (and unregistering) host
memory may synchronize the device, which a step must never meet."""
from __future__ import annotations

import numpy as np
import torch

from .range_ring import RangeRing
from .staging import ALIGN, aligned, host_bytes

__all__ = ["Uploads"]

_INITIAL_BYTES = 1 << 20


class Uploads:
    """Host tensors to ``device`` (a CUDA device) through a page-locked ring of at least
    ``size`` bytes, grown (after the copies from it completed) for an upload larger than
    half of it."""

    def __init__(self, device: torch.device, size: int = _INITIAL_BYTES):
        self.device, self.size = device, size
        self.buffer = host_bytes(size, pinned=True)
        self._host = self.buffer.numpy()
        self._ring = RangeRing(size)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a contiguous CPU tensor) on the device, copied on the current stream."""
        nbytes = t.numel() * t.element_size()
        if 2 * aligned(nbytes) > self.size:
            self._grow(2 * aligned(nbytes))
        start, pending = self._ring.take(max(ALIGN, aligned(nbytes)))
        for event in pending:  # the ring came round to a copy not yet run
            event.synchronize()
        staged = self.buffer[start: start + nbytes]
        # numpy's copy: torch's CPU copy of over 32K elements runs on its thread pool, and with
        # that pool at one thread a 32K-token load (41 KB of run lists, its largest such copy)
        # took 7.5 ms instead of 10.2 on an H100 host
        np.copyto(self._host[start: start + nbytes], t.reshape(-1).view(torch.uint8).numpy())
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        out.view(-1).view(torch.uint8).copy_(staged, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # the stream the copy went on
        self._ring.used(start, event)
        return out

    def _grow(self, size: int) -> None:
        for event in self._ring.pending():  # the copies still to read the current buffer
            event.synchronize()
        self.size, self.buffer, self._ring = size, host_bytes(size, pinned=True), RangeRing(size)
        self._host = self.buffer.numpy()
