"""The model side of the demo: real unified_kv tensors holding content tags.

Every layer tensor comes from allocate_unified_kv (sized by the same C++
functions as the manager's pools) with one int64 column. The "model" writes,
like the V4 kernels do:
- SWA: the tag of each written position into row swa_table[b, p // bs] * bs +
  p % bs of every layer;
- compressed entries: the tag of the entry's last position into
  view[phys_table[b, ci // k], ci % k] of each CSA / HCA layer, through the
  view bind_compress_view gives the compressor.
Tags are salted per role and layer, so reading a row of the wrong role or
layer never matches.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from .. import allocate_unified_kv, bind_compress_view
from ..planning import KvPlan
from .content_tags import CSA_SALT, HCA_SALT, SWA_SALT, layer_salt

ROLE_SALT = {0: SWA_SALT, 4: CSA_SALT, 128: HCA_SALT}


class TaggedKv:
    def __init__(self, ratios: Sequence[int], plan: KvPlan, device: torch.device):
        self.ratios = list(ratios)
        self.block_size = block_size = plan.config.block_size
        self.unified = plan.unified
        self.compress_base = torch.ops.ukv.compress_base_row(plan.unified, plan.num_swa_blocks, block_size)
        if plan.unified:
            slots = dict(zip(plan.config.compress_ratios, plan.type_slots))
            kv = allocate_unified_kv(ratios, plan.num_swa_blocks, 1, type_slots=slots, dtype=torch.int64,
                                     device=device, block_size=block_size)
        else:
            kv = allocate_unified_kv(ratios, plan.num_swa_blocks, 1, num_compress_blocks=plan.num_logical_blocks,
                                     dtype=torch.int64, device=device, block_size=block_size, unified=False)
        self.kv: List[torch.Tensor] = kv.kv
        self.views = [None if r == 0 else bind_compress_view(t, compress_base=self.compress_base, compress_ratio=r,
                                                             block_size=block_size)
                      for r, t in zip(self.ratios, self.kv)]
        # -1 marks never-written rows (tags are non-negative).
        for t in self.kv:
            t.fill_(-1)
        self.salts = [layer_salt(i) for i in range(len(ratios))]
        self.total_rows = sum(t.shape[0] for t in self.kv)

    def write_swa(self, rows: torch.Tensor, tags: torch.Tensor) -> None:
        for layer, t in enumerate(self.kv):
            t[rows, 0] = tags ^ (self.salts[layer] ^ SWA_SALT)

    def write_compress(self, ratio: int, phys: torch.Tensor, slot: torch.Tensor, tags: torch.Tensor) -> None:
        for layer, r in enumerate(self.ratios):
            if r == ratio:
                self.views[layer][phys, slot, 0] = tags ^ (self.salts[layer] ^ ROLE_SALT[r])
