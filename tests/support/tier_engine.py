"""A small engine over real KV tensors for the tier tests: a model with a RoPE
plane and a CSA indexer (every byte kind a tier object carries), random KV
contents, and the direct reading of a block's or a position's rows that the
objects are checked against."""
from __future__ import annotations

from typing import List

import torch

from ukv_torch import (KvManager, ModelKvSpec, ServeConfig, allocate_unified_kv, apply_row_copies, plan_kv_layout,
                       swa_slot_mapping)
from ukv_torch.tiers import HostTier, TierCache

BS, WINDOW = 128, 128
MODEL = ModelKvSpec(layer_ratios=(0, 4, 128, 4, 128), head_dim=4, kv_elem_bytes=1, rope_head_dim=2,
                    rope_elem_bytes=2, indexer_bytes_per_block=64)


class TierEngine:
    """A manager, its KV tensors (random bytes), and a TierCache over ``backends``."""

    def __init__(self, layout: str, backends, *, page: int = 32, budget_kib: int = 256, seed: int = 0,
                 device: str = "cpu", max_num_batched_tokens: int = 1024):
        config = ServeConfig(layout=layout, window=WINDOW, block_size=BS, compress_ratios=(4, 128), max_num_seqs=8,
                             max_num_batched_tokens=max_num_batched_tokens, max_blocks_per_seq=16, swa_sizing="step",
                             swa_page_tokens=page if layout == "row_space" else 0)
        self.plan = plan_kv_layout(budget_kib << 10, MODEL, config)
        self.kv = allocate_unified_kv(self.plan, dtype=torch.uint8, rope_dtype=torch.int16, device=device)
        gen = torch.Generator().manual_seed(seed)
        for t in list(self.kv.kv) + [r for r in self.kv.rope if r is not None] + \
                [i for i in self.kv.indexer if i is not None] + list(self.kv.planes):
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=gen,
                                                    dtype=torch.uint8))
        self.mgr = KvManager(self.plan, device=None if device == "cpu" else device)
        self.tiers = TierCache(self.plan, self.kv, backends)

    def step_rows(self, seq_ids: List[int]) -> None:
        """Stage the sequences and apply the row space's moves, as a step does before its forward."""
        self.mgr.stage(seq_ids)
        self.mgr.upload(len(seq_ids))
        if self.kv.planes:
            apply_row_copies(list(self.kv.planes), self.mgr.row_copies, self.mgr.row_copy_counts)

    def prefill(self, seq_id: int, tokens: List[int]) -> int:
        """Admit through the tiers and compute the whole prompt in one chunk (the KV is
        whatever the rows hold); then save what it published. Returns admit's answer."""
        cached = self.tiers.admit(self.mgr, seq_id, tokens)
        assert cached >= 0, cached
        chunk = len(tokens) - cached
        self.mgr.ensure_for_tokens([seq_id], [chunk])
        self.step_rows([seq_id])
        self.mgr.commit_prefill([seq_id], [chunk], [7])
        self.tiers.save(self.mgr, self.mgr.take_events())
        self.tiers.flush()
        return cached

    # --- the rows, read directly (the reference) ------------------------------------------
    def block_bytes(self, seq_id: int, block: int) -> List[bytes]:
        """Every compress layer's rows of a block and its CSA indexer entries."""
        out, cfg = [], self.plan.config
        row_space = cfg.layout == "row_space"
        logical = int(self.mgr.logical_table(seq_id)[block])
        for layer, ratio in enumerate(MODEL.layer_ratios):
            if not ratio:
                continue
            args = self.plan.compress_args(ratio)
            phys = int(self.mgr.phys_table(seq_id, 0 if row_space else cfg.type_of_ratio(ratio))[block])
            first = args["compress_base"] + phys * args["block_stride"]
            for plane in (self.kv.kv[layer], self.kv.rope[layer]):
                out.append(plane[first: first + BS // ratio].contiguous().view(torch.uint8).cpu().numpy().tobytes())
            if ratio == 4:
                out.append(self.kv.indexer[layer][phys if row_space else logical].cpu().numpy().tobytes())
        return out

    def swa_planes(self, seq_id: int, position: int):
        """Every layer's SWA row of a position (through the staged SWA table), as
        (plane, row) pairs: the KV plane's and the RoPE plane's."""
        out, page = [], self.plan.config.swa_page
        unit = int(self.mgr.staged_swa_table(seq_id)[position // page])
        assert unit >= 0, f"position {position} has no SWA page"
        for layer, ratio in enumerate(MODEL.layer_ratios):
            rows = torch.empty(1, dtype=torch.int32)
            swa_slot_mapping(torch.tensor([[unit]], dtype=torch.int32), torch.tensor([position % page]),
                             torch.zeros(1, dtype=torch.int32), rows, block_size=BS,
                             swa_rows=list(self.plan.swa_rows(ratio)))
            out += [(plane, int(rows[0])) for plane in (self.kv.kv[layer], self.kv.rope[layer])]
        return out

    def position_bytes(self, seq_id: int, position: int) -> List[bytes]:
        """Every layer's SWA row of a position."""
        return [plane[row].contiguous().view(torch.uint8).cpu().numpy().tobytes()
                for plane, row in self.swa_planes(seq_id, position)]

    def write_swa(self, seq_id: int, positions, seed: int) -> None:
        """The model's SWA writes: random bytes into every layer's row of each position."""
        gen = torch.Generator().manual_seed(seed)
        for position in positions:
            for plane, row in self.swa_planes(seq_id, position):
                target = plane[row].view(torch.uint8)
                target.copy_(torch.randint(0, 256, target.shape, generator=gen, dtype=torch.uint8))


def host(mib: int = 64) -> HostTier:
    return HostTier(mib << 20)  # page-locked where CUDA is: a GPU copy into pageable memory blocks the host


def prompt(seed: int, n: int) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 30000, (n,), generator=g).tolist()
