"""Where a sequence's KV bytes lie in one process's memory, in terms of the
transfer buffer's layout-independent offsets (ukv_torch.transfer).

Both sides of a transfer describe the same sequence with the same buffer
offsets, each from its own tables: the sender's rows as (offset, address,
bytes) runs, the receiver's likewise. Joining the two on the offsets gives
the writes that move every byte from the sender's row straight to the
receiver's row, with no buffer in between, whatever the two layouts are.

A side may instead stage: its runs then address a contiguous buffer at the
same offsets (`staged`), which gather_sequence fills or scatter_sequence
empties. The join is the same; the writes merge into a few long ones.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from ..plan.records import KvPlan
from ..plan.unified_kv import UnifiedKv
from ..transfer import SequenceExport, _layer_runs, _layers

#: a run list: int64 [n, 3] of (buffer offset, address, bytes), sorted by offset
Runs = np.ndarray


class KvRegions:
    """One side's KV tensors (``kv`` of ``plan``) as the transfer addresses
    them: per layer, the tensors in the buffer's order (KV, RoPE, CSA
    indexer), each with its base address, row bytes and row pitch."""

    def __init__(self, plan: KvPlan, kv: UnifiedKv):
        self.plan, self.kv = plan, kv
        self._layer_sources = [layer.sources for layer in _layers(plan, kv, 0, 0)]
        for layer, sources in enumerate(self._layer_sources):
            for t in sources:
                if t.dim() != 2 or t.stride(1) != 1:
                    raise ValueError(f"layer {layer}: a KV tensor of shape {tuple(t.shape)} and strides "
                                     f"{t.stride()} does not have contiguous rows")

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
        the layers' ratios and every tensor's row bytes."""
        config = self.plan.config
        shape = [config.block_size, config.window, *config.compress_ratios, -1, *self.plan.model.layer_ratios, -1]
        for sources in self._layer_sources:
            shape += [t.shape[1] * t.element_size() for t in sources] + [-1]
        return shape

    def runs(self, export: SequenceExport, skip_below: int = 0) -> Runs:
        """The sequence's rows in this process: (buffer offset, address, bytes),
        leaving out positions and blocks below ``skip_below`` (a prefix the
        receiver already holds). ``export`` is this side's describe_sequence."""
        layers = _layers(self.plan, self.kv, export.num_computed, export.swa_begin)
        per_class = {}
        parts = []
        for layer in layers:
            if layer.ratio not in per_class:
                per_class[layer.ratio] = np.array(_layer_runs(self.plan, layer, export, skip_below),
                                                  dtype=np.int64).reshape(-1, 4)
            parts.append(self._addressed(layer, per_class[layer.ratio]))
        return np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)

    def _addressed(self, layer, runs: np.ndarray) -> Runs:
        """A layer's [tensor, row, rows, offset] runs as addressed runs; a run
        over rows that are not adjacent in memory becomes one run per row."""
        out = []
        for index, t in enumerate(layer.sources):
            mine = runs[runs[:, 0] == index]
            if not len(mine):
                continue
            row_bytes, pitch = t.shape[1] * t.element_size(), t.stride(0) * t.element_size()
            if pitch != row_bytes:
                mine = _one_row_each(mine, row_bytes)
            out.append(np.stack([layer.offset + mine[:, 3], t.data_ptr() + mine[:, 1] * pitch,
                                 mine[:, 2] * row_bytes], axis=1))
        out = np.concatenate(out)
        return out[np.argsort(out[:, 0], kind="stable")]


def _one_row_each(runs: np.ndarray, row_bytes: int) -> np.ndarray:
    """[tensor, row, rows, offset] runs split into runs of one row."""
    counts = runs[:, 2]
    run = np.repeat(np.arange(len(runs)), counts)
    step = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.stack([runs[run, 0], runs[run, 1] + step, np.ones_like(step), runs[run, 3] + step * row_bytes], axis=1)


def staged(runs: Runs, buffer: torch.Tensor) -> Runs:
    """The same bytes in a contiguous staging buffer: offset o at the buffer's byte o."""
    out = runs.copy()
    out[:, 1] = buffer.data_ptr() + runs[:, 0]
    return out


def staging_buffer(staging_bytes: int, owner: str) -> Optional[torch.Tensor]:
    """A host staging buffer of staging_bytes (None for 0), touched once so
    its pages exist before the first transfer."""
    if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes < 0:
        raise ValueError(f"{owner}: staging_bytes must be an int >= 0, got {staging_bytes!r}")
    return torch.zeros(staging_bytes, dtype=torch.uint8) if staging_bytes else None


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
    """The writes (source address, destination address, bytes) that fill every
    destination run from the source runs holding the same buffer bytes,
    pieces that continue on both sides merged. A destination byte that no
    source run holds is a ValueError: the two sides disagree on the sequence."""
    if not len(destination):
        return np.zeros((0, 3), dtype=np.int64)
    if len(source) == 1 and source[0, 0] <= destination[0, 0] and \
            destination[-1, 0] + destination[-1, 2] <= source[0, 0] + source[0, 2]:
        # one source run holds everything (a staged sender): each destination run is one write
        src = source[0, 1] + (destination[:, 0] - source[0, 0])
        return _merged(src, destination[:, 1], destination[:, 2])
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
    return _merged(source[s, 1] + (low - s_begin[s]), destination[d, 1] + (low - d_begin[d]), high - low)


def _merged(src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Writes in offset order, each merged into the previous one where both its ends continue it."""
    follows = np.concatenate([[False], (src[:-1] + size[:-1] == src[1:]) & (dst[:-1] + size[:-1] == dst[1:])])
    group = np.cumsum(~follows) - 1
    first = np.flatnonzero(~follows)
    return np.stack([src[first], dst[first], np.bincount(group, weights=size).astype(np.int64)], axis=1)
