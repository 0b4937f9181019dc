"""Moving a decoding sequence between KV pools: disaggregated prefill (a
prefill pool hands its sequences to a decode pool) and migration.

The exporting manager describes the sequence (``KvManager.describe_sequence``:
a :class:`SequenceExport`), the receiving manager admits it first
(``KvManager.import_sequence``: the same NOT_NOW / NEVER_FITS answers as
``allocate``; on a refusal the sender keeps it), :func:`gather_sequence`
copies its KV rows into one contiguous uint8 buffer, the buffer travels (any
transport), :func:`scatter_sequence` copies the rows into their new places,
and the sender frees the sequence once they landed. The sequence then
decodes there as if it had been prefilled there.

The buffer does not depend on the layout: it holds, layer after layer, the
rows of the layer's KV tensor and then of its RoPE tensor (where the model
has one), each as the SWA rows of positions ``[swa_begin, num_computed)``
(the ``window - 1`` positions the next decode step reads) followed by the
``k`` compressed rows of every block of the computed positions (compress
layers), and then the CSA indexer cache of those blocks (CSA layers with
one). So any layout can send to any other (static, upstream, elastic,
row_space, any SWA page size) as long as both sides serve the same model
with the same ``block_size``, ``window`` and ``compress_ratios``.

Each layer is one :func:`ukv_torch.gather_rows` / :func:`ukv_torch.scatter_rows`
call over that layer's part of the buffer; the run lists are built on the host
once per layer class (every layer of a class has the same rows), so the copies
themselves are graph-capturable kernels on the current stream.

Both take the manager that holds the sequence and check, before any copy,
that the export is what it describes now, that the KV tensors are the plan's
and that every table entry lies in them; the order of a move (the receiver
admits first, the sender frees last) is in docs/serving-loop.md.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .manager.kv_manager import KvManager
from .manager.sequence_export import SequenceExport, check_same_model
from .ops import gather_rows, scatter_rows, swa_slot_mapping
from .plan.records import KvPlan
from .plan.unified_kv import UnifiedKv, check_plan_tensors

__all__ = ["SequenceExport", "SequenceRows", "transfer_bytes", "gather_sequence", "scatter_sequence"]

CSA_RATIO = 4


class _Layer(NamedTuple):
    planes: List[torch.Tensor]         # the layer's KV tensor, then its RoPE tensor where the model has one
    indexer: Optional[torch.Tensor]    # a CSA layer's indexer cache as [blocks, k * entry_bytes], or None
    ratio: int
    offset: int                        # the layer's first byte in the buffer
    nbytes: int

    @property
    def sources(self) -> List[torch.Tensor]:
        return self.planes + ([self.indexer] if self.indexer is not None else [])


def _check_current(manager, export: SequenceExport) -> None:
    """The export must be what ``manager`` describes now: the same admission of a
    live sequence, with the same tables (a decode step since would have changed them)."""
    if not isinstance(manager, KvManager):
        raise TypeError(f"manager must be the KvManager whose tables the export holds, got {type(manager).__name__}")
    if not manager.has_sequence(export.seq_id):
        raise ValueError(f"export: sequence {export.seq_id} is not live in manager: describe the sequence in the "
                         f"manager that holds it")
    now = manager.describe_sequence(export.seq_id)
    if now.generation != export.generation:
        raise ValueError(f"export: sequence {export.seq_id} was deallocated and admitted again since it was "
                         f"described (generation {export.generation}, now {now.generation}): describe it again")
    same = (now.num_computed == export.num_computed and now.swa_begin == export.swa_begin
            and now.cached == export.cached and all(torch.equal(getattr(now, name), getattr(export, name))
                                                    for name in ("logical", "swa_units", "phys")))
    if not same:
        raise ValueError(f"export: sequence {export.seq_id}'s tables changed since it was described (a step ran, "
                         f"or the export was altered): describe it again right before the transfer")


class _LayerShape(NamedTuple):
    """What a layer's place in the buffer depends on besides the sequence: its tensors, and the
    bytes of a row of every plane and of a block's indexer entry (0: none)."""
    planes: List[torch.Tensor]
    indexer: Optional[torch.Tensor]
    ratio: int
    row_bytes: int
    indexer_bytes: int


def _layer_shapes(plan: KvPlan, kv: UnifiedKv) -> List[_LayerShape]:
    """Each layer's shape, for tensors ``check_plan_tensors`` accepted (fixed by them: a holder of
    the tensors derives them once, ~0.1 ms of V4-Pro's 61 layers on the x86 VM)."""
    shapes = []
    for layer, ratio in enumerate(plan.model.layer_ratios):
        planes = [kv.kv[layer]] + ([kv.rope[layer]] if kv.rope[layer] is not None else [])
        indexer = kv.indexer[layer] if ratio == CSA_RATIO and len(kv.indexer) > layer else None
        if indexer is not None:
            indexer = indexer.flatten(1)
        shapes.append(_LayerShape(planes, indexer, ratio, sum(t.shape[1] * t.element_size() for t in planes),
                                  0 if indexer is None else indexer.shape[1]))
    return shapes


def _layers(plan: KvPlan, kv: UnifiedKv, num_computed: int, swa_begin: int,
            shapes: Optional[List[_LayerShape]] = None) -> List[_Layer]:
    """Where each layer's rows lie in the buffer, from the tensors' widths, for
    tensors ``check_plan_tensors`` accepted (a check of every tensor, ~0.5 ms for
    V4-Pro's 61 layers: done once by whoever holds them); ``shapes``: their
    :func:`_layer_shapes`, where the caller keeps them."""
    bs = plan.config.block_size
    blocks = -(-num_computed // bs)
    layers, offset = [], 0
    for shape in _layer_shapes(plan, kv) if shapes is None else shapes:
        rows = num_computed - swa_begin + (blocks * (bs // shape.ratio) if shape.ratio else 0)
        nbytes = rows * shape.row_bytes + blocks * shape.indexer_bytes
        layers.append(_Layer(shape.planes, shape.indexer, shape.ratio, offset, nbytes))
        offset += nbytes
    return layers


def transfer_bytes(plan: KvPlan, kv: UnifiedKv, export: SequenceExport) -> int:
    """The size in bytes of an exported sequence's transfer buffer, for the KV
    tensors ``kv`` of ``plan`` (the same on both sides for the same model)."""
    check_same_model(export, plan)
    check_plan_tensors(plan, kv)
    return sum(layer.nbytes for layer in _layers(plan, kv, export.num_computed, export.swa_begin))


def _swa_rows(plan: KvPlan, export: SequenceExport, ratio: int) -> np.ndarray:
    """The rows of positions [swa_begin, num_computed) in the layers of this class (-1: no page)."""
    positions = torch.arange(export.swa_begin, export.num_computed, dtype=torch.int64)
    rows = torch.empty(len(positions), dtype=torch.int32)
    swa_slot_mapping(export.swa_units.view(1, -1).to(torch.int32), positions,
                     torch.zeros(len(positions), dtype=torch.int32), rows, block_size=plan.config.block_size,
                     swa_rows=list(plan.swa_rows(ratio)))
    return rows.numpy().astype(np.int64)


def _layer_runs(plan: KvPlan, layer: _Layer, export: SequenceExport, skip_below: int) -> np.ndarray:
    """The runs of a layer (every layer of its class has the same ones) as int64
    [n, 4] (tensor, first row, rows, offset), leaving out the positions and blocks
    below ``skip_below`` (a prefix the importer already holds); a run is merged
    into the previous one where both its rows and its bytes follow on."""
    config = plan.config
    bs, ratio, begin = config.block_size, layer.ratio, export.swa_begin
    swa_rows = _swa_rows(plan, export, ratio)
    first_swa = min(max(0, skip_below - begin), len(swa_rows))
    if (swa_rows[first_swa:] < 0).any():
        raise RuntimeError(f"the sequence holds no SWA page for a position in [{begin}, {export.num_computed}): "
                           f"its window cannot be transferred")
    _check_rows("export.swa_units", swa_rows[swa_rows >= 0], 1, layer.planes[0].shape[0])
    blocks = -(-export.num_computed // bs)
    block = np.arange(min(skip_below // bs, blocks), blocks)
    kept = np.arange(first_swa, len(swa_rows))
    parts, row_bytes, offset = [], [], 0
    for index, plane in enumerate(layer.planes):
        row_bytes.append(plane.shape[1] * plane.element_size())
        parts.append(_run_block(index, swa_rows[kept], 1, offset + kept * row_bytes[-1]))
        offset += len(swa_rows) * row_bytes[-1]
        if ratio:
            k = bs // ratio
            args = plan.compress_args(ratio)
            table = export.phys[0 if config.layout == "row_space" else config.type_of_ratio(ratio)].numpy()
            rows = args["compress_base"] + table[block].astype(np.int64) * args["block_stride"]
            _check_rows("export.phys", rows, k, plane.shape[0])
            parts.append(_run_block(index, rows, k, offset + block * k * row_bytes[-1]))
            offset += blocks * k * row_bytes[-1]
    if layer.indexer is not None:
        # Addressed like the layer's compressed rows: by envelope in the row space, else by logical block.
        row_space = config.layout == "row_space"
        rows = (export.phys[0] if row_space else export.logical).numpy()[block].astype(np.int64)
        _check_rows("export.phys" if row_space else "export.logical", rows, 1, layer.indexer.shape[0])
        row_bytes.append(layer.indexer.shape[1])
        parts.append(_run_block(len(layer.planes), rows, 1, offset + block * row_bytes[-1]))
    return _merged_runs(np.concatenate(parts), np.array(row_bytes, dtype=np.int64))


def _run_block(tensor: int, rows: np.ndarray, count, offsets: np.ndarray) -> np.ndarray:
    """[tensor, row, rows, offset] runs: ``count`` rows from each of ``rows`` (an int or one per run)."""
    runs = np.empty((len(rows), 4), dtype=np.int64)
    runs[:, 0], runs[:, 1], runs[:, 2], runs[:, 3] = tensor, rows, count, offsets
    return runs


def _merged_runs(runs: np.ndarray, row_bytes: np.ndarray) -> np.ndarray:
    """[tensor, row, rows, offset] runs, each merged into the previous one where its rows and bytes follow on."""
    if not len(runs):
        return runs
    tensor, row, rows, offset = runs.T
    follows = np.concatenate([[False], (tensor[1:] == tensor[:-1]) & (row[:-1] + rows[:-1] == row[1:])
                              & (offset[:-1] + rows[:-1] * row_bytes[tensor[:-1]] == offset[1:])])
    first = np.flatnonzero(~follows)
    out = runs[first]
    out[:, 2] = np.add.reduceat(rows, first)
    return out


def _check_rows(name: str, firsts: np.ndarray, rows: int, tensor_rows: int) -> None:
    """Runs of ``rows`` rows from each of ``firsts`` must lie in the tensor and not overlap."""
    bad = np.flatnonzero((firsts < 0) | (firsts > tensor_rows - rows))
    if len(bad):
        first = int(firsts[bad[0]])
        raise ValueError(f"{name}: an entry addresses rows {first}..{first + rows - 1}, outside the KV tensor's "
                         f"{tensor_rows} rows")
    if (np.diff(np.sort(firsts)) < rows).any():
        raise ValueError(f"{name}: two entries address the same rows")


class SequenceRows:
    """One sequence's rows in one pool, checked once, copied to and from a
    transfer buffer layer by layer: what gather_sequence and scatter_sequence
    do in one call, for a transfer that moves the buffer in pieces of whole
    layers (ukv_torch.disagg). Built right before the copies, with no step
    in between (a step may move or reuse the rows).

    ``skip_below``: positions and blocks below it are left alone (a prefix
    the importing pool already holds). Refusals as in :func:`gather_sequence`."""

    def __init__(self, plan: KvPlan, kv: UnifiedKv, export: SequenceExport, *, manager: KvManager,
                 skip_below: int = 0):
        check_plan_tensors(plan, kv)
        self._build(plan, kv, export, manager, skip_below)

    @classmethod
    def of_checked_tensors(cls, plan: KvPlan, kv: UnifiedKv, export: SequenceExport, *, manager: KvManager,
                           skip_below: int = 0, shapes: Optional[List[_LayerShape]] = None) -> "SequenceRows":
        """As the constructor, for ``kv`` that ``check_plan_tensors(plan, kv)``
        accepted already (ukv_torch.disagg.KvRegions, at its construction, which
        keeps their ``_layer_shapes`` too): the export and its rows are checked as
        ever, the tensors not again."""
        rows = cls.__new__(cls)
        rows._build(plan, kv, export, manager, skip_below, shapes)
        return rows

    def _build(self, plan: KvPlan, kv: UnifiedKv, export: SequenceExport, manager: KvManager,
               skip_below: int, shapes: Optional[List[_LayerShape]] = None) -> None:
        check_same_model(export, plan)
        _check_current(manager, export)
        self.layers = _layers(plan, kv, export.num_computed, export.swa_begin, shapes)
        self.nbytes = sum(layer.nbytes for layer in self.layers)
        per_class: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        class_bytes: Dict[int, int] = {}
        for layer in self.layers:  # every run list is built, and checked, before any copy
            if layer.ratio not in per_class:
                runs = _layer_runs(plan, layer, export, skip_below)
                row_bytes = np.array([t.shape[1] * t.element_size() for t in layer.sources], dtype=np.int64)
                class_bytes[layer.ratio] = int((runs[:, 2] * row_bytes[runs[:, 0]]).sum())
                device = layer.planes[0].device
                per_class[layer.ratio] = (torch.from_numpy(runs).to(device),
                                          torch.tensor([len(runs)], dtype=torch.int32).to(device))
        self._runs = per_class
        #: the bytes the copies move: the rows of the positions and blocks from skip_below on
        self.copied = sum(class_bytes[layer.ratio] for layer in self.layers)

    def gather(self, buffer: torch.Tensor, first: int = 0, last: Optional[int] = None) -> None:
        """Copy the rows of layers [first, last) into ``buffer``, which holds those layers' bytes."""
        self._copy(gather_rows, buffer, first, last)

    def scatter(self, buffer: torch.Tensor, first: int = 0, last: Optional[int] = None) -> None:
        """Copy ``buffer``, the bytes of layers [first, last), into the rows."""
        self._copy(scatter_rows, buffer, first, last)

    def _copy(self, op, buffer: torch.Tensor, first: int, last: Optional[int]) -> None:
        layers = self.layers[first:last]
        base = layers[0].offset if layers else 0
        nbytes = sum(layer.nbytes for layer in layers)
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() != nbytes:
            what = ("transfer_bytes() = " if len(layers) == len(self.layers) else "the layers' ") + str(nbytes)
            raise ValueError(f"buffer must be a 1-D uint8 tensor of {what} bytes for this sequence and these KV "
                             f"tensors, got {buffer.dtype} {tuple(buffer.shape)}")
        for layer in layers:
            runs, count = self._runs[layer.ratio]
            op(layer.sources, runs, count, buffer[layer.offset - base: layer.offset - base + layer.nbytes])


def gather_sequence(plan: KvPlan, kv: UnifiedKv, export: SequenceExport, buffer: torch.Tensor, *,
                    manager: KvManager) -> None:
    """Copy an exported sequence's KV rows from ``kv`` (the tensors of ``plan``, where
    the exporting ``manager`` lives) into ``buffer``: a 1-D uint8 tensor of
    :func:`transfer_bytes` bytes on the KV tensors' device. One ``gather_rows``
    kernel per layer on the current stream (the run lists are built on the host).

    Refused (ValueError or TypeError naming the argument, nothing copied):
    an export the manager does not describe identically now (deallocated,
    its id reused, a step since), KV tensors that are not the plan's, a
    buffer of another size, table entries outside the tensors."""
    SequenceRows(plan, kv, export, manager=manager).gather(buffer)


def scatter_sequence(plan: KvPlan, kv: UnifiedKv, export: SequenceExport, buffer: torch.Tensor,
                     cached: Optional[int] = None, *, manager: KvManager) -> None:
    """Copy a transfer buffer into the rows the importing ``manager`` gave the sequence.

    ``export`` is the importing manager's ``describe_sequence`` of it, taken
    after the step's allocations (units may move while others are allocated).
    It carries the cached prefix ``import_sequence`` returned
    (``export.cached``): positions and blocks below it already hold their KV
    in this pool (a prefix-cache hit, shared read-only with other sequences)
    and are left alone. ``cached``, if given, must be that value. In the
    row-space layout call it after the step's ``apply_row_copies`` and before
    its forward. Refusals as in :func:`gather_sequence`."""
    if cached is not None and cached != export.cached:
        raise ValueError(f"cached must be what import_sequence returned for sequence {export.seq_id}, "
                         f"{export.cached}, got {cached}")
    SequenceRows(plan, kv, export, manager=manager, skip_below=export.cached).scatter(buffer)
