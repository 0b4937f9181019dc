"""Where a sequence's KV bytes lie in one process's memory, in terms of the
transfer buffer's layout-independent offsets (ukv_torch.transfer).

Both sides of a transfer describe the same sequence with the same buffer
offsets, each from its own tables: the sender's rows as (offset, address,
bytes) runs, the receiver's likewise. Joining the two on the offsets gives
the writes that move every byte from the sender's row straight to the
receiver's row, with no buffer in between, whatever the two layouts are.

A transfer moves the buffer in pieces of whole layers (`pieces`), in order.
A side may stage: its runs then address a registered buffer (`Staging`,
`staged`) that the pieces go through in turn, which the sender fills a piece
at a time with SequenceRows.gather and the receiver empties with
SequenceRows.scatter. The join is the same; the writes merge into a few long
ones.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from ..plan.records import KvPlan
from ..manager.kv_manager import KvManager
from ..plan.unified_kv import UnifiedKv, check_plan_tensors
from ..tiers.staging import host_bytes
from ..transfer import SequenceExport, SequenceRows, _layer_runs, _layer_shapes, _layers

#: a run list: int64 [n, 3] of (buffer offset, address, bytes), sorted by offset
Runs = np.ndarray


#: the most bytes of a piece: the sequence's layers go in groups of at most this
#: many bytes (a larger layer alone), so the sender gathers one piece while the
#: engine writes the one before and the receiver scatters one while the next
#: arrives; small enough that the first gather and the last scatter, which
#: nothing overlaps, stay short, large enough that a piece's messages cost little
PIECE_BYTES = 16 << 20


class KvRegions:
    """One side's KV tensors (``kv`` of ``plan``) as the transfer addresses
    them: per layer, the tensors in the buffer's order (KV, RoPE, CSA
    indexer), each with its base address, row bytes and row pitch. The
    tensors are checked to be the plan's once, here; a handshake then derives
    its layers and rows from them without checking them again."""

    def __init__(self, plan: KvPlan, kv: UnifiedKv):
        check_plan_tensors(plan, kv)
        self.plan, self.kv = plan, kv
        self._layer_shapes = _layer_shapes(plan, kv)  # what each transfer's layer bounds derive from
        self._layer_sources = [layer.sources for layer in _layers(plan, kv, 0, 0, self._layer_shapes)]
        for layer, sources in enumerate(self._layer_sources):
            for t in sources:
                if t.dim() != 2 or t.stride(1) != 1:
                    raise ValueError(f"layer {layer}: a KV tensor of shape {tuple(t.shape)} and strides "
                                     f"{t.stride()} does not have contiguous rows")
        #: where the KV tensors are (a GPU's: the transfer goes through host staging, see Staging)
        self.device = self._layer_sources[0][0].device
        # What addressing a layer's runs needs and the plan fixes: each tensor's base, and the
        # (row bytes, pitch) shape that layers of one class share, so their runs are derived once.
        shapes = [tuple((t.shape[1] * t.element_size(), t.stride(0) * t.element_size()) for t in sources)
                  for sources in self._layer_sources]
        config, ratios = plan.config, plan.model.layer_ratios
        geometry = [config.block_size, config.window, *config.compress_ratios, -1, *ratios, -1]
        for shape in shapes:
            geometry += [row_bytes for row_bytes, _ in shape] + [-1]
        self._geometry = tuple(geometry)
        #: per class (compress ratio, shapes), its layers and their tensors' bases [layers, tensors]
        self._classes = {}
        for index, shape in enumerate(shapes):
            self._classes.setdefault((ratios[index], shape), []).append(index)
        self._class_bases = {key: np.array([[t.data_ptr() for t in self._layer_sources[i]] for i in layers],
                                           dtype=np.int64) for key, layers in self._classes.items()}

    def memory(self) -> List[Tuple[int, int]]:
        """The distinct allocations holding the KV tensors, as (address,
        bytes): what a transfer engine registers once."""
        spans = {}
        for sources in self._layer_sources:
            for t in sources:
                storage = t.untyped_storage()
                spans[storage.data_ptr()] = storage.nbytes()
        return sorted(spans.items())

    def geometry(self) -> List[int]:
        """What both sides must agree on for the buffer's offsets to mean the
        same rows: the configuration's block_size, window and compress ratios,
        the layers' ratios and every tensor's row bytes (fixed by the tensors:
        derived once, as each offer carries and checks it)."""
        return list(self._geometry)

    def layer_bounds(self, export: SequenceExport) -> np.ndarray:
        """Where each layer of the sequence's buffer starts, and its end: int64 [layers + 1]."""
        layers = _layers(self.plan, self.kv, export.num_computed, export.swa_begin, self._layer_shapes)
        return np.cumsum([0] + [layer.nbytes for layer in layers], dtype=np.int64)

    def sequence_rows(self, export: SequenceExport, manager: KvManager, skip_below: int = 0) -> SequenceRows:
        """The sequence's rows here for gathering or scattering pieces (SequenceRows)."""
        return SequenceRows.of_checked_tensors(self.plan, self.kv, export, manager=manager, skip_below=skip_below,
                                               shapes=self._layer_shapes)

    def runs(self, export: SequenceExport, skip_below: int = 0) -> Runs:
        """The sequence's rows in this process: (buffer offset, address, bytes),
        leaving out positions and blocks below ``skip_below`` (a prefix the
        receiver already holds). ``export`` is this side's describe_sequence.
        Each class's runs are derived once and placed for all its layers in a
        few array operations (one stack per layer took ~0.8 ms of a 32K-token
        V4-Pro sequence's 61 layers, x86 VM, most of a receiver's answer)."""
        layers = _layers(self.plan, self.kv, export.num_computed, export.swa_begin, self._layer_shapes)
        offsets = np.array([layer.offset for layer in layers], dtype=np.int64)
        templates = {key: _template(_layer_runs(self.plan, layers[indices[0]], export, skip_below), key[1])
                     for key, indices in self._classes.items()}
        counts = np.zeros(len(layers), dtype=np.int64)
        for key, indices in self._classes.items():
            counts[indices] = len(templates[key][0])
        starts = np.cumsum(counts) - counts  # each layer's first run: the runs go layer after layer
        out = np.empty((int(counts.sum()), 3), dtype=np.int64)
        for key, indices in self._classes.items():
            tensor, offset, start, size = templates[key]
            at = starts[indices][:, None] + np.arange(len(offset))
            out[at, 0] = offsets[indices][:, None] + offset
            out[at, 1] = self._class_bases[key][:, tensor] + start
            out[at, 2] = size
        return out


def _template(runs: np.ndarray, shapes) -> Tuple[np.ndarray, ...]:
    """A class's [tensor, row, rows, offset] runs as what every layer of it
    shares: (tensor, offset in the layer, byte in the tensor, bytes), sorted by
    offset; a run over rows that are not adjacent in memory becomes one run per row."""
    row_bytes = np.array([b for b, _ in shapes], dtype=np.int64)
    pitch = np.array([p for _, p in shapes], dtype=np.int64)
    strided = pitch[runs[:, 0]] != row_bytes[runs[:, 0]]
    if strided.any():
        runs = np.concatenate([runs[~strided], _one_row_each(runs[strided], row_bytes)])
        runs = runs[np.argsort(runs[:, 3], kind="stable")]
    tensor = runs[:, 0]
    return tensor, runs[:, 3], runs[:, 1] * pitch[tensor], runs[:, 2] * row_bytes[tensor]


def _one_row_each(runs: np.ndarray, row_bytes: np.ndarray) -> np.ndarray:
    """[tensor, row, rows, offset] runs split into runs of one row."""
    counts = runs[:, 2]
    run = np.repeat(np.arange(len(runs)), counts)
    step = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([runs[run, 0], runs[run, 1] + step, np.ones_like(step),
                     runs[run, 3] + step * row_bytes[runs[run, 0]]], axis=1)


def pieces(bounds: np.ndarray, limit: int) -> List[int]:
    """The layers where the pieces of a buffer with these layer bounds start,
    and the layer count: consecutive layers of at most ``limit`` bytes
    together, a larger layer alone, and the first and the last layer alone
    (nothing overlaps the first piece's gather and the last one's scatter)."""
    count = len(bounds) - 1
    starts, first = [0], 0
    for layer in range(1, count):
        if layer in (1, count - 1) or bounds[layer + 1] - bounds[first] > limit:
            starts.append(layer)
            first = layer
    return starts + [count]


def check_pieces(layers: List[int], layer_count: int) -> List[int]:
    """The receiver's pieces must start at layer 0, grow, and end at the last layer."""
    if not (isinstance(layers, list) and len(layers) >= 2 and all(isinstance(x, int) for x in layers)
            and layers[0] == 0 and layers[-1] == layer_count
            and all(a < b for a, b in zip(layers, layers[1:]))):
        raise ValueError(f"the receiver's pieces must be growing layer indices from 0 to {layer_count}, "
                         f"got {layers!r}")
    return layers


def check_after(after: List[int], count: int) -> List[int]:
    """For each of the receiver's pieces, how many pieces it must have
    scattered before that one is written: only earlier ones, or the
    transfer could never end."""
    if not (isinstance(after, list) and len(after) == count and
            all(isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= k for k, a in enumerate(after))):
        raise ValueError(f"the receiver's waits must be {count} ints, each at most its piece's index, got {after!r}")
    return after


class Staging:
    """A side's registered host staging buffer of ``staging_bytes`` (none for
    0). A transfer's pieces go through it in turn, each right after the one
    before (back at its start where a piece would run past its end), so a
    piece is filled only once the pieces there before it were written
    (sender) or scattered (receiver).

    For KV on a GPU (``device``) the buffer is page-locked host memory, which
    the transfer engine moves, with a mirror of the same size on the device,
    which the rows are gathered into and scattered from: a piece crosses
    PCIe once each side (`to_host`, `to_device`)."""

    def __init__(self, staging_bytes: int, owner: str, device: Optional[torch.device] = None):
        if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes < 0:
            raise ValueError(f"{owner}: staging_bytes must be an int >= 0, got {staging_bytes!r}")
        on_device = device is not None and device.type != "cpu"
        if on_device and not staging_bytes:
            raise ValueError(f"{owner}: KV on {device} goes through host staging (the transfer engine moves host "
                             f"memory): staging_bytes must be > 0, room for two pieces (2 x {PIECE_BYTES} bytes "
                             f"holds any piece of layers up to that size), got 0")
        # touched once, so its pages exist before the first transfer
        self.buffer = (host_bytes(staging_bytes, pinned=True).zero_() if on_device else
                       torch.zeros(staging_bytes, dtype=torch.uint8)) if staging_bytes else None
        #: the device mirror the rows are copied to and from (the buffer itself for host KV)
        self.mirror = torch.empty(staging_bytes, dtype=torch.uint8, device=device) if on_device else self.buffer
        #: the largest piece this side stages: two at least fit, for the overlap
        self.capacity = staging_bytes // 2

    @property
    def on_device(self) -> bool:
        """Whether the rows are on a GPU: every piece then goes through this staging."""
        return self.mirror is not self.buffer

    def memory(self) -> List[Tuple[int, int]]:
        return [] if self.buffer is None else [(self.buffer.data_ptr(), self.buffer.numel())]

    def holds(self, largest_piece: int) -> bool:
        """Whether this side stages pieces of up to ``largest_piece`` bytes (else its rows go straight)."""
        return self.buffer is not None and 0 < largest_piece <= self.capacity

    def place(self, sizes: np.ndarray) -> Tuple[np.ndarray, List[int]]:
        """Where pieces of these sizes go in the buffer, and for each how many
        pieces (the first ones) must be emptied before it is filled: those
        before it whose bytes it overlaps."""
        places, after, position = [], [], 0
        for k, size in enumerate(sizes.tolist()):
            if position + size > self.buffer.numel():
                position = 0
            overlapped = [j for j in range(k) if places[j] < position + size and position < places[j] + sizes[j]]
            places.append(position)
            after.append(max(overlapped, default=-1) + 1)
            position += size
        return np.array(places, dtype=np.int64), after

    def address(self, place: int) -> int:
        """The host address of byte ``place`` of the buffer, as the transfer engine names it."""
        return self.buffer.data_ptr() + place

    def at(self, place: int, nbytes: int) -> torch.Tensor:
        """Bytes of the buffer, where the rows' copies go (on the device mirror for KV on a GPU)."""
        return self.mirror[place: place + nbytes]

    def to_host(self, place: int, nbytes: int) -> None:
        """After a gather into ``at(place, nbytes)``: its bytes in the host buffer, for the
        transfer engine (KV on a GPU; waits for the copy, so the engine reads them whole)."""
        self._copy(self.buffer, self.mirror, place, nbytes)

    def to_device(self, place: int, nbytes: int) -> None:
        """Before a scatter from ``at(place, nbytes)``: the bytes the transfer engine landed
        in the host buffer, on the device (KV on a GPU; waits for the copy, so the host
        range may take the next piece's bytes at once)."""
        self._copy(self.mirror, self.buffer, place, nbytes)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, place: int, nbytes: int) -> None:
        if self.on_device:
            dst[place: place + nbytes].copy_(src[place: place + nbytes], non_blocking=True)
            torch.cuda.current_stream(self.mirror.device).synchronize()


def registered(regions: KvRegions, staging: Staging) -> List[Tuple[int, int]]:
    """What a side registers with its transfer engine: its KV tensors and its staging, or
    only the staging for KV on a GPU (the engine moves host memory)."""
    return ([] if staging.on_device else regions.memory()) + staging.memory()


#: rows whose runs average this many bytes go straight even where a staging
#: buffer is at hand: at ~17K requests a second over TCP, requests this long
#: move faster than the transport moves bytes, and no copy is needed
LONG_RUN_BYTES = 256 << 10


def short(runs: Runs) -> bool:
    """Whether rows are short enough for a staging buffer to pay: as their
    own write requests they would cost more than the bytes (LONG_RUN_BYTES)."""
    return len(runs) * LONG_RUN_BYTES > int(runs[:, 2].sum())


def staged(runs: Runs, starts: np.ndarray, places: np.ndarray, staging: Staging) -> Runs:
    """The same bytes in the staging buffer: offset o of piece k (the pieces
    beginning at buffer offsets ``starts``, the last value their end) at the
    buffer's byte places[k] + o - starts[k]; runs cut at the pieces' bounds,
    and merged where they continue in the buffer."""
    # Within a piece the staged bytes follow their offsets: runs that follow each other in the buffer
    # become one span first (a fragmented pool's 164K runs of a 128K-token sequence took 29 ms cut one
    # by one), then the spans are cut at the pieces' bounds and placed.
    offset = runs[:, 0]
    spans = cut(_merged(offset, offset, offset, runs[:, 2])[:, [0, 1, 3]], starts)
    piece = np.searchsorted(starts, spans[:, 0], side="right") - 1
    spans[:, 1] = staging.address(0) + places[piece] + spans[:, 0] - starts[piece]
    return _merged(spans[:, 0], spans[:, 1], spans[:, 1], spans[:, 2])[:, [0, 1, 3]]


def cut(runs: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Runs (offset, addresses..., bytes) cut where they cross one of ``bounds``
    (sorted buffer offsets): every part lies between two bounds; its
    addresses advance with its offset."""
    if not len(runs):
        return runs
    low, high = runs[:, 0], runs[:, 0] + runs[:, -1]
    first = np.searchsorted(bounds, low, side="right")
    count = np.searchsorted(bounds, high, side="left") - first + 1
    run = np.repeat(np.arange(len(runs)), count)
    part = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    inner = first[run] + part
    begin = np.where(part == 0, low[run], bounds[np.minimum(inner - 1, len(bounds) - 1)])
    end = np.where(part == count[run] - 1, high[run], bounds[np.minimum(inner, len(bounds) - 1)])
    out = runs[run].copy()
    out[:, 1:-1] += (begin - low[run])[:, None]
    out[:, 0], out[:, -1] = begin, end - begin
    return out


def check_destination(destination: Runs, nbytes: int, memory: List[Tuple[int, int]]) -> None:
    """A receiver's runs must name bytes of the buffer once each and rows
    inside the KV memory it registered; anything else would write where no
    KV of this sequence belongs, so it is refused before any byte moves."""
    if destination.ndim != 2 or destination.shape[1] != 3:
        raise ValueError(f"the receiver's runs must be [n, 3] (offset, address, bytes), got {destination.shape}")
    offsets, addresses, sizes = destination.T
    if len(destination) and (sizes.min() <= 0 or offsets.min() < 0 or (offsets + sizes).max() > nbytes):
        raise ValueError(f"the receiver's runs name bytes outside the sequence's {nbytes}-byte transfer buffer")
    if np.any(offsets[1:] < offsets[:-1] + sizes[:-1]):
        raise ValueError("the receiver's runs overlap or are out of order")
    starts = np.array([a for a, _ in memory], dtype=np.int64)
    ends = starts + np.array([n for _, n in memory], dtype=np.int64)
    region = np.searchsorted(starts, addresses, side="right") - 1
    inside = (region >= 0) & (addresses + sizes <= ends[np.maximum(region, 0)])
    if not inside.all():
        bad = int(np.argmin(inside))
        raise ValueError(f"the receiver's run {bad} (address {addresses[bad]:#x}, {sizes[bad]} bytes) lies outside "
                         f"the KV memory it registered")


def join(source: Runs, destination: Runs) -> np.ndarray:
    """The writes (buffer offset, source address, destination address, bytes)
    that fill every destination run from the source runs holding the same
    buffer bytes, pieces that continue on both sides merged. A destination
    byte that no source run holds is a ValueError: the two sides disagree on
    the sequence."""
    if not len(destination):
        return np.zeros((0, 4), dtype=np.int64)
    if len(source) == 1 and source[0, 0] <= destination[0, 0] and \
            destination[-1, 0] + destination[-1, 2] <= source[0, 0] + source[0, 2]:
        # one source run holds everything (a staged piece): each destination run is one write
        src = source[0, 1] + (destination[:, 0] - source[0, 0])
        return _merged(destination[:, 0], src, destination[:, 1], destination[:, 2])
    s_begin, s_end = source[:, 0], source[:, 0] + source[:, 2]
    d_begin, d_end = destination[:, 0], destination[:, 0] + destination[:, 2]
    cuts = np.unique(np.concatenate([s_begin, s_end, d_begin, d_end]))
    low, high = cuts[:-1], cuts[1:]
    d = np.searchsorted(d_begin, low, side="right") - 1
    wanted = (d >= 0) & (low < d_end[np.maximum(d, 0)])
    low, high, d = low[wanted], high[wanted], d[wanted]
    s = np.searchsorted(s_begin, low, side="right") - 1
    if len(s_begin) == 0 or not ((s >= 0) & (low < s_end[np.maximum(s, 0)])).all():
        raise ValueError("the receiver asks for bytes the sender's rows do not hold (size mismatch)")
    return _merged(low, source[s, 1] + (low - s_begin[s]), destination[d, 1] + (low - d_begin[d]), high - low)


def _merged(offset: np.ndarray, src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Writes (offset, src, dst, bytes) in offset order, each merged into the
    previous one where its offset and both its ends continue it."""
    if not len(offset):
        return np.zeros((0, 4), dtype=np.int64)
    follows = np.concatenate([[False], (offset[:-1] + size[:-1] == offset[1:]) & (src[:-1] + size[:-1] == src[1:])
                              & (dst[:-1] + size[:-1] == dst[1:])])
    first = np.flatnonzero(~follows)
    return np.stack([offset[first], src[first], dst[first], np.add.reduceat(size, first)], axis=1)
