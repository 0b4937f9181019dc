"""Moving a decoding sequence between KV pools: disaggregated prefill (a
prefill pool hands its sequences to a decode pool) and migration.

The exporting manager describes the sequence (``KvManager.describe_sequence``:
a :class:`SequenceExport`), :func:`gather_sequence` copies its KV rows into
one contiguous uint8 buffer, the buffer travels (any transport), the receiving
manager admits the sequence (``KvManager.import_sequence``: the same NOT_NOW /
NEVER_FITS answers as ``allocate``) and :func:`scatter_sequence` copies the
rows into their new places. The sequence then decodes there as if it had
been prefilled there.

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
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from .ops import gather_rows, scatter_rows, swa_slot_mapping
from .plan.records import KvPlan, ServeConfig
from .plan.unified_kv import UnifiedKv

__all__ = ["SequenceExport", "transfer_bytes", "gather_sequence", "scatter_sequence"]

CSA_RATIO = 4
# The configuration fields that give the buffer's meaning: both sides must agree on them.
_SHARED_FIELDS = ("block_size", "window", "compress_ratios")


class SequenceExport(NamedTuple):
    """A decoding sequence as ``KvManager.describe_sequence`` gives it.

    ``tokens`` (int32): its known tokens, the last sampled one included;
    ``num_computed``: positions whose KV is computed (``len(tokens) - 1``);
    ``swa_begin``: the first position whose SWA rows travel
    (``max(0, num_computed - window + 1)``); ``block_hashes`` (int64 bits of
    the unsigned hashes): the prefix-cache hash chain of its published blocks;
    ``logical`` (int32): its logical block ids; ``swa_units`` (int32): the
    staged SWA table row (an SWA block or unit per page, -1 where it holds
    none); ``phys`` (``[tables, blocks]`` int32): its staged physical compress
    tables (one per compress type; the envelope table in the row space);
    ``config``: the manager's ServeConfig; ``salt``: its cache salt (0: none).
    The tables are the ones to read
    rows from on the exporting side, or to write to on the importing side.
    """

    tokens: torch.Tensor
    num_computed: int
    swa_begin: int
    block_hashes: torch.Tensor
    logical: torch.Tensor
    swa_units: torch.Tensor
    phys: torch.Tensor
    config: ServeConfig
    salt: int = 0


class _Layer(NamedTuple):
    planes: List[torch.Tensor]         # the layer's KV tensor, then its RoPE tensor where the model has one
    indexer: Optional[torch.Tensor]    # a CSA layer's indexer cache as [blocks, k * entry_bytes], or None
    ratio: int
    offset: int                        # the layer's first byte in the buffer
    nbytes: int

    @property
    def sources(self) -> List[torch.Tensor]:
        return self.planes + ([self.indexer] if self.indexer is not None else [])


def _check_same_model(export: SequenceExport, side) -> None:
    """side: a KvPlan or a KvManager (anything with a ServeConfig ``config``)."""
    if not isinstance(export, SequenceExport):
        raise TypeError(f"export must be a SequenceExport (KvManager.describe_sequence), got {type(export).__name__}")
    for name in _SHARED_FIELDS:
        mine, theirs = getattr(side.config, name), getattr(export.config, name)
        if mine != theirs:
            raise ValueError(f"the sequence was exported with {name}={theirs}, this pool has {name}={mine}: the "
                             f"buffer's rows would mean other positions")


def _layers(plan: KvPlan, kv: UnifiedKv, num_computed: int, swa_begin: int) -> List[_Layer]:
    """Where each layer's rows lie in the buffer, from the tensors' widths."""
    ratios = plan.model.layer_ratios
    if len(kv.kv) != len(ratios):
        raise ValueError(f"kv has {len(kv.kv)} layers, the plan's model {len(ratios)}")
    bs = plan.config.block_size
    blocks = -(-num_computed // bs)
    layers, offset = [], 0
    for layer, ratio in enumerate(ratios):
        planes = [kv.kv[layer]] + ([kv.rope[layer]] if kv.rope[layer] is not None else [])
        rows = num_computed - swa_begin + (blocks * (bs // ratio) if ratio else 0)
        nbytes = sum(rows * t.shape[1] * t.element_size() for t in planes)
        indexer = kv.indexer[layer] if ratio == CSA_RATIO and len(kv.indexer) > layer else None
        if indexer is not None:
            indexer = indexer.flatten(1)
            nbytes += blocks * indexer.shape[1]
        layers.append(_Layer(planes, indexer, ratio, offset, nbytes))
        offset += nbytes
    return layers


def transfer_bytes(plan: KvPlan, kv: UnifiedKv, export: SequenceExport) -> int:
    """The size in bytes of an exported sequence's transfer buffer, for the KV
    tensors ``kv`` of ``plan`` (the same on both sides for the same model)."""
    _check_same_model(export, plan)
    return sum(layer.nbytes for layer in _layers(plan, kv, export.num_computed, export.swa_begin))


class _Runs:
    """A run list ([tensor, first_row, rows, offset] each), a run merged into the
    previous one where both its rows and its bytes follow on."""

    def __init__(self):
        self.runs: List[List[int]] = []

    def add(self, tensor: int, row: int, rows: int, offset: int, row_bytes: int) -> None:
        last = self.runs[-1] if self.runs else None
        if last and last[0] == tensor and last[1] + last[2] == row and last[3] + last[2] * row_bytes == offset:
            last[2] += rows
        else:
            self.runs.append([tensor, row, rows, offset])


def _swa_rows(plan: KvPlan, export: SequenceExport, ratio: int) -> List[int]:
    """The rows of positions [swa_begin, num_computed) in the layers of this class (-1: no page)."""
    positions = torch.arange(export.swa_begin, export.num_computed, dtype=torch.int64)
    rows = torch.empty(len(positions), dtype=torch.int32)
    swa_slot_mapping(export.swa_units.view(1, -1).to(torch.int32), positions,
                     torch.zeros(len(positions), dtype=torch.int32), rows, block_size=plan.config.block_size,
                     swa_rows=list(plan.swa_rows(ratio)))
    return rows.tolist()


def _layer_runs(plan: KvPlan, layer: _Layer, export: SequenceExport, skip_below: int) -> List[List[int]]:
    """The runs of a layer (every layer of its class has the same ones), leaving out
    the positions and blocks below ``skip_below`` (a prefix the importer already holds)."""
    config = plan.config
    bs, ratio, begin = config.block_size, layer.ratio, export.swa_begin
    swa_rows = _swa_rows(plan, export, ratio)
    if any(row < 0 for p, row in enumerate(swa_rows, begin) if p >= skip_below):
        raise RuntimeError(f"the sequence holds no SWA page for a position in [{begin}, {export.num_computed}): "
                           f"its window cannot be transferred")
    blocks = -(-export.num_computed // bs)
    first_block = skip_below // bs
    runs, offset = _Runs(), 0
    for index, plane in enumerate(layer.planes):
        row_bytes = plane.shape[1] * plane.element_size()
        for i, row in enumerate(swa_rows):
            if begin + i >= skip_below:
                runs.add(index, row, 1, offset + i * row_bytes, row_bytes)
        offset += len(swa_rows) * row_bytes
        if ratio:
            k = bs // ratio
            args = plan.compress_args(ratio)
            table = export.phys[0 if config.layout == "row_space" else config.type_of_ratio(ratio)].tolist()
            for b in range(first_block, blocks):
                row = args["compress_base"] + table[b] * args["block_stride"]
                runs.add(index, row, k, offset + b * k * row_bytes, row_bytes)
            offset += blocks * k * row_bytes
    if layer.indexer is not None:
        # Addressed like the layer's compressed rows: by envelope in the row space, else by logical block.
        table = (export.phys[0] if config.layout == "row_space" else export.logical).tolist()
        entry_bytes = layer.indexer.shape[1]
        for b in range(first_block, blocks):
            runs.add(len(layer.planes), table[b], 1, offset + b * entry_bytes, entry_bytes)
    return runs.runs


def _transfer(op, plan: KvPlan, kv: UnifiedKv, export: SequenceExport, buffer: torch.Tensor,
              skip_below: int) -> None:
    _check_same_model(export, plan)
    layers = _layers(plan, kv, export.num_computed, export.swa_begin)
    nbytes = sum(layer.nbytes for layer in layers)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() != nbytes:
        raise ValueError(f"buffer must be a 1-D uint8 tensor of transfer_bytes() = {nbytes} bytes for this "
                         f"sequence and these KV tensors, got {buffer.dtype} {tuple(buffer.shape)}")
    device = buffer.device
    per_class: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in layers:
        if layer.ratio not in per_class:
            runs = _layer_runs(plan, layer, export, skip_below)
            per_class[layer.ratio] = (torch.tensor(runs, dtype=torch.int64).view(-1, 4).to(device),
                                      torch.tensor([len(runs)], dtype=torch.int32).to(device))
        runs, count = per_class[layer.ratio]
        op(layer.sources, runs, count, buffer[layer.offset: layer.offset + layer.nbytes])


def gather_sequence(plan: KvPlan, kv: UnifiedKv, export: SequenceExport, buffer: torch.Tensor) -> None:
    """Copy an exported sequence's KV rows from ``kv`` (the tensors of ``plan``, where
    the exporting manager lives) into ``buffer``: a 1-D uint8 tensor of
    :func:`transfer_bytes` bytes on the KV tensors' device. One ``gather_rows``
    kernel per layer on the current stream (the run lists are built on the host)."""
    _transfer(gather_rows, plan, kv, export, buffer, 0)


def scatter_sequence(plan: KvPlan, kv: UnifiedKv, export: SequenceExport, buffer: torch.Tensor,
                     cached: int) -> None:
    """Copy a transfer buffer into the rows the importing manager gave the sequence.

    ``export`` is the importing manager's ``describe_sequence`` of it, taken
    after the step's allocations (units may move while others are allocated),
    ``cached`` the value ``import_sequence`` returned: positions and blocks
    below it already hold their KV in this pool (a prefix-cache hit, shared
    read-only with other sequences) and are left alone. In the row-space layout
    call it after the step's ``apply_row_copies`` and before its forward."""
    _transfer(scatter_rows, plan, kv, export, buffer, cached)
