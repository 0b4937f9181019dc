"""The one interface every KV tier backend implements.

A backend is a dumb store of byte objects under string keys. Everything that
makes an object trustworthy (the key chain over the prefix, the model
fingerprint, the checksum, the layout-independent byte format) lives above it,
so a backend never interprets bytes and a new one (LMCache, NIXL, a file
system) is one class.

Buffers are host tensors (uint8, contiguous, usually pinned) that the caller
registered once with `register_buffer`; `put` and `get` take slices of them.
Registering first lets a backend that moves bytes by DMA or RDMA (Mooncake)
read and write those slices in place, with no copy of its own. A backend in
host memory (HostTier) can go further and lend its own memory: `reserve` /
`commit` for saves and `peek` for loads, so the GPU's copies land in it and
leave from it with no host copy at all.

Errors: a backend raises only for misuse (a buffer that is not a registered
host slice, keys and buffers of different lengths). Anything that goes wrong
in the store itself (full, unreachable, an object evicted meanwhile) is an
answer, never an exception: `put` says False for what it did not store, `get`
says -1 for what it could not read, and the caller recomputes. Serving never
fails because a tier did.
"""
from __future__ import annotations

import abc
from typing import Dict, List, Optional, Sequence, Tuple

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

    # --- optional: a backend whose memory the caller's copies reach directly ----------
    def reserve(self, keys: Sequence[str], sizes: Sequence[int]) -> Optional[Tuple[torch.Tensor, List[Optional[Tuple[int, int]]]]]:
        """Room for new objects in the backend's own host memory, which the caller
        fills itself (a DMA from the GPU) and then hands over with `commit`: the
        uint8 host buffer the room lies in, and per key its (start, bytes) there,
        or None where the key is stored already or no room can be made (places,
        as `peek` gives them). A reserved object is invisible and cannot be
        evicted until committed. None (the default): this backend takes only `put`."""
        return None

    def commit(self, keys: Sequence[str], written: Sequence[bool]) -> None:
        """End the reservations of `keys`: store those `written`, free the others."""
        raise NotImplementedError(f"{type(self).__name__} reserves nothing, so it has nothing to commit")

    def peek(self, keys: Sequence[str]) -> Optional[Tuple[torch.Tensor, List[Optional[Tuple[int, int]]]]]:
        """The stored objects themselves, for the caller to copy from in place
        (counted as gets): the uint8 host buffer they lie in, and per key the
        object's (start, bytes) in it, or None where it is missing (places, not
        a tensor per object: a load looks up hundreds at once). They stay valid
        until the backend's next put, reserve, commit or close. None (the
        default): this backend lends no memory, use `get`."""
        return None

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
