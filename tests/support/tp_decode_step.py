"""The decode step a tensor-parallel rank runs from staged tables, for
tests/integration/tp_consistency.py: persistent inputs and outputs (so a CUDA
graph can replay it), the one message the scheduler rank sends per step, and
the per-token Python reference (ukv_torch/testing/index_reference.py via
index_steps.py).

The outputs live in one flat int32 buffer, [swa_indptr, csa_indptr,
hca_indptr, swa, csa, hca], each slice sized for the largest step, so one
all-gather compares a whole step across ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

import ukv_torch
from ukv_torch.demo.captured_decode import capture
from support.index_cases import SENTINEL, Step
from support.index_steps import reference_decode

GARBAGE = 1 << 30  # unused top-k lanes hold this; the ops must not read them
HEADER = ("stop", "step", "rows", "decode_tokens")
OUTPUTS = ("swa_indptr", "csa_indptr", "hca_indptr", "swa", "csa", "hca")


@dataclass
class Layout:
    """What every rank knows from the engine configuration."""
    config: ukv_torch.ServeConfig
    index_topk: int
    compress_base: int

    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def csa_type(self) -> int:
        return self.config.type_of_ratio(4)

    @property
    def hca_type(self) -> int:
        return self.config.type_of_ratio(128)


@dataclass
class DecodeRows:
    """The scheduler's decode tokens of one step: row i of the batch decodes
    position positions[i] and may pick top-k entries picks[i]."""
    positions: np.ndarray  # [n] int64
    picks: np.ndarray      # [n, index_topk] int64


class DecodeStep:
    def __init__(self, layout: Layout, device: torch.device):
        self.layout, self.device = layout, device
        n, k = layout.max_num_seqs, layout.index_topk
        i32 = dict(dtype=torch.int32, device=device)
        self.inputs = {"positions": torch.zeros(n, dtype=torch.int64, device=device),
                       "batch_id": torch.full((n,), -1, **i32), "n_csa": torch.zeros(n, **i32),
                       "n_hca": torch.zeros(n, **i32), "topk": torch.zeros(n, k, **i32)}
        # A token reads at most the window plus max(top-k, every HCA entry).
        self.capacity = n * (layout.config.window + max(k, layout.config.max_blocks_per_seq))
        self.sizes = [n + 1] * 3 + [self.capacity] * 3
        self.message = torch.zeros(len(HEADER) + sum(t.numel() for t in self.inputs.values()), dtype=torch.int64,
                                   device=device)

    # --- the scheduler's message ------------------------------------------------
    def pack(self, step: int, rows: int, decode: Optional[DecodeRows], stop: bool = False) -> None:
        """Fill the message on the scheduler rank (a stop message ends the run)."""
        n, k = self.layout.max_num_seqs, self.layout.index_topk
        count = 0 if decode is None else len(decode.positions)
        positions, picks = np.zeros(n, np.int64), np.full((n, k), GARBAGE, np.int64)
        if count:
            positions[:count], picks[:count] = decode.positions, decode.picks
        batch_id = np.where(np.arange(n) < count, np.arange(n), -1)
        n_csa = np.where(batch_id >= 0, (positions + 1) // 4, 0)
        n_hca = np.where(batch_id >= 0, (positions + 1) // 128, 0)
        parts = [[int(stop), step, rows, count], positions, batch_id, n_csa, n_hca, picks.ravel()]
        self.message.copy_(torch.from_numpy(np.concatenate(parts).astype(np.int64)))

    def header(self) -> Dict[str, int]:
        return dict(zip(HEADER, self.message[: len(HEADER)].tolist()))

    def unpack(self) -> None:
        """Copy the received message into the persistent inputs (device-side, graph-safe)."""
        offset = len(HEADER)
        for t in self.inputs.values():
            t.copy_(self.message[offset: offset + t.numel()].view(t.shape))
            offset += t.numel()

    # --- the step ------------------------------------------------------------------
    def output_buffer(self) -> torch.Tensor:
        return torch.full((sum(self.sizes),), SENTINEL, dtype=torch.int32, device=self.device)

    def run(self, tables: torch.Tensor, out: torch.Tensor) -> None:
        """The decode step's index ops on the staged tables, into `out` (also what a graph captures)."""
        x, lay, c = self.inputs, self.layout, self.layout.config
        o = dict(zip(OUTPUTS, out.split(self.sizes)))
        out.fill_(SENTINEL)
        swa, csa, hca = (tables[: c.max_num_seqs, ukv_torch.table_index(c, name)] for name in ("swa", 4, 128))
        ukv_torch.decode_index_metadata(x["positions"], x["batch_id"], x["n_csa"], x["n_hca"], o["swa_indptr"],
                                        o["csa_indptr"], o["hca_indptr"], window=c.window,
                                        index_topk=lay.index_topk)
        ukv_torch.paged_decode_indices(swa, x["positions"], x["batch_id"], o["swa_indptr"], o["swa"],
                                       o["csa_indptr"], o["csa"], o["hca_indptr"], o["hca"], window=c.window,
                                       block_size=c.block_size)
        ukv_torch.csa_translate_pack(x["topk"], csa, x["positions"], x["batch_id"], o["csa_indptr"], o["csa"],
                                     compress_base=lay.compress_base, window=c.window, block_size=c.block_size)
        ukv_torch.hca_decode_indices(hca, x["batch_id"], x["n_hca"], o["hca_indptr"], o["hca"],
                                     compress_base=lay.compress_base, block_size=c.block_size)

    def capture(self, tables: torch.Tensor, out: torch.Tensor) -> "torch.cuda.CUDAGraph":
        """Capture run(tables, out); replays read whatever `tables` and the inputs hold then."""
        return capture(lambda: self.run(tables, out), self.device)

    def locate(self, flat_index: int) -> str:
        """'csa[17]' for a flat output index."""
        for name, size in zip(OUTPUTS, self.sizes):
            if flat_index < size:
                return f"{name}[{flat_index}]"
            flat_index -= size
        raise IndexError(flat_index)

    # --- the reference -------------------------------------------------------------
    def reference(self, decode: DecodeRows, swa: Sequence[List[int]], csa: Sequence[List[int]],
                  hca: Sequence[List[int]]) -> List[int]:
        """The flat output the step must produce, per token from upstream's index formulas;
        swa/csa/hca are the decode sequences' own tables (KvManager accessors)."""
        lay, n = self.layout, len(decode.positions)
        pad = lay.max_num_seqs - n
        positions = [int(p) for p in decode.positions] + [0] * pad
        step = Step(block_size=lay.config.block_size, window=lay.config.window, index_topk=lay.index_topk,
                    compress_base=lay.compress_base, positions=positions, batch_id=list(range(n)) + [-1] * pad,
                    swa_table=list(swa), csa_table=list(csa), hca_table=list(hca),
                    n_csa=[(p + 1) // 4 for p in positions[:n]], n_hca=[(p + 1) // 128 for p in positions[:n]],
                    topk=[[int(v) for v in row] for row in decode.picks] + [[GARBAGE] * lay.index_topk] * pad)
        ref = reference_decode(step)
        flat = []
        for name, size in zip(OUTPUTS, self.sizes):
            cells = ref[name][:size] if name.endswith("indptr") else ref[name][: ref[name + "_indptr"][-1]]
            flat += cells + [SENTINEL] * (size - len(cells))
        return flat


def draw_decode_rows(rng: np.random.Generator, positions: Sequence[int], index_topk: int) -> DecodeRows:
    """Random valid top-k picks (sequence-local CSA entries) per decode token, garbage after them."""
    p = np.asarray(positions, dtype=np.int64)
    picks = np.full((len(p), index_topk), GARBAGE, np.int64)
    for i, visible in enumerate((p + 1) // 4):
        valid = min(int(visible), index_topk)
        picks[i, :valid] = rng.integers(0, max(int(visible), 1), valid)
    return DecodeRows(p, picks)
