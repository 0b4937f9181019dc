"""TierCache: the KV tiers beyond HBM, as an engine drives them
(docs/serving-loop.md, "KV tiers"; docs/design.md says why it is built so).

- ``save(mgr, events)`` after each step's commit: every compress block the
  step published (a Stored event) is written through to the tiers as a block
  object, with its tail object where the SWA rows of its trailing window are
  published too. The manager runs whole chunks (``KvManager.set_whole_chunks``,
  which ``admit`` turns on), so that is every block boundary of a prompt, not
  only those a chunk's last window covers: a load can end at any of them. The rows are gathered on the step's stream, so no later
  step can reuse or move them before they are read; the copy to host memory
  runs on a side stream, and the objects reach the backends once it has
  completed (``poll``). Nothing waits: a staging buffer without room drops
  the save, a full tier evicts its least recently used objects.
- ``admit(mgr, seq_id, tokens)`` instead of ``mgr.allocate``: the HBM hit
  is extended by the blocks that continue it in the tiers (host first, then
  the next backend; what a later backend had is copied into the earlier
  ones), fetched into host memory and verified before anything is claimed, so a missing, truncated, foreign or corrupt object just ends
  the loaded prefix there (the rest is prompt). The request is admitted with
  that prefix as computed (``KvManager.allocate(loaded_tokens=...)``: the
  same promise and refusals); the copy to the GPU starts on the side stream.
- ``fill(mgr)`` in every step after the row copies and before the forward:
  the loaded objects are scattered into the rows their sequences hold now,
  on the step's stream after it waited for the copy's event (no host sync).
  A sequence that ended (or was preempted) in between gets nothing written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..manager.kv_events import KvEvent, KvEventKind, KvRole
from ..manager.prefix_hashing import Salt, key_tensor, swa_page_hashes
from .backend import TierBackend
from .keys import KeyChain, chain_keys, key_name, root_key, tail_key
from .objects import BLOCK, TAIL, ObjectLayout
from .staging import Staging, aligned

__all__ = ["TierCache"]

_STAGING_OBJECTS = 64  # default staging: at least this many objects of the larger kind


@dataclass
class _Objects:
    """A contiguous staging range holding objects (kind, key) at offsets from its start."""
    start: int
    nbytes: int
    kinds: List[int] = field(default_factory=list)
    keys: List[bytes] = field(default_factory=list)
    offsets: List[int] = field(default_factory=list)
    device_copy: Optional[torch.Tensor] = None
    event: Optional[object] = None


@dataclass
class _Load:
    begin: int   # the HBM hit in tokens: rows below it are the prefix cache's
    end: int     # the loaded prefix's end
    objects: _Objects


class TierCache:
    """The tiers of one engine (``backends``, searched in order) over the KV tensors
    ``kv`` of ``plan`` (None: sizes only, for capacity studies; see ObjectLayout).

    ``staging_bytes``: host memory for the objects in flight (default: room
    for a step's saves, the blocks of max_num_batched_tokens and their tails,
    beside one load of max_blocks_per_seq blocks; at least 64 objects of the
    larger kind); a save that finds no room is dropped, a load that finds none
    loads nothing, and no load is longer than the staging holds. Construction checks everything first and
    raises ValueError naming the argument: no backend, a backend whose
    capacity_bytes is below one object, staging below one load's objects."""

    def __init__(self, plan, kv, backends: Sequence[TierBackend], *, staging_bytes: Optional[int] = None):
        backends = list(backends)
        if not backends or not all(isinstance(b, TierBackend) for b in backends):
            raise ValueError(f"TierCache: backends must be a non-empty list of TierBackend, got {backends!r}")
        layout = ObjectLayout(plan, kv)
        largest = max(layout.object_bytes(BLOCK), layout.object_bytes(TAIL))
        for b in backends:
            capacity = b.stats()["capacity_bytes"]
            if 0 <= capacity < largest:  # (a backend that cannot tell reports -1)
                raise ValueError(f"TierCache: the {b.name} tier's capacity_bytes={capacity} is smaller than one "
                                 f"tier object ({largest} bytes for this model)")
        config = plan.config
        block, tail = aligned(layout.object_bytes(BLOCK)), aligned(layout.object_bytes(TAIL))
        if staging_bytes is None:
            step_blocks = -(-config.max_num_batched_tokens // config.block_size)
            staging_bytes = max(_STAGING_OBJECTS * aligned(largest),
                                step_blocks * (block + tail) + config.max_blocks_per_seq * block + tail)
        if staging_bytes < 2 * aligned(largest):
            raise ValueError(f"TierCache: staging_bytes must hold a block and a tail object ({2 * aligned(largest)} "
                             f"bytes), got {staging_bytes}")
        self.plan, self.config, self.layout, self.backends = plan, config, layout, backends
        self._block_bytes, self._tail_bytes = block, tail
        self.device = layout.device
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.staging = Staging(staging_bytes, pinned=self.cuda)
        for b in backends:
            b.register_buffer(self.staging.buffer)
        self.side = torch.cuda.Stream(self.device) if self.cuda else None
        self.chain = KeyChain(layout.fingerprint, limit=4 * plan.pools.num_logical_blocks + 1024)
        bs, page = self.config.block_size, self.config.swa_page
        self._ppb = bs // page
        self._tables = 1 if self.config.layout == "row_space" else len(self.config.compress_ratios)
        self._first_tail_page = (bs - layout.tail_rows) // page
        self._saves: List[_Objects] = []
        self._loads: Dict[int, _Load] = {}
        self.counters = dict(saved_objects=0, saved_bytes=0, dropped_saves=0, lookups=0, loaded_requests=0,
                             loaded_blocks=0, loaded_tokens=0, loaded_bytes=0, rejected_objects=0,
                             cancelled_loads=0, **{f"{b.name}_fetched_objects": 0 for b in backends})

    # --- saving -------------------------------------------------------------------------
    def save(self, mgr, events: Sequence[KvEvent]) -> None:
        """After the step's commit (before the next step's allocations): write the blocks
        the events say were published through to the tiers. ``events`` are
        ``mgr.take_events()`` (pass them on to a router as well)."""
        self.poll()
        blocks = []
        for ev in events:
            if ev.kind != KvEventKind.STORED:
                self.chain.forget(ev)
            elif ev.role == KvRole.COMPRESS:
                key = self.chain.key_of(ev)
                if key is not None and not all(self._contains([key_name(key)], b)[0] for b in self.backends):
                    blocks.append((key, ev))
        # In pieces of at most half the staging: a step of whole chunks publishes
        # every block with its tail, which a smaller staging saves in part.
        piece = max(1, self.staging.size // (2 * (self._block_bytes + self._tail_bytes)))
        for i in range(0, len(blocks), piece):
            self._save_blocks(mgr, blocks[i: i + piece])

    def _save_blocks(self, mgr, blocks) -> None:
        prefix_hash, hashes = self.config.prefix_hash, [ev.block_hash for _, ev in blocks]
        tokens = torch.tensor([t for _, ev in blocks for t in ev.token_ids], dtype=torch.int64)
        where = mgr.locate_blocks(key_tensor(hashes, prefix_hash), tokens)
        pages = swa_page_hashes(hashes, self._ppb, prefix_hash)
        units = mgr.locate_pages(key_tensor(pages, prefix_hash), tokens).view(len(blocks), self._ppb)
        found = where[:, 0] >= 0
        has_tail = found & (units[:, self._first_tail_page:] >= 0).all(dim=1)
        kinds = [BLOCK] * int(found.sum()) + [TAIL] * int(has_tail.sum())
        keys = [k for (k, _), f in zip(blocks, found.tolist()) if f] + \
            [tail_key(k) for (k, _), t in zip(blocks, has_tail.tolist()) if t]
        objects = self._take(kinds, keys)
        if objects is None:
            self.counters["dropped_saves"] += len(kinds)
            return
        n_blocks = int(found.sum())
        target = torch.empty(objects.nbytes, dtype=torch.uint8, device=self.device) if self.cuda else \
            self.staging.buffer[objects.start: objects.start + objects.nbytes]
        if n_blocks:
            self.layout.gather(BLOCK, where[found], target, objects.offsets[:n_blocks])
        if len(kinds) > n_blocks:
            self.layout.gather(TAIL, units[has_tail], target, objects.offsets[n_blocks:])
        if self.cuda:
            # The rows were read on the step's stream; only the staging copy runs beside it.
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                self._host(objects).copy_(target, non_blocking=True)
                objects.event = torch.cuda.Event()
                objects.event.record(self.side)
            target.record_stream(self.side)
        self._saves.append(objects)
        self.poll()

    def poll(self) -> None:
        """Hand the saves whose copy has completed to the backends (no waiting)."""
        while self._saves and (self._saves[0].event is None or self._saves[0].event.query()):
            self._store(self._saves.pop(0))

    def flush(self) -> None:
        """Wait for every save in flight and store it (shutdown, tests)."""
        for objects in self._saves:
            if objects.event is not None:
                objects.event.synchronize()
        self.poll()

    def _store(self, objects: _Objects) -> None:
        buffers = []
        for kind, key, offset in zip(objects.kinds, objects.keys, objects.offsets):
            obj = self._object(objects, kind, offset)
            self.layout.seal(kind, key, obj)
            buffers.append(obj)
        names = [key_name(k) for k in objects.keys]
        for backend in self.backends:
            missing = [i for i, present in enumerate(self._contains(names, backend)) if not present]
            stored = backend.put([names[i] for i in missing], [buffers[i] for i in missing]) if missing else []
            self.counters["saved_objects"] += sum(stored)
            self.counters["saved_bytes"] += sum(buffers[i].numel() for i, ok in zip(missing, stored) if ok)
        self.staging.free(objects.start, objects.nbytes)

    # --- loading ------------------------------------------------------------------------
    def admit(self, mgr, seq_id: int, tokens, *, salt: Salt = None, max_load_tokens: Optional[int] = None) -> int:
        """``mgr.allocate(seq_id, tokens, salt=salt)`` with the prefix the tiers hold beyond
        the HBM hit loaded: same answers (the cached prefix in tokens, or NOT_NOW /
        NEVER_FITS with nothing changed). ``max_load_tokens`` bounds what one
        admission loads (None: what the tiers hold; in the row space the manager
        also bounds it by its copy list's share for loads in this step).

        The first admission turns the manager's whole chunks on
        (``KvManager.set_whole_chunks``), which keeps a reserve of SWA pages
        apart: make it before the manager admits requests by itself (a
        RuntimeError otherwise, if their promises leave no room)."""
        self.cancel_loads([seq_id])
        if self.config.enable_prefix_caching and not mgr.whole_chunks:
            mgr.set_whole_chunks(True)  # a tail at every block boundary of a prompt
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        load = self._find(mgr, tokens, salt, max_load_tokens)
        cached = mgr.allocate(seq_id, tokens, salt=salt, loaded_tokens=0 if load is None else load.end)
        if load is None:
            return cached
        if cached != load.end:  # refused: nothing was claimed
            self.staging.free(load.objects.start, load.objects.nbytes)
            return cached
        self._to_device(load.objects)
        self._loads[seq_id] = load
        c = self.counters
        c["loaded_requests"] += 1
        c["loaded_blocks"] += (load.end - load.begin) // self.config.block_size
        c["loaded_tokens"] += load.end - load.begin
        c["loaded_bytes"] += sum(self.layout.object_bytes(k) for k in load.objects.kinds)
        return cached

    def _find(self, mgr, tokens: List[int], salt: Salt, max_tokens: Optional[int]) -> Optional[_Load]:
        """The longest verified continuation of the HBM hit: its objects in staging."""
        bs = self.config.block_size
        hit = mgr.can_allocate(tokens, salt=salt)
        if hit < 0 or not self.config.enable_prefix_caching:
            return None
        self.counters["lookups"] += 1
        first, last = hit // bs, (len(tokens) - 1) // bs
        if max_tokens is not None:
            last = min(last, first + max(0, max_tokens) // bs)
        last = min(last, first + (self.staging.size - self._tail_bytes) // self._block_bytes)  # it fits the staging
        if last <= first:
            return None
        keys = chain_keys(root_key(self.layout.fingerprint, salt), tokens, bs, last)
        present = self._present([key_name(k) for k in keys[first:]])
        run = present.index(False) if False in present else len(present)
        tails = self._present([key_name(tail_key(k)) for k in keys[first: first + run]])
        ends = [first + 1 + i for i, t in enumerate(tails) if t]  # block boundaries a load may end at
        if ends:
            reach = mgr.can_allocate(tokens, salt=salt, loaded_tokens=ends[-1] * bs)
            ends = [e for e in ends if e * bs <= reach]
        while ends:
            end = ends[-1]
            objects, limit = self._fetch(keys, first, end)
            if objects is not None:
                return _Load(first * bs, end * bs, objects)
            ends = [e for e in ends if e <= limit]
        return None

    def _fetch(self, keys: List[bytes], first: int, end: int):
        """The block objects [first, end) and the tail object at ``end`` in staging, verified:
        (objects, _) or (None, the highest boundary still worth trying)."""
        objects = self._take([BLOCK] * (end - first) + [TAIL], keys[first:end] + [tail_key(keys[end - 1])])
        if objects is None:
            return None, -1
        names = [key_name(k) for k in objects.keys]
        bufs = [self._object(objects, kind, off) for kind, off in zip(objects.kinds, objects.offsets)]
        good = [False] * len(names)
        for level, backend in enumerate(self.backends):
            todo = [i for i, ok in enumerate(good) if not ok]
            if not todo:
                break
            sizes = backend.get([names[i] for i in todo], [bufs[i] for i in todo])
            found = []
            for i, size in zip(todo, sizes):
                good[i] = size >= 0 and self.layout.verify(objects.kinds[i], objects.keys[i], bufs[i], size)
                self.counters["rejected_objects"] += size >= 0 and not good[i]
                self.counters[f"{backend.name}_fetched_objects"] += good[i]
                if good[i]:
                    found.append(i)
            # Found further down: copied into the tiers searched before (a later load finds it nearer).
            if found:
                for nearer in self.backends[:level]:
                    nearer.put([names[i] for i in found], [bufs[i] for i in found])
        if all(good):
            return objects, end
        self.staging.free(objects.start, objects.nbytes)
        bad = good.index(False)
        return None, (first + bad if bad < end - first else end - 1)

    def fill(self, mgr) -> None:
        """In every step, after its row copies are applied and before its forward: write
        the loaded objects into their sequences' rows (on the current stream)."""
        bs = self.config.block_size
        for seq_id, load in list(self._loads.items()):
            del self._loads[seq_id]
            if not mgr.has_sequence(seq_id) or mgr.num_computed(seq_id) != load.end:
                self._release(load.objects)  # it ended meanwhile: its rows are not its own any more
                self.counters["cancelled_loads"] += 1
                continue
            first, end = load.begin // bs, load.end // bs
            tables = [mgr.logical_table(seq_id)] + [mgr.phys_table(seq_id, t)
                                                    for t in range(self._tables)]
            where = torch.stack([t[first:end] for t in tables], dim=1)
            units = mgr.staged_swa_table(seq_id)[(end - 1) * self._ppb: end * self._ppb].view(1, -1)
            objects = load.objects
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(objects.event)
                source = objects.device_copy
                source.record_stream(torch.cuda.current_stream(self.device))
            else:
                source = self.staging.buffer[objects.start: objects.start + objects.nbytes]
            self.layout.scatter(BLOCK, where, source, objects.offsets[:-1])
            self.layout.scatter(TAIL, units, source, objects.offsets[-1:])
            self._release(objects)

    def cancel_loads(self, seq_ids: Sequence[int]) -> None:
        """Drop the loads of sequences the engine deallocates or preempts before their
        first step (``fill`` drops them as well when it finds them ended)."""
        for seq_id in seq_ids:
            load = self._loads.pop(seq_id, None)
            if load is not None:
                self._release(load.objects)
                self.counters["cancelled_loads"] += 1

    def _to_device(self, objects: _Objects) -> None:
        if not self.cuda:
            return
        with torch.cuda.stream(self.side):
            objects.device_copy = torch.empty(objects.nbytes, dtype=torch.uint8, device=self.device)
            objects.device_copy.copy_(self._host(objects), non_blocking=True)
            objects.event = torch.cuda.Event()
            objects.event.record(self.side)

    def _release(self, objects: _Objects) -> None:
        # The host range is free once the copy to the device has read it.
        if objects.event is not None:
            self._saves.append(_Objects(objects.start, objects.nbytes, event=objects.event))
        else:
            self.staging.free(objects.start, objects.nbytes)
        objects.device_copy = None

    # --- helpers ------------------------------------------------------------------------
    def _take(self, kinds: List[int], keys: List[bytes]) -> Optional[_Objects]:
        offsets, total = [], 0
        for kind in kinds:
            offsets.append(total)
            total += aligned(self.layout.object_bytes(kind))
        start = self.staging.take(total) if total else None
        return None if start is None else _Objects(start, total, kinds, keys, offsets)

    def _host(self, objects: _Objects) -> torch.Tensor:
        return self.staging.buffer[objects.start: objects.start + objects.nbytes]

    def _object(self, objects: _Objects, kind: int, offset: int) -> torch.Tensor:
        start = objects.start + offset
        return self.staging.buffer[start: start + self.layout.object_bytes(kind)]

    @staticmethod
    def _contains(names: List[str], backend: TierBackend) -> List[bool]:
        return backend.contains(names)

    def _present(self, names: List[str]) -> List[bool]:
        """Whether any backend holds each name."""
        present = [False] * len(names)
        for backend in self.backends:
            for i, p in enumerate(backend.contains(names)):
                present[i] = present[i] or p
        return present

    def stats(self) -> Dict[str, int]:
        """The counters, and each backend's stats prefixed by its name."""
        out = dict(self.counters)
        for b in self.backends:
            out.update({f"{b.name}_{k}": v for k, v in b.stats().items()})
        return out
