"""Planning the KV layout from a byte budget (`plan_kv_layout`).

The arithmetic lives in C++ (csrc/core/kv_plan.cpp) and uses the same sizing
functions as the allocator, so a plan's rows are exactly what the pools hand
out. Three modes under one budget:

- "static":   the upstream static split (flag off);
- "upstream": the unified pool with upstream sizing: logical blocks = what
  the own compress region holds, so flag-on capacity equals flag-off;
- "elastic":  the unified pool whose logical block space covers every compress
  block the tensors can physically hold, so SWA slots left idle serve
  compress (its manager lets compress borrow SWA slots SWA never used:
  `borrow_unreleased_swa`). Per-logical-block side pools (the CSA indexer)
  are charged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["KvPlan", "plan_kv_layout", "MODEL_PRESETS"]

# Layer mixes (compress ratio per layer, MTP/draft layers last).
MODEL_PRESETS: Dict[str, List[int]] = {
    # V4-Flash-DSpark as listed in the upstream tests: 5 dense, 21 CSA, 20 HCA (46 with the draft layer).
    "v4-flash": [0, 0] + [4, 128] * 20 + [4] + [0, 0, 0],
    # V4-Pro per the model docstrings: 30 CSA + 31 HCA + 1 dense (the MTP layer), 62 layers.
    "v4-pro": [4, 128] * 30 + [128] + [0],
}

V4_INDEXER_BYTES_PER_BLOCK = 32 * 144  # 32 entries x (128 fp8 + 4-byte scale, padded to 144)


@dataclass(frozen=True)
class KvPlan:
    mode: str
    num_swa_blocks: int
    num_logical_blocks: int
    compress_ks: Tuple[int, ...]
    type_slots: Tuple[int, ...]
    layer_rows: Tuple[int, ...]
    kv_bytes: int
    rope_bytes: int
    indexer_bytes: int
    total_bytes: int
    swa_block_bytes: int
    compressed_block_bytes: int

    @property
    def unified(self) -> bool:
        return self.mode != "static"

    def manager_kwargs(self) -> Dict[str, object]:
        """The KvManager arguments that realise this plan."""
        return {
            "num_logical_blocks": self.num_logical_blocks,
            "num_swa_blocks": self.num_swa_blocks,
            "compress_ks": list(self.compress_ks),
            "type_slots": list(self.type_slots) if self.unified else None,
            "unified": self.unified,
            # Only elastic sizing has more logical blocks than the own regions
            # hold; upstream sizing never borrows, so the option would be idle.
            "borrow_unreleased_swa": self.mode == "elastic",
        }


def plan_kv_layout(budget_bytes: int, compress_ratios: Sequence[int], *, head_dim: int = 512,
                   kv_elem_bytes: int = 1, rope_head_dim: int = 64, rope_elem_bytes: int = 2,
                   indexer_bytes_per_block: int = V4_INDEXER_BYTES_PER_BLOCK, block_size: int = 128,
                   window: int = 128, mtp_k: int = 0, max_num_seqs: int = 256,
                   max_num_batched_tokens: Optional[int] = None, full_retain: bool = False,
                   swa_budget_frac: float = 0.2, mode: str = "elastic") -> KvPlan:
    """Lay out the KV memory of a model with these layers (4 CSA, 128 HCA, 0 dense) in budget_bytes.

    Defaults are DeepSeek-V4 in fp8 mode: 512-wide latent fp8 rows plus a
    64-wide bf16 rope plane, the lightning indexer charged per CSA layer.
    The SWA pool holds every running sequence's window plus the blocks one
    step's prefill chunks span: max_num_seqs x (ceil((window+mtp_k)/bs)+1) +
    ceil(max_num_batched_tokens/bs) blocks. Left at None, the chunk term is
    upstream's fixed 64 blocks (8192 tokens at block 128), so the plan
    is upstream's; an engine with a smaller token budget should pass it,
    or every layer tensor carries SWA rows no step can fill. With full_retain
    the SWA pool is swa_budget_frac of the budget instead.
    """
    summary, ks, slots, rows = torch.ops.ukv.plan_kv_layout(
        budget_bytes, list(compress_ratios), head_dim, kv_elem_bytes, rope_head_dim, rope_elem_bytes,
        indexer_bytes_per_block, block_size, window, mtp_k, max_num_seqs, max_num_batched_tokens, full_retain,
        swa_budget_frac, mode)
    (num_swa, num_logical, kv_bytes, rope_bytes, indexer_bytes, total, swa_block, compressed_block) = summary
    return KvPlan(mode, num_swa, num_logical, tuple(ks), tuple(slots), tuple(rows), kv_bytes, rope_bytes,
                  indexer_bytes, total, swa_block, compressed_block)
