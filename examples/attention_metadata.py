"""The attention metadata of one step: every index the V4 attention reads,
built by the plan-bound ops (ukv_torch.KvStepOps) from the manager's staged
tables (docs/serving-loop.md, "Building the indices").

Decode and prefill tokens are built by separate ops over the same staged
rows: a token's batch id is its sequence's row in the tables. The buffers are
allocated once, sized for the largest step from the configuration alone, so
nothing here allocates or reads a value back from the device per step, as a
captured graph requires.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

import torch

from ukv_torch import KvStepOps

CSA, HCA, DENSE = 4, 128, 0
Buffers = Dict[str, torch.Tensor]


class Chunk(NamedTuple):
    """Positions [start, start + count) of the sequence staged in row `row`."""
    row: int
    start: int
    count: int


def token_inputs(chunks: List[Chunk], rows: int, decode: bool, device: torch.device) -> Buffers:
    """positions and batch ids per token; per staged row the committed compressed
    entries the ops may read, and (prefill) where each chunk starts.

    CSA and prefill HCA counts are those after the step's positions: the ops cap
    them per token at (pos + 1) // ratio, so no token reads its future. Decode
    HCA has no per-token cap (every token of a sequence gets n_committed_hca[b]
    entries), so it is the count at the sequence's first position of the step:
    with drafts, a later count would show the earlier tokens an entry that
    covers positions after them.
    """
    x = {name: torch.zeros(rows, dtype=torch.int32) for name in ("n_csa", "n_hca", "chunk_start", "query_start")}
    query = 0
    for c in chunks:
        end = c.start + c.count
        x["n_csa"][c.row] = end // CSA
        x["n_hca"][c.row] = (c.start + 1 if decode else end) // HCA
        x["chunk_start"][c.row], x["query_start"][c.row] = c.start, query
        query += c.count
    x = {name: t.to(device) for name, t in x.items()}
    x["positions"], x["batch_id"] = token_positions(chunks, device)
    return x


def token_positions(chunks: List[Chunk], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every token's position (int64) and batch id (its staged row, int32), chunk after chunk."""
    positions = torch.cat([torch.arange(c.start, c.start + c.count) for c in chunks])
    rows = torch.tensor([c.row for c in chunks], dtype=torch.int32)
    batch_id = rows.repeat_interleave(torch.tensor([c.count for c in chunks]))
    return positions.to(device), batch_id.to(device)


class AttentionMetadata:
    """The step's index buffers, allocated once for the largest step (as a
    captured graph needs them), and the ops that fill them: the plan-bound
    ``KvStepOps``, so no layout constant is passed here."""

    def __init__(self, step: KvStepOps, index_topk: int, device: torch.device):
        self.step, self.index_topk = step, index_topk
        cfg = step.plan.config
        tokens, window = cfg.max_num_batched_tokens, cfg.window
        # The widest slice per token: the window, plus every top-k lane (CSA) or HCA entry of the longest sequence.
        widths = {"extend": window, "swa": window, "csa": window + index_topk,
                  "hca": window + cfg.max_blocks_per_seq * cfg.block_size // HCA}
        i32 = dict(dtype=torch.int32, device=device)
        self.indptr = {name: torch.zeros(tokens + 1, **i32) for name in widths}
        self.out = {name: torch.empty(tokens * w, **i32) for name, w in widths.items()}
        self.widths = widths
        self.prefix_count = torch.zeros(tokens, **i32)

    def _views(self, tokens: int, names) -> Tuple[Buffers, Buffers]:
        """This step's part of the buffers; index cells start at -1, so a cell no op wrote reads as no row."""
        indptr = {name: self.indptr[name][: tokens + 1] for name in names}
        out = {name: self.out[name][: tokens * self.widths[name]].fill_(-1) for name in names}
        return indptr, out

    def decode(self, tables: torch.Tensor, x: Buffers, topk: torch.Tensor) -> Tuple[Buffers, Buffers]:
        """SWA, CSA and HCA slices of every decode token: [compress head | window tail]."""
        step = self.step
        indptr, out = self._views(x["positions"].numel(), ("swa", "csa", "hca"))
        step.decode_index_metadata(x["positions"], x["batch_id"], x["n_csa"], x["n_hca"], indptr["swa"],
                                   indptr["csa"], indptr["hca"], index_topk=self.index_topk)
        step.paged_decode_indices(x["positions"], x["batch_id"], indptr["swa"], out["swa"], indptr["csa"], out["csa"],
                                  indptr["hca"], out["hca"], tables=tables)
        step.csa_translate_pack(topk, x["positions"], x["batch_id"], indptr["csa"], out["csa"], tables=tables)
        step.hca_decode_indices(x["batch_id"], x["n_hca"], indptr["hca"], out["hca"], tables=tables)
        return indptr, out

    def prefill(self, tables: torch.Tensor, x: Buffers, topk: torch.Tensor) -> Tuple[Buffers, Buffers]:
        """Extend rows (the forward's own kv), the SWA prefix from earlier chunks or
        the cached prefix, CSA [picks | prefix] and HCA [prefix | entries]."""
        step = self.step
        tokens = x["positions"].numel()
        indptr, out = self._views(tokens, ("extend", "swa", "csa", "hca"))
        prefix_count = self.prefix_count[:tokens]
        step.prefill_index_metadata(x["positions"], x["batch_id"], x["chunk_start"], x["n_csa"], x["n_hca"],
                                    indptr["extend"], indptr["swa"], indptr["csa"], indptr["hca"], prefix_count,
                                    index_topk=self.index_topk)
        step.paged_prefill_indices(x["positions"], x["batch_id"], x["chunk_start"], x["query_start"], x["n_hca"],
                                   indptr["extend"], indptr["swa"], indptr["csa"], indptr["hca"], out["extend"],
                                   out["swa"], out["csa"], out["hca"], tables=tables)
        step.csa_translate_pack(topk, x["positions"], x["batch_id"], indptr["csa"], out["csa"],
                                skip_per_token=prefix_count, tables=tables)
        return indptr, out
