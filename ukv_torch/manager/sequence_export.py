"""The description of a decoding sequence that moves between KV pools
(``KvManager.describe_sequence``), and the configuration both pools must share
for its rows to mean the same positions (ukv_torch/transfer.py moves the rows)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..plan.records import ServeConfig

__all__ = ["SequenceExport", "check_same_model"]

# The configuration fields that give the buffer's meaning: both sides must agree on them.
_SHARED_FIELDS = ("block_size", "window", "compress_ratios")


class SequenceExport(NamedTuple):
    """A decoding sequence as ``KvManager.describe_sequence`` gives it.

    ``tokens`` (int32): its known tokens, the last sampled one included;
    ``num_computed``: positions whose KV is computed (``len(tokens) - 1``);
    ``swa_begin``: the first position whose SWA rows travel
    (``max(0, num_computed - window + 1)``); ``block_hashes``: the
    prefix-cache key chain of its published blocks, as ``config.prefix_hash``
    makes it (int64 [n]: the unsigned xxh64 keys' bits; [n, 2]: each sha256
    or blake2b key's lo and hi words);
    ``logical`` (int32): its logical block ids; ``swa_units`` (int32): the
    staged SWA table row (an SWA block or unit per page, -1 where it holds
    none); ``phys`` (``[tables, blocks]`` int32): its staged physical compress
    tables (one per compress type; the envelope table in the row space);
    ``config``: the manager's ServeConfig; ``salt``: its cache salt (0: none);
    ``seq_id``: its id in the describing manager; ``generation``: which
    admission made it live there (a deallocate and a reuse of the id make
    another); ``cached``: the cached prefix that admission returned (for an
    imported sequence, what ``import_sequence`` returned: the positions the
    scatter leaves alone). The tables are the ones to read rows from on the
    exporting side, or to write to on the importing side: gather_sequence and
    scatter_sequence take only an export that the manager they are given
    describes identically now.
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
    seq_id: int = -1
    generation: int = 0
    cached: int = 0


def check_same_model(export: SequenceExport, side) -> None:
    """side: a KvPlan or a KvManager (anything with a ServeConfig ``config``)."""
    if not isinstance(export, SequenceExport):
        raise TypeError(f"export must be a SequenceExport (KvManager.describe_sequence), got {type(export).__name__}")
    if not isinstance(export.config, ServeConfig):
        raise TypeError(f"export.config must be the exporting manager's ServeConfig, got "
                        f"{type(export.config).__name__}")
    for name in _SHARED_FIELDS:
        mine, theirs = getattr(side.config, name), getattr(export.config, name)
        if mine != theirs:
            raise ValueError(f"the sequence was exported with {name}={theirs}, this pool has {name}={mine}: the "
                             f"buffer's rows would mean other positions")
