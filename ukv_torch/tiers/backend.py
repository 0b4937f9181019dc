"""The one interface every KV tier backend implements.

A backend is a dumb store of byte objects under string keys. Everything that
makes an object trustworthy (the key chain over the prefix, the model
fingerprint, the checksum, the layout-independent byte format) lives above it,
so a backend never interprets bytes and a new one (LMCache, NIXL, a file
system) is one class.

Buffers are host tensors (uint8, contiguous, usually pinned) that the caller
registered once with `register_buffer`; `put` and `get` take slices of them.
Registering first lets a backend that moves bytes by DMA or RDMA (Mooncake)
read and write those slices in place, with no copy of its own.

Errors: a backend raises only for misuse (a buffer that is not a registered
host slice, keys and buffers of different lengths). Anything that goes wrong
in the store itself (full, unreachable, an object evicted meanwhile) is an
answer, never an exception: `put` says False for what it did not store, `get`
says -1 for what it could not read, and the caller recomputes. Serving never
fails because a tier did.
"""
from __future__ import annotations

import abc
from typing import Dict, List, Sequence

import torch


class TierBackend(abc.ABC):
    """A store of byte objects under string keys (see the module docstring)."""

    #: short name for logs and stats ("host", "mooncake", ...)
    name: str = "tier"

    @abc.abstractmethod
    def register_buffer(self, buffer: torch.Tensor) -> None:
        """Make a contiguous uint8 host tensor usable as a source or destination
        of `put` and `get`. Registering a buffer twice is a no-op."""

    @abc.abstractmethod
    def put(self, keys: Sequence[str], buffers: Sequence[torch.Tensor]) -> List[bool]:
        """Store each buffer's bytes under its key (an existing key is kept as it
        is: objects are immutable, so a second put of one key stores nothing and
        answers True). Room is made by evicting the least recently used objects.
        Returns, per key, whether the object is now stored."""

    @abc.abstractmethod
    def get(self, keys: Sequence[str], buffers: Sequence[torch.Tensor]) -> List[int]:
        """Copy each key's object into the front of its buffer. Returns, per key,
        the object's size in bytes, or -1 where it is missing, larger than the
        buffer, or could not be read; a -1 buffer's bytes are unspecified."""

    @abc.abstractmethod
    def contains(self, keys: Sequence[str]) -> List[bool]:
        """Whether each key is stored now (a later get may still miss: another
        process or the LRU may evict it in between)."""

    @abc.abstractmethod
    def stats(self) -> Dict[str, int]:
        """Counters: at least objects, bytes_used, capacity_bytes, puts, gets,
        hits, misses, evictions and errors."""

    def close(self) -> None:
        """Release what the backend holds (connections, registrations)."""

    def __enter__(self) -> "TierBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
