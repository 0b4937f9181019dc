"""Integrity check of one serving step: build the step's indices with the real
ops from the staged tables, and check that every index points at a row
holding the content tag the attention would expect there.

Expectations are computed here, independently of the kernels, from the
per-token formulas of upstream's index builders:
- decode token at p: SWA window positions p-n+1..p (n = min(p+1, window)); CSA
  head = the top-k picks (valid_k = min((p+1)//4, committed, index_topk)) then
  the window; HCA head = entries 0..(p+1)//128-1 then the window;
- prefill token at p in a chunk from cs: extend rows of the forward's kv; SWA
  prefix positions max(p-window+1, 0)..cs-1; CSA = picks then the prefix; HCA =
  the prefix then entries 0..min((p+1)//128, committed)-1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from .. import ServeConfig, ops, table_index
from .captured_decode import CapturedDecode
from .content_tags import CSA_SALT, HCA_SALT, SWA_SALT
from .tagged_kv import TaggedKv

GARBAGE = 1 << 30  # what an uninitialised top-k lane may hold; the kernels must not read it


def ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + c) for each (s, c)."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - offsets + np.repeat(starts, counts)


@dataclass
class Token:
    """The tokens one staged row contributes to the step."""
    row: int
    tags: np.ndarray   # the request's prefix tags
    start: int         # first position computed this step (chunk start)
    count: int         # positions computed this step
    label: str         # for reports


@dataclass
class Mismatch:
    label: str
    position: int
    role: str
    layer: int
    row: int
    expected: int
    found: int


class IntegrityChecker:
    def __init__(self, kv: TaggedKv, index_topk: int, config: ServeConfig, device: torch.device, seed: int):
        self.kv, self.window, self.topk, self.device = kv, config.window, index_topk, device
        self.bs = config.block_size
        # Where the staged tables keep each table; no CSA / HCA table without that compress type.
        self.logical_table, self.swa_table = table_index(config, "logical"), table_index(config, "swa")
        self.csa_table = table_index(config, 4) if 4 in config.compress_ratios else None
        self.hca_table = table_index(config, 128) if 128 in config.compress_ratios else None
        # The SWA rows of each output's class: SWA-only (dense) layers, CSA, HCA.
        self.swa_rows = {"swa_rows": kv.swa_rows_of(0), "csa_swa_rows": kv.swa_rows_of(4),
                         "hca_swa_rows": kv.swa_rows_of(128)}
        self.rng = np.random.default_rng(seed)
        self.mismatches: List[Mismatch] = []
        self.checked = 0
        self.captured: Optional[CapturedDecode] = None

    def capture_decode(self, tables: torch.Tensor) -> None:
        """Build every later decode step's indices by replaying one CUDA graph
        that reads the persistent `tables` (all max_num_seqs rows)."""
        self.captured = CapturedDecode(tables, tables.shape[0], self.window, self.topk, self.decode_ops_into)

    # --- helpers -----------------------------------------------------------
    def _t(self, a: np.ndarray, dtype=torch.int32) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype).to(self.device)

    def _topk(self, valid: np.ndarray) -> np.ndarray:
        picks = np.full((len(valid), self.topk), GARBAGE, dtype=np.int64)
        for i, (v, n) in enumerate(zip(valid, self.valid_range)):
            if v:
                picks[i, :v] = self.rng.integers(0, n, v)
        return picks

    def _check(self, indices: torch.Tensor, expected: np.ndarray, owners: List[Tuple[str, np.ndarray]],
               roles: np.ndarray, ratio: int) -> None:
        """indices: the op's output; expected: content tags (unsalted); roles: 0 SWA, 1 compress."""
        role_salt = {0: SWA_SALT, 4: CSA_SALT, 128: HCA_SALT}[ratio]
        exp = torch.as_tensor(expected, dtype=torch.int64).to(self.device)
        is_cmp = torch.as_tensor(roles, dtype=torch.bool).to(self.device)
        rows = indices.long()
        for layer, r in enumerate(self.kv.ratios):
            if r != ratio:
                continue
            salt = torch.where(is_cmp, torch.tensor(self.kv.salts[layer] ^ role_salt, device=self.device),
                               torch.tensor(self.kv.salts[layer] ^ SWA_SALT, device=self.device))
            in_bounds = (rows >= 0) & (rows < self.kv.kv[layer].shape[0])
            found = torch.where(in_bounds, self.kv.kv[layer][rows.clamp(0, self.kv.kv[layer].shape[0] - 1), 0],
                                torch.full_like(exp, -2))
            bad = found != (exp ^ salt)
            self.checked += int(rows.numel())
            if bool(bad.any()):
                self._report(bad, rows, found, exp ^ salt, owners, roles, layer, ratio)

    def _report(self, bad, rows, found, want, owners, roles, layer, ratio) -> None:
        labels, positions = owners
        for i in torch.nonzero(bad).flatten()[:5].tolist():
            role = ("HCA" if ratio == 128 else "CSA") if roles[i] else "SWA"
            self.mismatches.append(Mismatch(labels[i], int(positions[i]), role, layer, int(rows[i]), int(want[i]),
                                            int(found[i])))

    # --- decode ------------------------------------------------------------
    def decode(self, tokens: List[Token], tables: torch.Tensor, num_rows: int) -> None:
        """tokens: one per decode row (count 1); tables: the staged tables."""
        if not tokens:
            return
        p = np.array([t.start for t in tokens], dtype=np.int64)
        bid = np.array([t.row for t in tokens], dtype=np.int64)
        n_swa = np.minimum(p + 1, self.window)
        n_csa_seq = np.zeros(num_rows, dtype=np.int64)
        n_hca_seq = np.zeros(num_rows, dtype=np.int64)
        n_csa_seq[bid] = (p + 1) // 4
        n_hca_seq[bid] = (p + 1) // 128
        valid = np.minimum((p + 1) // 4, self.topk)
        n_hca = (p + 1) // 128
        swa_ptr = np.concatenate([[0], np.cumsum(n_swa)])
        csa_ptr = np.concatenate([[0], np.cumsum(n_swa + valid)])
        hca_ptr = np.concatenate([[0], np.cumsum(n_swa + n_hca)])
        self.valid_range = (p + 1) // 4
        picks = self._topk(valid)
        if self.captured is not None:
            out = self.captured.run(self.decode_inputs(p, bid, n_csa_seq, n_hca_seq, picks))
        else:
            out = self._decode_ops(p, bid, n_csa_seq, n_hca_seq, picks, tables, swa_ptr, csa_ptr, hca_ptr)
        # The device-side indptrs must be exactly the formulas'.
        for name, want in (("swa_indptr", swa_ptr), ("csa_indptr", csa_ptr), ("hca_indptr", hca_ptr)):
            got = out[name][: len(want)].cpu().numpy()
            if not np.array_equal(got, want):
                self.mismatches.append(Mismatch(f"decode {name}", -1, name, -1, -1, int(want[-1]), int(got[-1])))
                return
        window_pos = ragged(p - n_swa + 1, n_swa)
        window_tags = np.concatenate([t.tags[t.start - n + 1: t.start + 1] for t, n in zip(tokens, n_swa)])
        labels = np.concatenate([[t.label] * n for t, n in zip(tokens, n_swa)])
        self._check(out["swa_indices"][: swa_ptr[-1]], window_tags, (labels, window_pos), np.zeros(len(window_tags), bool), 0)
        if self.csa_table is not None:
            exp, pos, lab, roles = [], [], [], []
            for i, t in enumerate(tokens):
                entries = picks[i, : valid[i]]
                w = slice(swa_ptr[i], swa_ptr[i + 1])
                exp += [t.tags[4 * entries + 3], window_tags[w]]
                pos += [4 * entries + 3, window_pos[w]]
                lab += [t.label] * (valid[i] + n_swa[i])
                roles += [np.ones(valid[i], bool), np.zeros(n_swa[i], bool)]
            self._check(out["csa_indices"][: csa_ptr[-1]], np.concatenate(exp), (lab, np.concatenate(pos)),
                        np.concatenate(roles), 4)
        if self.hca_table is not None:
            exp, pos, lab, roles = [], [], [], []
            for i, t in enumerate(tokens):
                entries = np.arange(n_hca[i])
                w = slice(swa_ptr[i], swa_ptr[i + 1])
                exp += [t.tags[128 * entries + 127], window_tags[w]]
                pos += [128 * entries + 127, window_pos[w]]
                lab += [t.label] * (n_hca[i] + n_swa[i])
                roles += [np.ones(n_hca[i], bool), np.zeros(n_swa[i], bool)]
            self._check(out["hca_indices"][: hca_ptr[-1]], np.concatenate(exp), (lab, np.concatenate(pos)),
                        np.concatenate(roles), 128)

    def decode_inputs(self, p, bid, n_csa_seq, n_hca_seq, picks):
        return {"positions": self._t(p, torch.int64), "batch_id": self._t(bid), "n_csa": self._t(n_csa_seq),
                "n_hca": self._t(n_hca_seq), "topk": self._t(picks)}

    def _decode_ops(self, p, bid, n_csa_seq, n_hca_seq, picks, tables, swa_ptr, csa_ptr, hca_ptr) -> dict:
        x = self.decode_inputs(p, bid, n_csa_seq, n_hca_seq, picks)
        out = {name: torch.zeros(len(p) + 1, dtype=torch.int32, device=self.device)
               for name in ("swa_indptr", "csa_indptr", "hca_indptr")}
        ops.decode_index_metadata(x["positions"], x["batch_id"], x["n_csa"], x["n_hca"], out["swa_indptr"],
                                  out["csa_indptr"], out["hca_indptr"], window=self.window, index_topk=self.topk)
        for name, ptr in (("swa_indices", swa_ptr), ("csa_indices", csa_ptr), ("hca_indices", hca_ptr)):
            out[name] = torch.full((max(int(ptr[-1]), 1),), -1, dtype=torch.int32, device=self.device)
        self.decode_ops_into(x, tables, out)
        return out

    def decode_ops_into(self, x: dict, tables: torch.Tensor, out: dict) -> None:
        """The decode step's index ops (also what a captured graph replays)."""
        swa = tables[:, self.swa_table]
        ops.paged_decode_indices(swa, x["positions"], x["batch_id"], out["swa_indptr"], out["swa_indices"],
                                 out["csa_indptr"], out["csa_indices"], out["hca_indptr"], out["hca_indices"],
                                 window=self.window, block_size=self.bs, **self.swa_rows)
        if self.csa_table is not None:
            ops.csa_translate_pack(x["topk"], tables[:, self.csa_table], x["positions"], x["batch_id"],
                                   out["csa_indptr"], out["csa_indices"], window=self.window, block_size=self.bs,
                                   **self.kv.compress_args[4])
        if self.hca_table is not None:
            ops.hca_decode_indices(tables[:, self.hca_table], x["batch_id"], x["n_hca"], out["hca_indptr"],
                                   out["hca_indices"], block_size=self.bs, **self.kv.compress_args[128])

    # --- prefill -----------------------------------------------------------
    def prefill(self, chunks: List[Token], tables: torch.Tensor, num_rows: int) -> None:
        if not chunks:
            return
        cs = np.array([c.start for c in chunks], dtype=np.int64)
        cnt = np.array([c.count for c in chunks], dtype=np.int64)
        rows = np.array([c.row for c in chunks], dtype=np.int64)
        p = ragged(cs, cnt)
        bid = np.repeat(rows, cnt)
        tok_cs = np.repeat(cs, cnt)
        qstart_seq = np.cumsum(cnt) - cnt
        end = cs + cnt
        chunk_start = np.zeros(num_rows, dtype=np.int64)
        query_start = np.zeros(num_rows, dtype=np.int64)
        n_csa_seq = np.zeros(num_rows, dtype=np.int64)
        n_hca_seq = np.zeros(num_rows, dtype=np.int64)
        chunk_start[rows], query_start[rows] = cs, qstart_seq
        n_csa_seq[rows], n_hca_seq[rows] = end // 4, end // 128
        swa_low = np.maximum(p - self.window + 1, 0)
        ext = np.minimum(p - tok_cs + 1, self.window)
        pre = np.maximum(tok_cs - swa_low, 0)
        valid = np.minimum(np.minimum((p + 1) // 4, np.repeat(end // 4, cnt)), self.topk)
        n_hca = np.minimum((p + 1) // 128, np.repeat(end // 128, cnt))
        ptrs = {"extend": np.concatenate([[0], np.cumsum(ext)]), "swa": np.concatenate([[0], np.cumsum(pre)]),
                "csa": np.concatenate([[0], np.cumsum(pre + valid)]),
                "hca": np.concatenate([[0], np.cumsum(pre + n_hca)])}
        self.valid_range = np.maximum((p + 1) // 4, 1)
        picks = self._topk(valid)
        T = len(p)
        dev = lambda a, dt=torch.int32: self._t(a, dt)
        ind = {k: torch.zeros(T + 1, dtype=torch.int32, device=self.device) for k in ptrs}
        prefix_count = torch.zeros(T, dtype=torch.int32, device=self.device)
        positions, batch = dev(p, torch.int64), dev(bid)
        ops.prefill_index_metadata(positions, batch, dev(chunk_start), dev(n_csa_seq), dev(n_hca_seq), ind["extend"],
                                   ind["swa"], ind["csa"], ind["hca"], prefix_count, window=self.window,
                                   index_topk=self.topk)
        for k, want in ptrs.items():
            if not np.array_equal(ind[k].cpu().numpy(), want):
                self.mismatches.append(Mismatch(f"prefill {k}_indptr", -1, k, -1, -1, int(want[-1]),
                                                int(ind[k][-1])))
                return
        out = {k: torch.full((max(int(v[-1]), 1),), -1, dtype=torch.int32, device=self.device) for k, v in ptrs.items()}
        hca_table = tables[:, self.logical_table if self.hca_table is None else self.hca_table]
        hca = self.kv.compress_args.get(128, {"compress_base": 0, "block_stride": None})
        ops.paged_prefill_indices(positions, batch, dev(chunk_start), dev(query_start), dev(n_hca_seq),
                                  tables[:, self.swa_table], hca_table, ind["extend"], ind["swa"], ind["csa"],
                                  ind["hca"], out["extend"], out["swa"], out["csa"], out["hca"],
                                  compress_base=hca["compress_base"], hca_block_stride=hca["block_stride"],
                                  window=self.window, block_size=self.bs, **self.swa_rows)
        if self.csa_table is not None:
            ops.csa_translate_pack(dev(picks), tables[:, self.csa_table], positions, batch, ind["csa"], out["csa"],
                                   skip_per_token=prefix_count, block_size=self.bs, **self.kv.compress_args[4])
        # Extend: rows of the forward's own kv, ending at the token's row.
        tok_q = np.repeat(qstart_seq, cnt) + (p - tok_cs)
        want_ext = ragged(tok_q - ext + 1, ext)
        got_ext = out["extend"][: len(want_ext)].cpu().numpy()
        if not np.array_equal(got_ext, want_ext):
            self.mismatches.append(Mismatch("prefill extend", -1, "extend", -1, -1, -1, -1))
        # Per token: the request's tags and labels.
        owner = np.repeat(np.arange(len(chunks)), cnt)
        prefix_pos = ragged(swa_low, pre)
        prefix_owner = np.repeat(owner, pre)
        flat = np.concatenate([c.tags for c in chunks])
        tag_base = np.cumsum([len(c.tags) for c in chunks]) - np.array([len(c.tags) for c in chunks])
        prefix_tags = flat[tag_base[prefix_owner] + prefix_pos]
        labels = [c.label for c in chunks]
        self._check(out["swa"][: ptrs["swa"][-1]], prefix_tags, ([labels[o] for o in prefix_owner], prefix_pos),
                    np.zeros(len(prefix_pos), bool), 0)
        pre_ptr = ptrs["swa"]
        for ratio, ptr_key in ((4, "csa"), (128, "hca")):
            if (self.csa_table if ratio == 4 else self.hca_table) is None:
                continue
            exp, pos, lab, roles = [], [], [], []
            for t in range(T):
                tags = chunks[owner[t]].tags
                entries = picks[t, : valid[t]] if ratio == 4 else np.arange(n_hca[t])
                epos = ratio * entries + ratio - 1
                w = slice(pre_ptr[t], pre_ptr[t + 1])
                parts = [(tags[epos], epos, True), (prefix_tags[w], prefix_pos[w], False)]
                if ratio == 128:
                    parts.reverse()  # HCA prefill: SWA prefix head, compress tail (decode is the reverse)
                for e, q, is_cmp in parts:
                    exp.append(e)
                    pos.append(q)
                    roles.append(np.full(len(e), is_cmp))
                lab += [labels[owner[t]]] * (len(epos) + (pre_ptr[t + 1] - pre_ptr[t]))
            self._check(out[ptr_key][: ptrs[ptr_key][-1]], np.concatenate(exp), (lab, np.concatenate(pos)),
                        np.concatenate(roles), ratio)
