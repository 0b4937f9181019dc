"""Allocation of the per-layer unified_kv tensors (SPEC.md §2.1).

Row counts come only from the C++ sizing ops (``torch.ops.ukv.layer_rows`` /
``layer_rows_for_slots``), the same functions that size the allocator's slot
pools, so the tensors always have exactly the rows the allocator hands out.
"""
from typing import List, Mapping, NamedTuple, Optional, Sequence

import torch

__all__ = ["UnifiedKv", "allocate_unified_kv"]


class UnifiedKv(NamedTuple):
    """Per-layer tensors: ``kv[L]`` is ``[rows_L, head_dim]``; ``rope[L]`` is the
    ``[rows_L, rope_head_dim]`` plane with the same row addressing, or None when
    no rope plane was asked for (bf16 mode keeps rope inline)."""

    kv: List[torch.Tensor]
    rope: List[Optional[torch.Tensor]]


def allocate_unified_kv(
    compress_ratios: Sequence[int],
    num_swa_blocks: int,
    head_dim: int,
    *,
    num_compress_blocks: Optional[int] = None,
    type_slots: Optional[Mapping[int, int]] = None,
    dtype: torch.dtype = torch.bfloat16,
    device: Optional[torch.device] = None,
    block_size: int = 128,
    unified: bool = True,
    rope_head_dim: Optional[int] = None,
    rope_dtype: torch.dtype = torch.bfloat16,
) -> UnifiedKv:
    """Zero-filled unified_kv tensors (and optional rope planes), one per layer.

    ``compress_ratios`` has one entry per layer: 4 (CSA), 128 (HCA) or 0
    (dense, SWA rows only). Give exactly one of

    - ``num_compress_blocks``: the number of logical compress blocks NB; rows
      are ``layer_rows(ratio, num_swa_blocks, NB, block_size, unified)``
      (unified: the type's slots x block_size; static split: SWA rows + k x NB);
    - ``type_slots``: slots per compress ratio (an elastic plan, unified layout
      only); rows are ``layer_rows_for_slots(ratio, type_slots[ratio], ...)``.

    ``rope_head_dim`` adds a ``[rows, rope_head_dim]`` plane of ``rope_dtype``
    per layer (fp8 mode).
    """
    if (num_compress_blocks is None) == (type_slots is None):
        raise ValueError("allocate_unified_kv: give exactly one of num_compress_blocks and type_slots")
    if type_slots is not None and not unified:
        raise ValueError("allocate_unified_kv: type_slots describes the unified layout; pass unified=True")
    if head_dim <= 0:
        raise ValueError(f"allocate_unified_kv: head_dim must be > 0, got {head_dim}")
    if rope_head_dim is not None and rope_head_dim <= 0:
        raise ValueError(f"allocate_unified_kv: rope_head_dim must be > 0, got {rope_head_dim}")

    def rows_of(ratio: int) -> int:
        if type_slots is None:
            return torch.ops.ukv.layer_rows(ratio, num_swa_blocks, num_compress_blocks, block_size, unified)
        # A dense layer holds only the shared SWA slots, whatever the plan says.
        slots = num_swa_blocks if ratio == 0 else type_slots.get(ratio)
        if slots is None:
            raise ValueError(f"allocate_unified_kv: type_slots has no entry for compress ratio {ratio}")
        return torch.ops.ukv.layer_rows_for_slots(ratio, slots, num_swa_blocks, block_size)

    kv, rope = [], []
    for ratio in compress_ratios:
        rows = rows_of(ratio)
        kv.append(torch.zeros(rows, head_dim, dtype=dtype, device=device))
        rope.append(None if rope_head_dim is None
                    else torch.zeros(rows, rope_head_dim, dtype=rope_dtype, device=device))
    return UnifiedKv(kv, rope)
