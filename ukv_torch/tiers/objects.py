"""Tier objects: what a prefix hit needs, in bytes that do not depend on the layout.

Two kinds of object, each a 64-byte header and a payload:

- a **block object** holds one compress block: layer after layer (compress
  layers only), the block's ``k = block_size / ratio`` compressed rows of
  the layer's KV tensor and then of its RoPE tensor (where the model has
  one), then the CSA indexer entries of the block (CSA layers with one);
- a **tail object** holds the sliding-window rows a hit ending at a block's
  end needs: layer after layer (every layer), the rows of the ``window - 1``
  positions before the block's end, KV tensor then RoPE tensor.

Rows are addressed by position and block, never by page or slot, so any
layout and SWA page size restores what any other saved (the transfer
buffer's rule, ``ukv_torch.transfer``). The header:

    magic "UKVT", version (1 byte), kind (1 byte), 2 zero bytes,
    payload bytes (8, little-endian), model fingerprint (16), key (16),
    checksum (16) of the 48 bytes before it and the payload.

An object is accepted only when its size, magic, version, kind, fingerprint
and key are the expected ones and its checksum matches: a truncated, corrupt,
foreign (other model) or misplaced object is a miss, never KV. The checksum
(csrc/kernels/object_checksum.h: position-keyed word terms summed in two
64-bit lanes) is computed where the bytes are, by ``ukv.seal_objects`` and
``ukv.verify_objects``: on the GPU for a CUDA KV, in parallel blocks at
device memory speed, so neither a save nor a load passes its bytes through a
host thread. It catches corruption; what ties an object to its prefix, model
and tenant is its key (a cryptographic chain, keys.py), which the header
repeats.
"""
from __future__ import annotations

import struct
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ..ops import gather_rows, scatter_rows, swa_slot_mapping
from ..plan.records import KvPlan
from ..transfer import _run_block
from .keys import fingerprint
from .uploads import Uploads

__all__ = ["BLOCK", "TAIL", "HEADER_BYTES", "ObjectLayout"]

BLOCK, TAIL = 0, 1
HEADER_BYTES = 64
CSA_RATIO = 4
_MAGIC, _VERSION = b"UKVT", 2
_FIXED = struct.Struct("<4sBBHQ")  # magic, version, kind, 0, payload bytes
_LAYERS_PER_CALL = 64  # gather_rows / scatter_rows take at most this many layers a call


class _Layer(NamedTuple):
    ratio: int
    planes: List[Optional[torch.Tensor]]  # the layer's KV tensor, then its RoPE tensor (None: sizes only)
    row_bytes: List[int]                  # per plane
    indexer: Optional[torch.Tensor]       # a CSA layer's indexer cache as [blocks, entry bytes], or None
    indexer_bytes: int


class _TailRuns(NamedTuple):
    """A class's runs of one tail object, for a block whose SWA units are 0, 1, ...: per run
    its page column, first row, rows and first place in the object; a unit u is u * unit_rows
    rows further."""
    cols: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    places: np.ndarray
    unit_rows: int


class _CopyCall(NamedTuple):
    first: _Layer                 # its first layer (the runs are its ratio's)
    sources: List[torch.Tensor]   # every layer's tensors, layer after layer
    layer_offsets: List[int]      # each layer's offset in an object's payload


class ObjectLayout:
    """The byte format of a plan's tier objects, and the copies between the KV rows and them.

    ``kv`` holds the KV tensors (``ukv_torch.UnifiedKv``, or anything with
    per-layer ``kv`` tensors and optional ``rope`` and ``indexer`` lists); with
    ``kv=None`` the layout only knows sizes, from the plan's model (capacity
    studies). The layers' tensors are read and written with
    :func:`ukv_torch.gather_rows` / :func:`ukv_torch.scatter_rows` on the
    current stream, one call per group of alike layers of a compress ratio
    (through ``layer_offsets``: three calls for V4-Pro's block objects, four for its
    tail objects).

    With ``kv=None`` the layout knows sizes only, from the plan's model: it
    copies nothing, and an object is sound when its size is right (capacity
    studies, whose managers have no KV tensors)."""

    def __init__(self, plan: KvPlan, kv=None):
        config, model = plan.config, plan.model
        if config.window - 1 > config.block_size:
            raise ValueError(f"KV tiers need window - 1 <= block_size (a tail object lies in one block), got "
                             f"window={config.window}, block_size={config.block_size}")
        self.plan, self.config = plan, config
        self.layers = [self._layer(plan, kv, i, r) for i, r in enumerate(model.layer_ratios)]
        self.tail_rows = config.window - 1
        self.geometry = (config.block_size, config.window,
                         tuple((l.ratio, tuple(self._plane_kind(p, b) for p, b in zip(l.planes, l.row_bytes)),
                                l.indexer_bytes) for l in self.layers))
        self.fingerprint = fingerprint(self.geometry)
        self._offsets = {BLOCK: [], TAIL: []}
        sizes = {BLOCK: 0, TAIL: 0}
        for layer in self.layers:
            for kind in (BLOCK, TAIL):
                self._offsets[kind].append(sizes[kind])
                sizes[kind] += self._layer_bytes(kind, layer)
        self.payload_bytes = sizes
        self._calls = {kind: self._copy_calls(kind) for kind in (BLOCK, TAIL)}
        self._firsts = {BLOCK: {}, TAIL: {}}  # per kind, each ratio's first layer: its runs are the ratio's
        for kind, calls in self._calls.items():
            for call in calls:
                self._firsts[kind].setdefault(call.first.ratio, call.first)
        self._tail_templates = {}  # per compress ratio: _TailRuns
        self.device = None if kv is None else self.layers[0].planes[0].device
        self._uploads = Uploads(self.device) if self.device is not None and self.device.type == "cuda" else None
        # The header's first two words per kind (magic, version, kind; payload bytes).
        self._fixed_words = np.frombuffer(b"".join(_FIXED.pack(_MAGIC, _VERSION, kind, 0, sizes[kind])
                                                   for kind in (BLOCK, TAIL)), dtype="<i8").reshape(2, 2)

    @staticmethod
    def _layer(plan: KvPlan, kv, index: int, ratio: int) -> _Layer:
        model = plan.model
        if kv is None:
            widths = [model.head_dim * model.kv_elem_bytes] + \
                ([model.rope_head_dim * model.rope_elem_bytes] if model.rope_head_dim else [])
            ind = model.indexer_bytes_per_block if ratio == CSA_RATIO else 0
            return _Layer(ratio, [None] * len(widths), widths, None, ind)
        if len(kv.kv) != len(model.layer_ratios):
            raise ValueError(f"kv has {len(kv.kv)} layers, the plan's model {len(model.layer_ratios)}")
        ropes = getattr(kv, "rope", None) or [None] * len(kv.kv)
        planes = [kv.kv[index]] + ([ropes[index]] if ropes[index] is not None else [])
        indexers = getattr(kv, "indexer", ())
        indexer = indexers[index] if ratio == CSA_RATIO and len(indexers) > index else None
        indexer = None if indexer is None else indexer.flatten(1)
        return _Layer(ratio, planes, [t.shape[1] * t.element_size() for t in planes], indexer,
                      0 if indexer is None else indexer.shape[1])

    def _copy_calls(self, kind: int) -> List[_CopyCall]:
        """The gather / scatter calls of a kind's objects: the layers of a compress ratio
        whose tensors are alike in row bytes and stride (their rows may differ, as the
        row space's do by a few: the runs lie in every layer's), at most
        _LAYERS_PER_CALL a call."""
        groups = {}
        for i, layer in enumerate(self.layers):
            if kind == TAIL or layer.ratio:
                shapes = tuple((t.shape[1], t.stride(), t.element_size()) for t in self._sources(layer, kind)
                               if t is not None)
                groups.setdefault((layer.ratio, shapes), []).append(i)
        return [_CopyCall(self.layers[group[at]], [t for i in group[at: at + _LAYERS_PER_CALL]
                                                   for t in self._sources(self.layers[i], kind)],
                          [self._offsets[kind][i] for i in group[at: at + _LAYERS_PER_CALL]])
                for group in groups.values() for at in range(0, len(group), _LAYERS_PER_CALL)]

    def _place_rows(self, ratio: int) -> Tuple[int, int]:
        """(first, step) such that the SWA rows of a page's places, in the layers of this
        class, are consecutive rows of ``plane[first::step]``: the row space puts an HCA
        layer's places ``group_stride`` rows apart, one per group between its compressed
        rows. Addressed as rows of the planes, a tail's places were runs of one row each
        (10,414 a layer for 41 tails): gathering 33 tail objects took 2.38 ms of stream time
        on an H100, over the strided view 1.26 ms (same run; a 32K-token save went from 77.1%
        to 83.1% of the pinned copy). (0, 1) where the places' rows already follow each other."""
        if self.config.layout != "row_space":
            return 0, 1
        _, unit_rows, offset, group, stride = self.plan.swa_rows(ratio)
        if group != 1 or stride <= 1 or unit_rows % stride:
            return 0, 1
        return offset % stride, stride

    @staticmethod
    def _plane_kind(plane: Optional[torch.Tensor], row_bytes: int):
        return (str(plane.dtype), plane.shape[1]) if plane is not None else ("bytes", row_bytes)

    def _layer_bytes(self, kind: int, layer: _Layer) -> int:
        if kind == TAIL:
            return self.tail_rows * sum(layer.row_bytes)
        if not layer.ratio:
            return 0
        return self.config.block_size // layer.ratio * sum(layer.row_bytes) + layer.indexer_bytes

    def object_bytes(self, kind: int) -> int:
        """The size of a whole object of this kind (header included)."""
        return HEADER_BYTES + self.payload_bytes[kind]

    # --- headers and checks ----------------------------------------------------
    def _table(self, kinds: Sequence[int], keys: Sequence[bytes], offsets: Sequence[int]) -> torch.Tensor:
        """The objects argument of ukv.seal_objects / verify_objects: per object its
        offset, then its header's 6 words (fixed fields, payload bytes, fingerprint, key)."""
        n = len(kinds)
        table = np.empty((n, 7), dtype=np.int64)
        table[:, 0] = offsets
        table[:, 1:3] = self._fixed_words[np.asarray(kinds, dtype=np.int64)]
        table[:, 3:5] = np.frombuffer(self.fingerprint, dtype="<i8")
        if n:
            table[:, 5:7] = np.frombuffer(b"".join(keys), dtype="<i8").reshape(n, 2)
        return torch.from_numpy(table)

    def seal(self, buffer: torch.Tensor, kinds: Sequence[int], keys: Sequence[bytes], offsets: Sequence[int]) -> None:
        """Write the headers (and checksums) of objects whose payloads are in place:
        object i starts at ``buffer[offsets[i]]`` (a 1-D uint8 tensor on the KV's
        device; the GPU's work goes on the current stream)."""
        if self.device is not None and len(kinds):
            torch.ops.ukv.seal_objects(buffer, self._table(kinds, keys, offsets))

    def verify(self, buffer: torch.Tensor, kinds: Sequence[int], keys: Sequence[bytes],
               offsets: Sequence[int]) -> torch.Tensor:
        """Per object at ``buffer[offsets[i]]``: whether it is the sound object of its
        kind and key (a bool tensor on the buffer's device; the caller checked
        each object's size)."""
        if self.device is None or not len(kinds):
            return torch.ones(len(kinds), dtype=torch.bool, device=buffer.device)
        return torch.ops.ukv.verify_objects(buffer, self._table(kinds, keys, offsets))

    # --- copies between rows and objects --------------------------------------
    def gather(self, kind: int, where: torch.Tensor, buffer: torch.Tensor, offsets: Sequence[int]) -> None:
        """Copy the rows of ``len(offsets)`` objects into their payloads: object i
        starts at ``buffer[offsets[i]]`` (a 1-D uint8 tensor on the KV's device).
        ``where``: per object, :meth:`KvManager.locate_blocks`' row (block
        objects) or the SWA units of its block's pages (tail objects, int32
        ``[n, pages_per_block]``, -1 for a page holding no tail position)."""
        self._copy(gather_rows, kind, where, buffer, offsets)

    def scatter(self, kind: int, where: torch.Tensor, buffer: torch.Tensor, offsets: Sequence[int],
                ready: Optional[Callable[[], None]] = None) -> None:
        """The inverse of :meth:`gather`: payloads into the rows ``where`` names. ``ready``,
        if given, is called once the run lists' upload is queued and before the copies:
        the stream's wait for the payloads to land (the upload then does not wait too)."""
        self._copy(scatter_rows, kind, where, buffer, offsets, ready)

    def _copy(self, op, kind: int, where: torch.Tensor, buffer: torch.Tensor, offsets: Sequence[int],
              ready: Optional[Callable[[], None]] = None) -> None:
        """One call per group of alike layers (``_copy_calls``): the layers of a ratio share
        their runs, each layer's bytes at its offset in the objects. Every ratio's runs
        go to the device in one upload (an upload costs more host time than its bytes)."""
        if self.device is None:
            return
        base = np.asarray(offsets, dtype=np.int64) + HEADER_BYTES
        where = where.numpy().astype(np.int64)
        firsts = self._firsts[kind]
        runs_of = self._block_runs if kind == BLOCK else self._tail_runs
        per_ratio = dict(zip(firsts, self._upload_runs([runs_of(layer, where, base) for layer in firsts.values()])))
        if ready is not None:
            ready()
        for call in self._calls[kind]:
            op(call.sources, *per_ratio[call.first.ratio], buffer, layer_offsets=call.layer_offsets)

    def _sources(self, layer: _Layer, kind: int) -> List[torch.Tensor]:
        """The tensors a kind's runs name, by index: the planes (a tail's as the rows its
        places lie on, ``_place_rows``), then the CSA indexer."""
        planes = layer.planes
        if kind == TAIL and planes[0] is not None:
            first, step = self._place_rows(layer.ratio)
            planes = [t[first::step] for t in planes]
        return planes + ([layer.indexer] if layer.indexer is not None else [])

    def _upload_runs(self, runs: List[np.ndarray]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Each ratio's [n, 4] int64 runs and its int32 [1] count, on the KV's device, all in one
        upload through page-locked memory (uploads.py): a copy from pageable memory would wait
        for the stream's earlier work (every gather before it), and each upload costs host time
        (a ring range, a copy, an event) whatever its size. (Cut apart with one split each:
        a torch slice costs the host a few microseconds, and a save makes ~20 such uploads.)"""
        counts = [len(r) for r in runs]
        padded = np.array(counts + [0] * (len(counts) % 2), dtype=np.int32)  # whole int64 words
        packed = torch.from_numpy(np.concatenate([r.reshape(-1) for r in runs] + [padded.view(np.int64)]))
        if self._uploads is not None:
            packed = self._uploads(packed)
        words = 4 * sum(counts)
        lists = packed[:words].split([4 * c for c in counts])
        return [(run_list.view(-1, 4), count) for run_list, count in
                zip(lists, packed[words:].view(torch.int32).split(1))]

    def _block_runs(self, layer: _Layer, where: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Runs (tensor, first row, rows, offset) of a compress layer's rows in block objects."""
        config = self.config
        k = config.block_size // layer.ratio
        row_space = config.layout == "row_space"
        args = self.plan.compress_args(layer.ratio)
        phys = where[:, 1 + (0 if row_space else config.type_of_ratio(layer.ratio))]
        rows = args["compress_base"] + phys * args["block_stride"]
        runs, offset = [], 0
        for index, row_bytes in enumerate(layer.row_bytes):
            runs.append(_run_block(index, rows, k, base + offset))
            offset += k * row_bytes
        if layer.indexer is not None:
            # Addressed like the compressed rows: by envelope in the row space, else by logical block.
            runs.append(_run_block(len(layer.planes), where[:, 1 if row_space else 0], 1, base + offset))
        return np.concatenate(runs)

    def _tail_runs(self, layer: _Layer, units: np.ndarray, base: np.ndarray) -> np.ndarray:
        """Runs of a layer's SWA rows of the tail positions, of tail objects at ``base`` whose
        blocks' SWA units are ``units`` ([n, pages_per_block]): the class's runs of one
        tail (``_tail_template``) moved to each block's units, in every plane alike."""
        template = self._tail_template(layer.ratio)
        held = units[:, template.cols]
        if held.min() < 0:
            raise RuntimeError("a tail object's position has no SWA page: its rows cannot be copied")
        rows = (held * template.unit_rows + template.rows).reshape(-1)
        counts = np.repeat(template.counts[None], len(held), axis=0).reshape(-1)
        runs, offset = [], 0
        for index, row_bytes in enumerate(layer.row_bytes):
            offsets = base[:, None] + offset + template.places * row_bytes
            runs.append(_run_block(index, rows, counts, offsets.reshape(-1)))
            offset += self.tail_rows * row_bytes
        return np.concatenate(runs)

    def _tail_template(self, ratio: int) -> "_TailRuns":
        """The runs of one tail object in the layers of this class, for a block whose SWA
        units are 0, 1, ...: the rows of its positions as ``ukv.swa_slot_mapping`` gives
        them (the one formula of where a position lies), as rows of the planes ``_sources``
        gives, split where a page ends or the rows stop following each other. A row lies
        ``unit_rows`` rows further for each unit further on (checked: the formula is
        affine in the unit). Mapping every tail position of every object instead, then
        finding its runs, was ~30% of a save's host time (a 32K-token prefix's 232 tails, x86 VM)."""
        if ratio not in self._tail_templates:
            bs, count = self.config.block_size, self.tail_rows
            positions = torch.arange(bs - count, bs, dtype=torch.int64)  # within the block
            first, step = self._place_rows(ratio)
            mapped = []
            for unit in (0, 1):  # the block's pages in units unit, unit + 1, ...
                table = torch.arange(unit, unit + bs // self.config.swa_page, dtype=torch.int32).view(1, -1)
                rows = torch.empty(count, dtype=torch.int32)
                swa_slot_mapping(table, positions, torch.zeros(count, dtype=torch.int32), rows, block_size=bs,
                                 swa_rows=list(self.plan.swa_rows(ratio)))
                mapped.append(rows.numpy().astype(np.int64) - first)
            unit_rows = mapped[1] - mapped[0]
            if (mapped[0] % step).any() or (unit_rows % step).any() or (unit_rows != unit_rows[0]).any() or \
                    unit_rows[0] <= 0:
                raise RuntimeError(f"the SWA rows of compress ratio {ratio} are not a unit's rows moved by a fixed "
                                   f"number of rows a unit: tail objects cannot be copied")
            rows, cols = mapped[0] // step, positions.numpy() // self.config.swa_page
            starts = np.ones(count, dtype=bool)
            starts[1:] = (rows[1:] != rows[:-1] + 1) | (cols[1:] != cols[:-1])
            places = np.flatnonzero(starts)
            per_unit = int(unit_rows[0]) // step
            self._tail_templates[ratio] = _TailRuns(cols[places], rows[places] - cols[places] * per_unit,
                                                    np.diff(np.append(places, count)), places, per_unit)
        return self._tail_templates[ratio]
