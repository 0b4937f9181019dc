"""The model of engine_loop.py: KV rows hold content tags, and every index a
step's ops build is checked against them.

A tag identifies a token prefix (equal prefixes give equal tags, whichever
request they belong to), salted per layer and role, so an index that reads
another sequence's row, another position, a stale or never-written row, or
another layer's or role's row fails the check. The model writes KV where the
V4 kernels do (docs/serving-loop.md, "Writing KV"):
- SWA: every computed position at the row KvStepOps.swa_slot_mapping gives for the
  layer's class, skipping the -1 of positions that got no page;
- compressed entries: entry e of ratio r (positions [r*e, r*e + r)) once its
  last position is computed, through the layer's compress view (KvStepOps.compress_view) at
  [table[row, e // k], e % k].
The step's writes come before its reads: a decode token's window includes
its own position, and entries completed in the step may be read in it.
"""
from __future__ import annotations

import random
from typing import Dict, List, NamedTuple

import numpy as np
import torch

from attention_metadata import CSA, HCA, AttentionMetadata, Chunk, token_inputs, token_positions
from ukv_torch import KvStepOps

TAG_MASK = (1 << 62) - 1
GARBAGE = 1 << 30  # what the indexer leaves in unused top-k lanes: the ops must not read it
NEVER_WRITTEN = -1


def extend_tags(tags: np.ndarray, tokens) -> np.ndarray:
    """tags[p] identifies tokens[0..p]: the tags of these tokens appended."""
    new, last = [], int(tags[-1]) if len(tags) else 0
    for t in tokens:
        last = hash((last, int(t))) & TAG_MASK
        new.append(last)
    return np.concatenate([tags, np.array(new, dtype=np.int64)])


class Work(NamedTuple):
    """A sequence's positions this step and the tags of its tokens (drafts included)."""
    chunk: Chunk
    tags: np.ndarray


class Expected:
    """What one index output must read, token by token: tags, and whether each is a compressed entry."""

    def __init__(self):
        self.parts: List[np.ndarray] = []
        self.compressed: List[bool] = []
        self.lengths: List[int] = []

    def add(self, *parts) -> None:
        """One token's slice: (tags, compressed) pairs in slice order."""
        for tags, compressed in parts:
            self.parts.append(tags)
            self.compressed.append(compressed)
        self.lengths.append(sum(len(tags) for tags, _ in parts))

    def indptr(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def arrays(self):
        """(tags, compressed) over all tokens."""
        tags = np.concatenate(self.parts).astype(np.int64)
        return tags, np.repeat(self.compressed, [len(p) for p in self.parts])


class TaggedModel:
    def __init__(self, step: KvStepOps, metadata: AttentionMetadata, seed: int):
        self.step, self.plan, self.kv, self.metadata = step, step.plan, step.kv, metadata
        self.index_topk = metadata.index_topk
        self.cfg = self.plan.config
        self.layers = self.plan.model.layer_ratios
        for t in self.kv.planes or self.kv.kv:
            t.fill_(NEVER_WRITTEN)
        self.views = {layer: step.compress_view(layer) for layer, r in enumerate(self.layers) if r}
        salts = random.Random(seed)
        self.salt = {(layer, cmp): salts.getrandbits(62) for layer in range(len(self.layers)) for cmp in (False, True)}
        self.rng = np.random.default_rng(seed)
        self.checked = 0
        self.mismatches: List[str] = []

    def forward(self, tables: torch.Tensor, decode: List[Work], prefill: List[Work]) -> None:
        """tables: the staged rows of the step's batch (a token's batch id is its row)."""
        self._write(tables, decode + prefill)
        if decode:
            self._check_decode(tables, decode)
        if prefill:
            self._check_prefill(tables, prefill)

    # --- the model's KV writes ---------------------------------------------------
    def _write(self, tables: torch.Tensor, works: List[Work]) -> None:
        positions, batch_id = token_positions([w.chunk for w in works], tables.device)
        tags = torch.as_tensor(np.concatenate([w.tags[w.chunk.start: w.chunk.start + w.chunk.count]
                                               for w in works])).to(tables.device)
        slots = torch.empty_like(batch_id)
        for ratio in sorted(set(self.layers)):  # one slot mapping per layer class serves its every layer
            self.step.swa_slot_mapping(positions, batch_id, slots, ratio=ratio, tables=tables)
            keep = slots >= 0
            for layer in self._layers_of(ratio):
                self.kv.kv[layer][slots[keep].long(), 0] = tags[keep] ^ self.salt[(layer, False)]
        for ratio in (CSA, HCA):
            self._write_compressed(tables, works, ratio)

    def _write_compressed(self, tables: torch.Tensor, works: List[Work], ratio: int) -> None:
        """The entries whose last position this step computed."""
        k = self.cfg.block_size // ratio
        entries = [np.arange(w.chunk.start // ratio, (w.chunk.start + w.chunk.count) // ratio) for w in works]
        e = np.concatenate(entries)
        if len(e) == 0:
            return
        rows = np.concatenate([np.full(len(es), w.chunk.row) for w, es in zip(works, entries)])
        tags = np.concatenate([w.tags[ratio * es + ratio - 1] for w, es in zip(works, entries)])
        device = tables.device
        table = self.step.table(ratio, tables)
        block = table[torch.as_tensor(rows).to(device), torch.as_tensor(e // k).to(device)].long()
        slot, tags = torch.as_tensor(e % k).to(device), torch.as_tensor(tags).to(device)
        for layer in self._layers_of(ratio):
            self.views[layer][block, slot, 0] = tags ^ self.salt[(layer, True)]

    def _layers_of(self, ratio: int) -> List[int]:
        return [layer for layer, r in enumerate(self.layers) if r == ratio]

    # --- the indexer: random picks among the visible CSA entries ---------------------
    def _topk(self, x: Dict[str, torch.Tensor]) -> np.ndarray:
        positions = x["positions"].cpu().numpy()
        visible = np.minimum((positions + 1) // CSA, x["n_csa"].cpu().numpy()[x["batch_id"].cpu().numpy()])
        picks = (self.rng.random((len(positions), self.index_topk)) * visible[:, None]).astype(np.int64)
        picks[np.arange(self.index_topk) >= np.minimum(visible, self.index_topk)[:, None]] = GARBAGE
        return picks

    # --- the checks -----------------------------------------------------------------
    def _check_decode(self, tables: torch.Tensor, works: List[Work]) -> None:
        x = token_inputs([w.chunk for w in works], tables.shape[0], True, tables.device)
        picks = self._topk(x)
        indptr, out = self.metadata.decode(tables, x, torch.as_tensor(picks, dtype=torch.int32).to(tables.device))
        self._compare_all("decode", x, indptr, out, self._expected(works, x, picks, decode=True))

    def _check_prefill(self, tables: torch.Tensor, works: List[Work]) -> None:
        x = token_inputs([w.chunk for w in works], tables.shape[0], False, tables.device)
        picks = self._topk(x)
        indptr, out = self.metadata.prefill(tables, x, torch.as_tensor(picks, dtype=torch.int32).to(tables.device))
        # Extend: rows of the forward's own kv (the chunks packed in order), ending at the token's row.
        extend, query = [], 0
        for w in works:
            for q in range(w.chunk.count):
                extend.append(np.arange(query + q - min(q + 1, self.cfg.window) + 1, query + q + 1))
            query += w.chunk.count
        extend = np.concatenate(extend)
        if not np.array_equal(out["extend"][: len(extend)].cpu().numpy(), extend):
            self.mismatches.append("prefill extend: the indices are not the forward's own kv rows")
        self._compare_all("prefill", x, indptr, out, self._expected(works, x, picks, decode=False))

    def _expected(self, works: List[Work], x: Dict[str, torch.Tensor], picks: np.ndarray,
                  decode: bool) -> Dict[str, Expected]:
        """What each token's slices must read. Through the tables, a decode token reads
        its whole window, a prefill token the part of it before the chunk; CSA reads
        the picked entries, HCA the committed ones (prefill: capped at the token),
        decode at the head and prefill after the SWA part."""
        committed_hca = x["n_hca"].cpu().numpy()
        want = {name: Expected() for name in ("swa", "csa", "hca")}
        t = 0
        for w in works:
            start = w.chunk.start
            for p in range(start, start + w.chunk.count):
                swa = (w.tags[max(p - self.cfg.window + 1, 0): p + 1 if decode else start], False)
                csa = (w.tags[CSA * picks[t, : min((p + 1) // CSA, self.index_topk)] + CSA - 1], True)
                n_hca = committed_hca[w.chunk.row] if decode else min((p + 1) // HCA, committed_hca[w.chunk.row])
                hca = (w.tags[HCA * np.arange(n_hca) + HCA - 1], True)
                want["swa"].add(swa)
                want["csa"].add(csa, swa)
                want["hca"].add(*((hca, swa) if decode else (swa, hca)))
                t += 1
        return want

    def _compare_all(self, phase: str, x: Dict[str, torch.Tensor], indptr, out, want: Dict[str, Expected]) -> None:
        positions = x["positions"].cpu().numpy()
        for name, ratio in (("swa", 0), ("csa", CSA), ("hca", HCA)):
            self._compare(f"{phase} {name}", ratio, positions, indptr[name], out[name], want[name])

    def _compare(self, what: str, ratio: int, positions: np.ndarray, indptr: torch.Tensor, indices: torch.Tensor,
                 want: Expected) -> None:
        """Every layer of the output's class must hold the expected tag at every index."""
        want_ptr = want.indptr()
        if not np.array_equal(indptr.cpu().numpy(), want_ptr):
            self.mismatches.append(f"{what}: indptr {indptr.cpu().tolist()[:8]}... expected {want_ptr.tolist()[:8]}...")
            return
        device = indices.device
        index = indices[: want_ptr[-1]].long()
        tags, compressed = (torch.as_tensor(a).to(device) for a in want.arrays())
        for layer in self._layers_of(ratio):
            kv = self.kv.kv[layer][:, 0]
            salt = torch.where(compressed, self.salt[(layer, True)], self.salt[(layer, False)])
            inside = (index >= 0) & (index < kv.numel())
            found = torch.where(inside, kv.index_select(0, index.clamp(0, kv.numel() - 1)), NEVER_WRITTEN - 1)
            bad = (found != (tags ^ salt)).nonzero().flatten()
            self.checked += index.numel()
            for i in bad[:3].tolist():
                token = int(np.searchsorted(want_ptr, i, side="right")) - 1
                kind = "compressed entry" if compressed[i] else "SWA row"
                self.mismatches.append(f"{what} layer {layer}: the token at position {positions[token]} reads row "
                                       f"{int(index[i])}, which does not hold its expected {kind}")
