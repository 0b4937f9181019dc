"""TierCache: the KV tiers beyond HBM, as an engine drives them
(docs/serving-loop.md, "KV tiers"; docs/design.md says why it is built so).

- ``save(mgr, events)`` after each step's commit: every compress block the
  step published (a Stored event) is written through to the tiers as a block
  object, with its tail object where the SWA rows of its trailing window are
  published too. The manager runs whole chunks (``KvManager.set_whole_chunks``,
  which ``admit`` turns on), so that is every block boundary of a prompt, not
  only those a chunk's last window covers: a load can end at any of them.
  The rows are gathered and the objects sealed (header and checksum) on the
  step's stream, into the save buffer (save_buffer.py: one device buffer of
  a fixed size), so no later step can reuse or move the rows before they are
  read; the copies to host memory run on a side stream, straight into the
  memory a HostTier reserves (into staging for a backend that takes puts),
  and the objects reach the backends once they have completed (``poll``).
  Nothing waits: a staging buffer without room drops the save, a full tier
  evicts its least recently used objects.
- ``admit(mgr, seq_id, tokens)`` instead of ``mgr.allocate``: the HBM hit
  is extended by the blocks that continue it in the tiers (host first, then
  the next backend; what a later backend had is copied into the earlier
  ones), copied to the KV's device (straight out of a HostTier's memory).
  The request is admitted with that prefix as computed
  (``KvManager.allocate(loaded_tokens=...)``: the same promise and refusals)
  and its rows are written once the copies land, on a stream the step's
  stream then waits for, while the objects are verified on the device;
  admit returns once they are. A missing, truncated, foreign or corrupt
  object ends the loaded prefix before it (the rest is prompt): the
  admission is then made again with the sound prefix, so the answer the
  engine gets is final.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..manager.kv_events import KvEvent, KvEventKind, KvRole
from ..manager.kv_manager import token_tensor
from ..manager.prefix_hashing import Salt, key_tensor, swa_page_key_tensor
from ..ops import apply_row_copies
from .backend import TierBackend
from .fetch import ObjectFetch, merged_copies
from .keys import KeyChain, chain_keys, key_name, root_key, tail_key, token_bytes
from .objects import BLOCK, TAIL, ObjectLayout
from .save_buffer import SaveBuffer
from .staging import Staging, aligned

__all__ = ["TierCache"]

_STAGING_OBJECTS = 64  # default staging: at least this many objects of the larger kind
# A load's first blocks are read as soon as their keys are found, so their copies start after a few
# keys' host work; the rest are chained, looked up and read in pieces that double up to
# _LOAD_PIECE_BLOCKS while the earlier ones are copied (chaining a 32K-token prompt's keys first delayed
# the copies by ~0.9 ms of an H100 host; a 32-block read right after the first 4 blocks left the device
# idle for its host time). Every block is read before the admission, so the rows are written in one call
# behind the device's wait for the copies (_write_rows): a write costs host time whatever its length
# (~0.2 ms, H100 host), and writes of 64 blocks each, all made after the reads, left ~1.4 ms more host
# work after the last copy of a 32K-token load (H200 trace).
_FIRST_LOAD_PIECE_BLOCKS, _LOAD_PIECE_BLOCKS = 4, 32
_TAIL_BATCH = 8  # tail objects looked up at once, from the load's furthest end down
# A save goes in pieces of at most this many bytes of objects: the copy of one piece to host memory
# runs while the next is keyed, located, gathered and sealed. A piece costs ~2 ms of host time nearly
# whatever its size (keys, lookups, locating, run lists, uploads, launches; H200 trace), so pieces too
# small leave the copy waiting for the host. (A 32K-token V4-Pro prefix, 1.37 GB: two halves reached 65%
# of an H100's pinned copy, 64 MiB pieces 45%.) The blocks are keyed and located a group at a time, and
# what a group located goes into pieces as full as they can be, the rest kept for the next group's. The
# first group is as many blocks as fill a piece with their tails, saved at once, so the first copy starts
# after one piece's host work, not after every block's (keying a 32K-token prefix's 256 blocks first took
# ~4 ms of an H100 host before any copy; groups of 8, 16, 32, ... blocks kept the copy idle for ~6 ms of a
# 32K-token save while the small first groups paid that fixed cost each). Each later group is as many
# blocks as fill the piece under way at the bytes per block the last group had: most blocks of a long
# prompt have no tail (the window left them), and pieces counted as if each had one were 26 MB of a
# 128K-token prefix's blocks, whose ~2 ms of host work each outlasted their copy. (Same H100 run, 32K /
# 128K tokens: 81.8% / 80.1% of the pinned copy, against 84.0% / 66.4% with every group a piece's worth
# of blocks with tails, each saved whole.)
_SAVE_PIECE_BYTES = 192 << 20


@dataclass
class _Located:
    """Published blocks a save located (TierCache._locate): their keys, locate_blocks' rows,
    their SWA units, whether each was found, whether its tail's pages were."""
    keys: List[bytes]
    where: torch.Tensor
    units: torch.Tensor
    found: np.ndarray
    has_tail: np.ndarray

    def __add__(self, other: "_Located") -> "_Located":
        return _Located(self.keys + other.keys, torch.cat([self.where, other.where]),
                        torch.cat([self.units, other.units]), np.concatenate([self.found, other.found]),
                        np.concatenate([self.has_tail, other.has_tail]))

    def __getitem__(self, part: slice) -> "_Located":
        return _Located(self.keys[part], self.where[part], self.units[part], self.found[part], self.has_tail[part])

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class _Save:
    """Sealed objects on their way from the GPU to the backends: copied into the
    memory the lending backends reserved, and into staging for the others."""
    names: List[str]
    sizes: List[int]
    offsets: List[int]
    event: Optional[object] = None  # the copies' completion on the side stream (None: done)
    reserved: List[Tuple[TierBackend, List[str]]] = field(default_factory=list)
    put_backends: List[TierBackend] = field(default_factory=list)
    staged: Optional[int] = None    # the staging range's start, for put_backends
    nbytes: int = 0


class TierCache:
    """The tiers of one engine (``backends``, searched in order) over the KV tensors
    ``kv`` of ``plan`` (None: sizes only, for capacity studies; see ObjectLayout).

    ``staging_bytes``: host memory for objects on their way to or from a
    backend that lends no memory of its own (Mooncake; a HostTier lends its
    arena, so the GPU's copies go straight into it and out of it). Its size
    (default: room for a step's saves, the blocks of max_num_batched_tokens
    and their tails, beside one load of max_blocks_per_seq blocks; at least
    64 objects of the larger kind) also bounds a load: no load is longer than
    the staging holds, and a save that finds no room there is dropped for
    those backends.

    ``save_buffer_bytes``: the device memory the saves gather their objects
    into (save_buffer.py), allocated here; each save piece takes
    at most half of it. Default: room for two pieces of a step's saves (the
    blocks of max_num_batched_tokens and their tails), at most 2 x 192 MiB.
    Saves that outrun the copies to host memory wait on the device for them
    (``stats()["save_buffer_waits"]`` counts the pieces that did) rather than
    take more.

    Construction checks everything first and raises ValueError naming the
    argument: no backend, a backend whose capacity_bytes is below one object,
    staging below a block and a tail object, a save buffer below two of
    them."""

    def __init__(self, plan, kv, backends: Sequence[TierBackend], *, staging_bytes: Optional[int] = None,
                 save_buffer_bytes: Optional[int] = None):
        backends = list(backends)
        if not backends or not all(isinstance(b, TierBackend) for b in backends):
            raise ValueError(f"TierCache: backends must be a non-empty list of TierBackend, got {backends!r}")
        if plan.config.layout == "row_space" and kv is not None and not getattr(kv, "planes", None):
            raise ValueError("TierCache: a row-space kv must carry its planes (kv.planes, as allocate_unified_kv "
                             "gives): admit applies the row copies its admission makes to them")
        layout = ObjectLayout(plan, kv)
        largest = max(layout.object_bytes(BLOCK), layout.object_bytes(TAIL))
        for b in backends:
            capacity = b.stats()["capacity_bytes"]
            if 0 <= capacity < largest:  # (a backend that cannot tell reports -1)
                raise ValueError(f"TierCache: the {b.name} tier's capacity_bytes={capacity} is smaller than one "
                                 f"tier object ({largest} bytes for this model)")
        config = plan.config
        block, tail = aligned(layout.object_bytes(BLOCK)), aligned(layout.object_bytes(TAIL))
        step_saves = -(-config.max_num_batched_tokens // config.block_size) * (block + tail)  # a step's objects
        if staging_bytes is None:
            staging_bytes = max(_STAGING_OBJECTS * aligned(largest),
                                step_saves + config.max_blocks_per_seq * block + tail)
        if staging_bytes < 2 * aligned(largest):
            raise ValueError(f"TierCache: staging_bytes must hold a block and a tail object ({2 * aligned(largest)} "
                             f"bytes), got {staging_bytes}")
        if save_buffer_bytes is None:
            save_buffer_bytes = max(2 * (block + tail), min(2 * _SAVE_PIECE_BYTES, 2 * step_saves))
        if isinstance(save_buffer_bytes, bool) or not isinstance(save_buffer_bytes, int) or \
                save_buffer_bytes < 2 * (block + tail):
            raise ValueError(f"TierCache: save_buffer_bytes must be an int that holds a block and its tail object "
                             f"twice ({2 * (block + tail)} bytes), got {save_buffer_bytes!r}")
        self.plan, self.kv, self.config, self.layout, self.backends = plan, kv, config, layout, backends
        self._block_bytes, self._tail_bytes = block, tail
        self.device = layout.device
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.staging = Staging(staging_bytes, pinned=self.cuda)
        self.save_buffer = SaveBuffer(save_buffer_bytes, self.device)
        # A save piece's bytes: at most half the save buffer and half the staging (a step of whole chunks
        # publishes every block with its tail, which a smaller staging saves in part). The blocks keyed
        # and located at once: first as many as fill a piece with their tails, then without them.
        self._piece_bytes = min(self.staging.size // 2, self.save_buffer.half, _SAVE_PIECE_BYTES)
        self._first_group_blocks = max(1, self._piece_bytes // (block + tail))
        self._group_blocks = max(1, self._piece_bytes // block)
        for b in backends:
            b.register_buffer(self.staging.buffer)
        # Saves and loads on streams of their own: a load waits for its copies only, not for saves. A load's
        # rows are written on a third one, ordered after the step's earlier work (and the step after it):
        # written on the step's stream, they waited for every copy the load had queued (an H100 trace); on
        # a stream of the cache's own, its uploads and row copies ran between the load's copies (H200 trace).
        self.side = torch.cuda.Stream(self.device) if self.cuda else None
        self.load_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.write_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.chain = KeyChain(layout.fingerprint, limit=4 * plan.pools.num_logical_blocks + 1024)
        bs, page = self.config.block_size, self.config.swa_page
        self._ppb = bs // page
        self._tables = 1 if self.config.layout == "row_space" else len(self.config.compress_ratios)
        self._first_tail_page = (bs - layout.tail_rows) // page
        self._saves: List[_Save] = []
        self.counters = dict(saved_objects=0, saved_bytes=0, dropped_saves=0, lookups=0, loaded_requests=0,
                             loaded_blocks=0, loaded_tokens=0, loaded_bytes=0, rejected_objects=0,
                             **{f"{b.name}_fetched_objects": 0 for b in backends})

    # --- saving -------------------------------------------------------------------------
    def save(self, mgr, events: Sequence[KvEvent]) -> None:
        """After the step's commit (before the next step's allocations): write the blocks
        the events say were published through to the tiers. ``events`` are
        ``mgr.take_events()`` (pass them on to a router as well)."""
        self.poll()
        published, group, located, first = [], self._first_group_blocks, None, True
        key_of, forget, stored, compress = self.chain.key_of, self.chain.forget, KvEventKind.STORED, KvRole.COMPRESS
        for ev in events:  # (names bound above: a 128K-token prompt's save reads 8,168 events)
            if ev.kind != stored:
                forget(ev)
            elif ev.role == compress:
                data = token_bytes(ev.token_ids)
                key = key_of(ev, data)
                if key is not None:
                    published.append((key, ev, data))
                if len(published) == group:  # a group keyed: located, and its full pieces saved before the rest
                    located, group = self._save_group(mgr, published, located, whole=first)
                    published, first = [], False
        self._save_group(mgr, published, located, whole=True)

    def _locate(self, mgr, blocks) -> _Located:
        """Where the published blocks' rows are now (their SWA units [n, pages_per_block])."""
        prefix_hash, hashes = self.config.prefix_hash, [ev.block_hash for _, ev, _ in blocks]
        # the events' own tokens (checked by the manager when it made them), packed once when keyed
        tokens = torch.from_numpy(np.frombuffer(bytearray(b"".join(data for _, _, data in blocks)),
                                                dtype="<i8").astype(np.int64, copy=False))
        keys = key_tensor(hashes, prefix_hash)
        where = mgr.locate_blocks(keys, tokens)
        units = mgr.locate_pages(swa_page_key_tensor(keys, self._ppb, prefix_hash), tokens)
        units = units.view(len(blocks), self._ppb)
        found = where.numpy()[:, 0] >= 0
        has_tail = found & (units.numpy()[:, self._first_tail_page:] >= 0).all(axis=1)
        return _Located([key for key, _, _ in blocks], where, units, found, has_tail)

    def _save_group(self, mgr, published, kept: Optional[_Located], whole: bool) -> Tuple[Optional[_Located], int]:
        """Locate a group's published blocks (those not in every backend yet) after the blocks
        ``kept`` from the groups before, and save them in pieces of at most ``_piece_bytes`` of
        objects (at least one block's): the full ones, or all with ``whole``. Returns the
        blocks kept for the next group, and how many blocks that group should be: as many as
        fill the piece under way at the bytes per block this one had."""
        everywhere = self._present([key_name(key) for key, _, _ in published], everywhere=True)
        blocks = [block for block, saved in zip(published, everywhere) if not saved]
        group = self._locate(mgr, blocks) if blocks else None
        located = group if kept is None else kept if group is None else kept + group
        if located is None:  # nothing to save yet, nor bytes per block to go by
            return None, self._group_blocks
        sizes = (located.found * self._block_bytes + located.has_tail * self._tail_bytes).tolist()
        start, piece = 0, 0
        for i, size in enumerate(sizes):
            if piece + size > self._piece_bytes and piece:
                self._save_objects(located[start:i])
                start, piece = i, 0
            piece += size
        if whole or piece + self._block_bytes > self._piece_bytes:  # (full: not even a block without tail fits)
            self._save_objects(located[start:])
            start, piece = len(located), 0
        per_block = max(1, sum(sizes[-len(group):]) // len(group)) if group else self._block_bytes
        next_group = min(self._group_blocks, max(1, -(-(self._piece_bytes - piece) // per_block)))
        return (located[start:] if start < len(located) else None), next_group

    def _save_objects(self, piece: _Located) -> None:
        """Gather, seal and start copying one piece's objects to the backends."""
        where, units, found, has_tail = piece.where, piece.units, piece.found, piece.has_tail
        keys = [k for k, f in zip(piece.keys, found.tolist()) if f]
        n_blocks = len(keys)
        keys += [tail_key(k) for k, t in zip(piece.keys, has_tail.tolist()) if t]
        n_tails = len(keys) - n_blocks
        if not keys:
            return
        kinds = [BLOCK] * n_blocks + [TAIL] * n_tails
        sizes = [self.layout.object_bytes(BLOCK)] * n_blocks + [self.layout.object_bytes(TAIL)] * n_tails
        offsets, nbytes = self._offsets_of(sizes)
        # Gathered and sealed on the step's stream, so no later step reuses or moves the rows first.
        step = torch.cuda.current_stream(self.device) if self.cuda else None
        place, target = self.save_buffer.take(nbytes, step)
        if n_blocks:
            self.layout.gather(BLOCK, where[torch.from_numpy(found)], target, offsets[:n_blocks])
        if len(kinds) > n_blocks:
            self.layout.gather(TAIL, units[torch.from_numpy(has_tail)], target, offsets[n_blocks:])
        self.layout.seal(target, kinds, keys, offsets)
        save = _Save([key_name(k) for k in keys], sizes, offsets, nbytes=nbytes)
        with self._stream(self.side, after_current=True):
            for backend in self.backends:
                self._copy_to_backend(save, backend, target)
            if save.put_backends:
                save.staged = self.staging.take(nbytes)
                if save.staged is None:
                    self.counters["dropped_saves"] += len(kinds) * len(save.put_backends)
                    save.put_backends = []
                else:
                    self.staging.buffer[save.staged: save.staged + nbytes].copy_(target, non_blocking=True)
            if self.cuda:
                save.event = torch.cuda.Event()
                save.event.record(self.side)
        self.save_buffer.copying(place, save.event)
        self._saves.append(save)
        self.poll()

    def _copy_to_backend(self, save: _Save, backend: TierBackend, target: torch.Tensor) -> None:
        """Into the memory ``backend`` reserves for the objects; a backend that lends
        none is left for a put from staging."""
        lent = backend.reserve(save.names, save.sizes)
        if lent is None:
            save.put_backends.append(backend)
            return
        host, places = lent
        taken = [i for i, place in enumerate(places) if place is not None]
        refused = [save.names[i] for i, place in enumerate(places) if place is None]
        if refused:  # stored already, or no room that is not reserved
            self.counters["dropped_saves"] += sum(not p for p in backend.contains(refused))
        pieces = [(host, places[i][0], save.sizes[i], save.offsets[i]) for i in taken]
        for view, offset, size in merged_copies(pieces):
            view.copy_(target[offset: offset + size], non_blocking=True)
        save.reserved.append((backend, [save.names[i] for i in taken]))

    def poll(self) -> None:
        """Hand the saves whose copies have completed to the backends (no waiting)."""
        while self._saves and (self._saves[0].event is None or self._saves[0].event.query()):
            self._store(self._saves.pop(0))

    def flush(self) -> None:
        """Wait for every save in flight and store it (shutdown, tests)."""
        for save in self._saves:
            if save.event is not None:
                save.event.synchronize()
        self.poll()

    def _store(self, save: _Save) -> None:
        size_of = dict(zip(save.names, save.sizes))
        for backend, names in save.reserved:
            backend.commit(names, [True] * len(names))
            self.counters["saved_objects"] += len(names)
            self.counters["saved_bytes"] += sum(size_of[n] for n in names)
        if save.staged is None:
            return
        buffers = [self.staging.buffer[save.staged + o: save.staged + o + n] for o, n in zip(save.offsets, save.sizes)]
        for backend in save.put_backends:
            missing = [i for i, present in enumerate(backend.contains(save.names)) if not present]
            stored = backend.put([save.names[i] for i in missing], [buffers[i] for i in missing]) if missing else []
            self.counters["saved_objects"] += sum(stored)
            self.counters["saved_bytes"] += sum(save.sizes[i] for i, ok in zip(missing, stored) if ok)
        self.staging.free(save.staged, save.nbytes)

    # --- loading ------------------------------------------------------------------------
    def admit(self, mgr, seq_id: int, tokens, *, salt: Salt = None, max_load_tokens: Optional[int] = None) -> int:
        """``mgr.allocate(seq_id, tokens, salt=salt)`` with the prefix the tiers hold beyond
        the HBM hit loaded into the sequence's rows: same answers (the cached prefix in
        tokens, or NOT_NOW / NEVER_FITS with nothing changed). ``max_load_tokens`` bounds
        what one admission loads (None: what the tiers hold; in the row space the manager
        also bounds it by its copy list's share for loads).

        The objects are copied to the KV's device on a stream of their own. The
        sequence is admitted with them as computed as soon as the load's end is
        known, and its rows are written from the objects once their copies land,
        on a stream the current stream then waits for (after the row copies its
        admission made, which admit stages and applies as ``KvReceiver`` does:
        call it between steps, on the stream the steps run on). Admit returns
        once the objects are verified on the device, so it takes about the PCIe
        time of the bytes. A missing, truncated, foreign or corrupt object ends
        the loaded prefix before it: then the sequence is freed (once the
        current stream has written what it was given) and admitted again with
        the sound prefix, so the answer is final and only verified KV is ever
        computed on.

        The first admission turns the manager's whole chunks on
        (``KvManager.set_whole_chunks``), which keeps a reserve of SWA pages
        apart: make it before the manager admits requests by itself (a
        RuntimeError otherwise, if their promises leave no room)."""
        if self.config.enable_prefix_caching and not mgr.whole_chunks:
            mgr.set_whole_chunks(True)  # a tail at every block boundary of a prompt
        tokens = token_tensor(tokens)  # checked once for the manager's calls
        span = self._span(mgr, tokens, salt, max_load_tokens)
        if span is None:
            return mgr.allocate(seq_id, tokens, salt=salt)
        step = torch.cuda.current_stream(self.device) if self.cuda else None
        if step is not None:  # the rows' writes follow the step's work so far (queued before any copy)
            self.write_stream.wait_stream(step)
        with self._stream(self.load_stream, after_current=False):
            fetch = ObjectFetch(self, *span)
            try:
                return self._load(mgr, seq_id, tokens, salt, fetch, step)
            finally:
                fetch.close(self.load_stream)

    def _span(self, mgr, tokens: torch.Tensor, salt: Salt, max_tokens: Optional[int]) -> Optional[Tuple[int, int]]:
        """The blocks [first, last) a load may read: after the HBM hit, within the prompt,
        the staging and the manager's bound; None when there are none."""
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
        # The manager's bound on a load (the row space binds no more rows than its copy list has room for): the
        # most of last * bs it would take, so no key past it is computed and no load ends past it. (A 128K-token
        # prompt's 1,024 keys took 8 ms on an H100 host; a step of the benchmark binds 323 of its blocks.)
        last = min(last, mgr.can_allocate(tokens, salt=salt, loaded_tokens=last * bs) // bs)
        return (first, last) if last > first else None

    def _load(self, mgr, seq_id: int, tokens: torch.Tensor, salt: Salt, fetch: ObjectFetch, step) -> int:
        """Read the blocks the backends hold, admit with the furthest end that has a tail
        object, and write the rows once the copies land; an end found unsound is given back,
        and the next one below the sound blocks tried. Without any: a plain allocate."""
        bs, first = self.config.block_size, fetch.first
        top = self._read_held(fetch, tokens, salt)  # no load ends past it
        for end, key in self._tail_ends(fetch.keys, first):
            if end > top or not fetch.read_tail(key):
                continue
            check = fetch.start_verify(end)
            cached = mgr.allocate(seq_id, tokens, salt=salt, loaded_tokens=end * bs)
            if cached < 0 or cached <= first * bs:  # refused, or admitted with the HBM hit alone
                return cached
            sound = cached // bs  # fewer loaded than asked (the row space's share): the load ends there or below
            if cached == end * bs:
                try:
                    self._write_rows(mgr, seq_id, fetch, end, step)
                    sound, tail_sound = fetch.finish_verify(check)
                except BaseException:  # the admission is undone (once the rows' writes ran), then the error
                    self._give_back(mgr, seq_id, step)
                    raise
                if sound == end and tail_sound:
                    self._took(fetch, end)
                    return cached
            self._give_back(mgr, seq_id, step if cached == end * bs else None)  # (else no row was written)
            top = min(top, sound, end - 1)
        self.counters["rejected_objects"] += len(fetch.rejected)
        return mgr.allocate(seq_id, tokens, salt=salt)

    @staticmethod
    def _give_back(mgr, seq_id: int, step) -> None:
        """Free an admission whose load failed, once the step's stream has written what it was
        given (nothing lands in rows the sequence no longer holds)."""
        if step is not None:
            step.synchronize()
        mgr.deallocate([seq_id])

    def _read_held(self, fetch: ObjectFetch, tokens: torch.Tensor, salt: Salt) -> int:
        """Read blocks [first, last) as their keys are chained and found, up to the first one
        no backend holds whole: the first _FIRST_LOAD_PIECE_BLOCKS at once, so the copies
        start after a few keys' host work, then pieces twice as large as the one before, up
        to _LOAD_PIECE_BLOCKS, each read while the earlier ones are copied (a block's read
        takes a third of its copy's time, so the device waits little for each next piece,
        where one large read after the first few left it idle). The end of the blocks read
        (``fetch.keys`` holds their keys). All are read before the admission: _span checked
        that the manager admits up to ``last`` now, and the rows' writes then wait for
        nothing but copies already under way."""
        bs, first, last = self.config.block_size, fetch.first, fetch.last
        parent = root_key(self.layout.fingerprint, salt)
        if first:
            parent = chain_keys(parent, tokens, bs, first)[-1]  # the HBM hit's blocks: the chain's start
        count = min(_FIRST_LOAD_PIECE_BLOCKS, last - first)
        while count:
            start = first + len(fetch.keys)
            keys = chain_keys(parent, tokens, bs, count, start=start)
            names = [key_name(k) for k in keys]
            present = self._present(names)
            found = present.index(False) if False in present else len(keys)
            if (fetch.blocks(keys[:found], names[:found]) if found else 0) < count:
                break  # one not held, or read and not whole: no load goes past it
            parent, count = keys[-1], min(2 * count, _LOAD_PIECE_BLOCKS, last - start - count)
        return first + len(fetch.keys)

    def _tail_ends(self, held: List[bytes], first: int):
        """(end, its tail object's key) of the block boundaries a load may end at, from the
        furthest down: those of the blocks held where a backend holds a tail object
        (looked up _TAIL_BATCH at a time, as the furthest one is usually there)."""
        high = first + len(held)
        while high > first:
            ends = range(high, max(first, high - _TAIL_BATCH), -1)
            keys = [tail_key(held[end - 1 - first]) for end in ends]
            present = self._present([key_name(key) for key in keys])
            yield from ((end, key) for end, key, have in zip(ends, keys, present) if have)
            high = ends[-1] - 1

    def _write_rows(self, mgr, seq_id: int, fetch: ObjectFetch, end: int, step) -> None:
        """Write blocks [first, end)'s objects, with the tail, into the rows the sequence was
        just given, on the write stream (the step's stream then waits for it), after the row
        copies its admission made, behind the device's wait for their copies (no host wait).
        The blocks go in one call, then the tail: a write's uploads (its run lists, the
        admission's tables) queue behind the load's copies on the device's copy engine, so
        a write of the blocks read first ran after the last copy all the same (H100 trace),
        and each call costs ~0.2 ms of host time. Each call's run lists are uploaded before
        its wait for the copies."""
        first, planes, count = fetch.first, getattr(self.kv, "planes", ()), end - fetch.first
        writes = self.write_stream
        try:
            with self._stream(writes, after_current=False):
                mgr.stage([seq_id])  # takes the unit moves this admission made (row space) ...
                mgr.upload(1)
                if planes:           # ... and makes them before any row is written
                    apply_row_copies(list(planes), mgr.row_copies, mgr.row_copy_counts)
                tables = [mgr.logical_table(seq_id)] + [mgr.phys_table(seq_id, t) for t in range(self._tables)]
                where = torch.stack([t[first:end] for t in tables], dim=1)
                units = mgr.staged_swa_table(seq_id)[(end - 1) * self._ppb: end * self._ppb].view(1, -1)
                offsets = fetch.offsets(end)
                self.layout.scatter(BLOCK, where, fetch.source, offsets[:-1],
                                    ready=functools.partial(fetch.wait, writes, count))
                self.layout.scatter(TAIL, units, fetch.source, offsets[-1:],
                                    ready=functools.partial(fetch.wait, writes, count, tail=True))
                if writes is not None:
                    fetch.source.record_stream(writes)  # read there after admit returns
        finally:
            if step is not None:
                step.wait_stream(writes)  # the step reads the rows after they are written

    def _took(self, fetch: ObjectFetch, end: int) -> None:
        """Count a load and its objects by the backend that had them, and copy those a
        later backend had into the earlier ones."""
        c, blocks = self.counters, end - fetch.first
        c["rejected_objects"] += len(fetch.rejected)
        c["loaded_requests"] += 1
        c["loaded_blocks"] += blocks
        c["loaded_tokens"] += blocks * self.config.block_size
        c["loaded_bytes"] += blocks * self.layout.object_bytes(BLOCK) + self.layout.object_bytes(TAIL)
        levels = collections.Counter(read.level for read in fetch.reads(end))
        for level, count in levels.items():
            c[f"{self.backends[level].name}_fetched_objects"] += count
        if levels.keys() - {0}:  # some came from a later backend (only then are the objects named)
            self._copy_nearer([(name, read.level, read.bytes(size)) for name, read, size in fetch.loaded(end)
                               if read.level])

    def _copy_nearer(self, objects: List[Tuple[str, int, torch.Tensor]]) -> None:
        """What a later backend had, (name, its level, its bytes), goes into the backends
        searched before it (a later load finds it nearer)."""
        for level in range(1, len(self.backends)):
            found = [(name, data) for name, at, data in objects if at == level]
            for nearer in self.backends[:level] if found else ():
                self._put_host(nearer, [name for name, _ in found], [data for _, data in found])

    def _put_host(self, backend: TierBackend, names: List[str], sources: List[torch.Tensor]) -> None:
        """Objects in host memory into ``backend``: into the memory it lends, else by
        put, from staging (copied there first unless they are there)."""
        lent = backend.reserve(names, [t.numel() for t in sources])
        if lent is not None:
            host, places = lent
            for place, source in zip(places, sources):
                if place is not None:
                    host[place[0]: place[0] + place[1]].copy_(source)
            taken = [n for n, place in zip(names, places) if place is not None]
            backend.commit(taken, [True] * len(taken))
            return
        staging = self.staging.buffer.untyped_storage().data_ptr()
        if all(t.untyped_storage().data_ptr() == staging for t in sources):
            backend.put(names, sources)
            return
        offsets, nbytes = self._offsets_of([t.numel() for t in sources])
        start = self.staging.take(nbytes)
        if start is None:
            return  # no room now: a later load copies them
        staged = [self.staging.buffer[start + o: start + o + t.numel()] for o, t in zip(offsets, sources)]
        for dst, src in zip(staged, sources):
            dst.copy_(src)
        backend.put(names, staged)
        self.staging.free(start, nbytes)

    # --- helpers ---------------------------------------------------------------------
    @staticmethod
    def _offsets_of(sizes: List[int]):
        """Each object's offset in a buffer of objects of these sizes (64-byte aligned), and the
        buffer's bytes."""
        offsets = [0, *itertools.accumulate(aligned(size) for size in sizes)]
        return offsets[:-1], offsets[-1]

    def _stream(self, stream, after_current: bool):
        """Work on ``stream`` (after the current stream's work so far, if asked); on the CPU, inline."""
        if stream is None:
            return contextlib.nullcontext()
        if after_current:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(stream)

    def _present(self, names: List[str], everywhere: bool = False) -> List[bool]:
        """Whether any backend (every backend, with ``everywhere``) holds each name."""
        if not names:
            return []
        combine = all if everywhere else any
        return [combine(held) for held in zip(*(backend.contains(names) for backend in self.backends))]

    def stats(self) -> Dict[str, int]:
        """The counters, and each backend's stats prefixed by its name."""
        out = dict(self.counters, save_buffer_waits=self.save_buffer.waits)
        for b in self.backends:
            out.update({f"{b.name}_{k}": v for k, v in b.stats().items()})
        return out
