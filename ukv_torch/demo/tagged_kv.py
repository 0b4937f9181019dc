"""The model side of the demo: real KV tensors holding content tags.

The tensors have the plan's rows and one int64 column: per-layer unified_kv
tensors from allocate_unified_kv (sized by the same C++ functions as the
manager's pools) in the slot layouts, or in the row-space layout one tag
plane with every layer's tensor a view of it from the layer's base row. The
"model" writes, like the V4 kernels do:
- SWA: the tag of each written position into the row swa_slot_mapping gives
  for the layer's class (the slot layouts: swa_table[b, p // bs] * bs +
  p % bs), in every layer of the class;
- compressed entries: the tag of the entry's last position into
  view[phys_table[b, ci // k], ci % k] of each CSA / HCA layer, through the
  view bind_compress_view gives the compressor.
Tags are salted per role and layer, so reading a row of the wrong role or
layer never matches. Unit moves of the row space are applied to the planes
with apply_row_copies, as an engine applies them to its KV.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from .. import apply_row_copies, bind_compress_view
from ..plan.planning import KvPlan
from .content_tags import CSA_SALT, HCA_SALT, SWA_SALT, layer_salt

ROLE_SALT = {0: SWA_SALT, 4: CSA_SALT, 128: HCA_SALT}


class TaggedKv:
    def __init__(self, ratios: Sequence[int], plan: KvPlan, device: torch.device):
        self.ratios = list(ratios)
        self.block_size = block_size = plan.config.block_size
        # Each class's SWA rows and compress addressing, for the index ops.
        self.swa_rows = {r: list(plan.swa_rows(r)) for r in set(ratios)}
        self.compress_args = {r: plan.compress_args(r) for r in set(ratios) if r}
        if plan.config.layout == "row_space":
            plane = torch.full((plan.pools.total_rows, 1), -1, dtype=torch.int64, device=device)
            self.planes: List[torch.Tensor] = [plane]
            self.kv: List[torch.Tensor] = [plane[base:] for base in plan.layer_base_rows]
        else:
            self.planes = []
            self.kv = [torch.full((rows, 1), -1, dtype=torch.int64, device=device) for rows in plan.layer_rows]
        # -1 marks never-written rows (tags are non-negative).
        self.views = [None if r == 0 else bind_compress_view(t, compress_ratio=r, block_size=block_size,
                                                             **self.compress_args[r])
                      for r, t in zip(self.ratios, self.kv)]
        self.salts = [layer_salt(i) for i in range(len(ratios))]

    def swa_rows_of(self, ratio: int) -> List[int]:
        """A class's SWA rows; a class the model lacks (an output no layer reads) takes another's."""
        return self.swa_rows.get(ratio, next(iter(self.swa_rows.values())))

    def apply_copies(self, copies: torch.Tensor, counts: torch.Tensor) -> None:
        if self.planes:
            apply_row_copies(self.planes, copies, counts)

    def write_swa(self, ratio: int, rows: torch.Tensor, tags: torch.Tensor) -> None:
        """Tags at these rows of every layer of one class (its own rows in the row space)."""
        for layer, t in enumerate(self.kv):
            if self.ratios[layer] == ratio:
                t[rows, 0] = tags ^ (self.salts[layer] ^ SWA_SALT)

    def write_compress(self, ratio: int, phys: torch.Tensor, slot: torch.Tensor, tags: torch.Tensor) -> None:
        for layer, r in enumerate(self.ratios):
            if r == ratio:
                self.views[layer][phys, slot, 0] = tags ^ (self.salts[layer] ^ ROLE_SALT[r])
