"""A load's objects on their way from the tiers to the KV's device (``TierCache.admit``).

The block objects that continue an HBM hit are read piece by piece as their
keys are found, each piece's host-to-device copies started as soon as it is
read, so the copies start early and run while the host reads on and admits
the sequence. Each read's copies record an event: the rows are written from
the blocks behind the device's wait for the event of the read that holds
the last of them, with no host wait.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Set, Tuple

import torch

from .keys import key_name
from .objects import BLOCK, TAIL
from .staging import ALIGN, aligned

__all__ = ["ObjectFetch", "merged_copies"]


def merged_copies(pieces: List[Tuple[torch.Tensor, int, int, int]]) -> List[Tuple[torch.Tensor, int, int]]:
    """Copies between host memory and offsets of one buffer, as few as possible.
    ``pieces``: (host tensor, start in it, bytes, offset in the buffer); out:
    (host view, offset, bytes), where pieces that follow each other in both
    (64-byte aligned, as the arenas and the staging place them) make one copy
    that spans the padding between them."""
    runs: List[list] = []
    storages = {}  # per host tensor: its storage, the storage's address and the tensor's first byte in it
    for host, start, size, offset in pieces:
        if id(host) not in storages:
            storage = host.untyped_storage()
            storages[id(host)] = (storage, storage.data_ptr(), host.storage_offset())
        storage, address, base = storages[id(host)]
        first = base + start
        if runs:
            prev = runs[-1]
            gap = offset - (prev[3] + prev[4])
            if address == prev[1] and 0 <= gap < ALIGN and first - prev[2] == offset - prev[3]:
                prev[4] = offset + size - prev[3]
                continue
        runs.append([storage, address, first, offset, size])
    return [(torch.empty(0, dtype=torch.uint8).set_(storage, first, (size,)), offset, size)
            for storage, _, first, offset, size in runs]


class _Read(NamedTuple):
    """Where an object was read: the backend's level, and its bytes in host memory."""
    level: int
    host: torch.Tensor  # the host buffer holding it (a backend's arena, or the staging)
    start: int

    def bytes(self, size: int) -> torch.Tensor:
        return self.host[self.start: self.start + size]


class _Check(NamedTuple):
    """A verification under way: the load end it checks, the keys of its objects (blocks,
    then the tail), and per object whether it is sound (a bool tensor on the device)."""
    end: int
    keys: List[bytes]
    sound: torch.Tensor


class ObjectFetch:
    """Block objects of blocks [first, last) and one tail object, read from the cache's
    backends (searched in order) into one buffer on the KV's device: block b's at
    ``(b - first) * block_bytes``, the tail's after the last block's place. Make it,
    and call everything but ``wait``, on the cache's load stream."""

    def __init__(self, cache, first: int, last: int):
        self.cache, self.first, self.last = cache, first, last
        self.block_bytes = aligned(cache.layout.object_bytes(BLOCK))
        self.tail_offset = (last - first) * self.block_bytes
        self.source = torch.empty(self.tail_offset + cache.layout.object_bytes(TAIL), dtype=torch.uint8,
                                  device=cache.device or "cpu")
        self.keys: List[bytes] = []                               # the blocks read whole, in order
        self.read_by: List[_Read] = []                            # where each one was read
        self.tail: Optional[Tuple[bytes, _Read]] = None           # the tail object in place
        self.verified = 0                                         # blocks from the first found sound
        self.rejected: Set[str] = set()                           # names read with a wrong size or unsound
        self._staged: Optional[int] = None                        # a staging range mirroring `source`
        self._copied = False
        self._landing: List[Tuple[int, object]] = []  # (blocks read whole so far, their copies' event), CUDA
        self._tail_landing: Optional[object] = None   # the tail's copy's event, CUDA

    def blocks(self, keys: List[bytes], names: List[str]) -> int:
        """Read the next blocks' objects (their keys, in order, and the keys' names) and
        start their copies: how many of them, from the first, were read whole (a load
        ends before the first block that was not)."""
        base = len(self.keys)
        offsets = [(base + i) * self.block_bytes for i in range(len(keys))]
        got = self._read(names, self.cache.layout.object_bytes(BLOCK), offsets)
        whole = next((i for i, g in enumerate(got) if g is None), len(got))
        self.keys += keys[:whole]
        self.read_by += got[:whole]
        if whole and self.cache.cuda:
            self._landing.append((len(self.keys), self._recorded()))
        return whole

    def read_tail(self, key: bytes) -> bool:
        """Read a tail object into the tail's place (replacing any read before): whether it was whole."""
        got = self._read([key_name(key)], self.cache.layout.object_bytes(TAIL), [self.tail_offset])[0]
        self.tail = None if got is None else (key, got)
        if got is not None and self.cache.cuda:
            self._tail_landing = self._recorded()
        return got is not None

    @staticmethod
    def _recorded():
        event = torch.cuda.Event()
        event.record()  # on the load stream, the current one here
        return event

    def wait(self, stream, count: int, tail: bool = False) -> None:
        """Make ``stream`` wait (on the device, not the host) for the copies of the first
        ``count`` blocks, or of the tail with ``tail``."""
        if stream is None:
            return
        if tail:
            stream.wait_event(self._tail_landing)
            return
        event = next(e for blocks, e in self._landing if blocks >= count)
        stream.wait_event(event)

    def _read(self, names: List[str], size: int, offsets: List[int]) -> List[Optional[_Read]]:
        """Each object from the first backend that holds it whole (``size`` bytes), its copy to
        its offset of ``source`` started: where it was read, or None."""
        cache = self.cache
        out: List[Optional[_Read]] = [None] * len(names)
        pieces = []
        for level, backend in enumerate(cache.backends):
            todo = [i for i, o in enumerate(out) if o is None]
            if not todo:
                break
            lent = backend.peek([names[i] for i in todo])
            if lent is None:  # read into staging, at the objects' offsets
                if self._staged is None:
                    self._staged = cache.staging.take(self.source.numel())
                    if self._staged is None:
                        continue
                host, starts = cache.staging.buffer, [self._staged + offsets[i] for i in todo]
                got = backend.get([names[i] for i in todo], [host[start: start + size] for start in starts])
                places = [(start, g) if g >= 0 else None for start, g in zip(starts, got)]
            else:
                host, places = lent
            for i, place in zip(todo, places):
                if place is None:
                    continue
                if place[1] != size:  # truncated or foreign: a later backend may hold it whole
                    self.rejected.add(names[i])
                    continue
                out[i] = _Read(level, host, place[0])
                pieces.append((host, place[0], size, offsets[i]))
        for host, offset, nbytes in merged_copies(pieces):
            self.source[offset: offset + nbytes].copy_(host, non_blocking=True)
            self._copied = True
        for i, o in enumerate(out):
            if o is not None:
                self.rejected.discard(names[i])
        return out

    def start_verify(self, end: int) -> "_Check":
        """Start verifying blocks [first, end) (those not verified yet) and the tail in place
        on the device, on the current stream (after the copies): :meth:`finish_verify`
        waits for the answer. Started before the rows are claimed and written, it runs as
        the last copy lands, not after the host work of the writes."""
        todo = range(self.verified, end - self.first)
        kinds = [BLOCK] * len(todo) + [TAIL]
        keys = [self.keys[i] for i in todo] + [self.tail[0]]
        offsets = [i * self.block_bytes for i in todo] + [self.tail_offset]
        return _Check(end, keys, self.cache.layout.verify(self.source, kinds, keys, offsets))

    def finish_verify(self, check: "_Check") -> Tuple[int, bool]:
        """Wait for a verification: (the end of the sound blocks from the first, at most its
        ``end``; whether the tail is)."""
        sound = check.sound.tolist()  # waits for the stream it went on
        self.rejected.update(key_name(k) for k, ok in zip(check.keys, sound) if not ok)
        self.verified += next((j for j, ok in enumerate(sound[:-1]) if not ok), len(sound) - 1)
        return self.first + min(self.verified, check.end - self.first), bool(sound[-1])

    def offsets(self, end: int) -> List[int]:
        """The offsets in ``source`` of blocks [first, end)'s objects, then the tail's."""
        return [i * self.block_bytes for i in range(end - self.first)] + [self.tail_offset]

    def reads(self, end: int) -> List[_Read]:
        """Where each object a load ending at ``end`` takes was read: its blocks', then the tail's."""
        return self.read_by[:end - self.first] + [self.tail[1]]

    def loaded(self, end: int) -> List[Tuple[str, _Read, int]]:
        """(name, where it was read, bytes) of the objects a load ending at ``end`` takes."""
        layout, count = self.cache.layout, end - self.first
        names = [key_name(k) for k in self.keys[:count]] + [key_name(self.tail[0])]
        sizes = [layout.object_bytes(BLOCK)] * count + [layout.object_bytes(TAIL)]
        return list(zip(names, self.reads(end), sizes))

    def close(self, stream) -> None:
        """After the load is taken or given up: wait for copies never verified (the host
        bytes they read must stay as they are until then) and give the staging back."""
        if self._copied and stream is not None:
            stream.synchronize()
        if self._staged is not None:
            self.cache.staging.free(self._staged, self.source.numel())
            self._staged = None
