"""Allocation of the KV tensors of a plan: per-layer unified_kv tensors, or
the planes of the row-space layout with per-layer views into them.

Row counts come only from the C++ plan and sizing ops, the same functions that
size the allocator's pools, so the tensors always have exactly the rows the
allocator hands out.
"""
from typing import List, Mapping, NamedTuple, Optional, Sequence, Union

import torch

from .records import KvPlan, ServeConfig

__all__ = ["UnifiedKv", "allocate_unified_kv", "check_plan_tensors"]

_ELEMENT = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}


class UnifiedKv(NamedTuple):
    """KV tensors of a plan.

    ``kv[L]`` is layer L's ``[rows_L, head_dim]`` tensor and ``rope[L]`` its
    ``[rows_L, rope_head_dim]`` rope plane with the same row addressing (None
    without a rope plane: bf16 mode keeps rope inline). ``indexer[L]`` is a
    CSA layer's ``[blocks, k, entry_bytes]`` uint8 indexer cache, addressed by
    the same block ids as its compress rows (None for other layers, and from
    the keyword form). ``planes`` are the row-space layout's planes (NoPE,
    then RoPE), of which every per-layer tensor is a view starting at the
    layer's base row; empty in the slot layouts. Row indices the index ops
    produce are relative to a layer's tensor: an attention kernel must compute
    byte offsets from them in 64 bits (rows times row bytes pass 2^31 bytes).
    ``plan`` is the plan they were allocated for (None from the keyword form):
    two plans of one model may give tensors of the same shapes.
    """

    kv: List[torch.Tensor]
    rope: List[Optional[torch.Tensor]]
    indexer: Sequence[Optional[torch.Tensor]] = ()
    planes: Sequence[torch.Tensor] = ()
    plan: Optional[KvPlan] = None


def _dtype_of(name: str, dtype: Optional[torch.dtype], elem_bytes: int) -> torch.dtype:
    if dtype is None:
        if elem_bytes not in _ELEMENT:
            raise ValueError(f"allocate_unified_kv: no default {name} for {elem_bytes}-byte elements; pass {name}")
        return _ELEMENT[elem_bytes]
    if torch.empty((), dtype=dtype).element_size() != elem_bytes:
        raise ValueError(f"allocate_unified_kv: {name} {dtype} has {torch.empty((), dtype=dtype).element_size()}-byte "
                         f"elements, the plan's model has {elem_bytes}")
    return dtype


def _indexer_view(plane: torch.Tensor, first_byte: int, block_bytes: int, blocks: int, k: int,
                  entry_bytes: int) -> torch.Tensor:
    """[blocks, k, entry_bytes] uint8 over a plane's bytes: block p at first_byte + p * block_bytes."""
    flat = plane.view(torch.uint8).view(-1)
    return flat.as_strided((blocks, k, entry_bytes), (block_bytes, entry_bytes, 1), flat.storage_offset() + first_byte)


def _allocate_plan(plan: KvPlan, dtype, rope_dtype, device) -> UnifiedKv:
    model, config = plan.model, plan.config
    dtype = _dtype_of("dtype", dtype, model.kv_elem_bytes)
    rope_dtype = _dtype_of("rope_dtype", rope_dtype, model.rope_elem_bytes) if model.rope_head_dim else None
    csa_ratio = 4
    k_csa = config.block_size // csa_ratio if csa_ratio in config.compress_ratios else 0
    entry = model.indexer_bytes_per_block // k_csa if k_csa and model.indexer_bytes_per_block else 0
    if entry and entry * k_csa != model.indexer_bytes_per_block:
        raise ValueError(f"allocate_unified_kv: indexer_bytes_per_block {model.indexer_bytes_per_block} is not "
                         f"{k_csa} whole entries")
    if config.layout == "row_space":
        rows = plan.pools.total_rows
        nope = torch.zeros(rows, model.head_dim, dtype=dtype, device=device)
        rope = torch.zeros(rows, model.rope_head_dim, dtype=rope_dtype, device=device) if rope_dtype else None
        planes = [nope] + ([rope] if rope is not None else [])
        envelope, blocks = plan.pools.envelope_rows, plan.pools.num_logical_blocks
        kv, ropes, indexer = [], [], []
        for layer, base in enumerate(plan.layer_base_rows):
            kv.append(nope[base:])
            ropes.append(rope[base:] if rope is not None else None)
            which = plan.layer_indexer_planes[layer]
            if which < 0 or not entry:
                indexer.append(None)
                continue
            plane = planes[which]
            row_bytes = plane.shape[1] * plane.element_size()
            indexer.append(_indexer_view(plane, plan.layer_indexer_offsets[layer], envelope * row_bytes, blocks,
                                         k_csa, entry))
        return UnifiedKv(kv, ropes, indexer, planes, plan)
    kv = [torch.zeros(rows, model.head_dim, dtype=dtype, device=device) for rows in plan.layer_rows]
    ropes = [torch.zeros(rows, model.rope_head_dim, dtype=rope_dtype, device=device) if rope_dtype else None
             for rows in plan.layer_rows]
    csa_layers = [i for i, r in enumerate(model.layer_ratios) if r == csa_ratio]
    indexer: List[Optional[torch.Tensor]] = [None] * len(kv)
    if entry and csa_layers:  # upstream's separate pool, addressed by logical block ids
        pool = torch.zeros(len(csa_layers), plan.pools.num_logical_blocks, k_csa, entry, dtype=torch.uint8,
                           device=device)
        for j, layer in enumerate(csa_layers):
            indexer[layer] = pool[j]
    return UnifiedKv(kv, ropes, indexer, [], plan)


def allocate_unified_kv(
    plan_or_ratios: Union[KvPlan, Sequence[int]],
    num_swa_blocks: Optional[int] = None,
    head_dim: Optional[int] = None,
    *,
    num_compress_blocks: Optional[int] = None,
    type_slots: Optional[Mapping[int, int]] = None,
    dtype: Optional[torch.dtype] = None,
    device: Optional[torch.device] = None,
    block_size: Optional[int] = None,
    unified: bool = True,
    rope_head_dim: Optional[int] = None,
    rope_dtype: Optional[torch.dtype] = None,
) -> UnifiedKv:
    """Zero-filled KV tensors: ``allocate_unified_kv(plan)``, or the keyword form.

    With a :class:`KvPlan` everything comes from the plan: the layout, the
    rows, the model's widths; ``dtype`` and ``rope_dtype`` default to the
    model's element sizes (fp8 for 1 byte, bf16 for 2) and must match them
    when given. The row-space layout gets its planes and per-layer views.

    The keyword form (the slot layouts' per-layer tensors only):
    ``allocate_unified_kv(compress_ratios, num_swa_blocks, head_dim, ...)``
    with one ratio per layer (4 CSA, 128 HCA, 0 dense) and exactly one of

    - ``num_compress_blocks``: the number of logical compress blocks NB; rows
      are ``layer_rows(ratio, num_swa_blocks, NB, block_size, unified)``
      (unified: the type's slots x block_size; static split: SWA rows + k x NB);
    - ``type_slots``: slots per compress ratio (an elastic plan, unified layout
      only); rows are ``layer_rows_for_slots(ratio, type_slots[ratio], ...)``.

    ``rope_head_dim`` adds a ``[rows, rope_head_dim]`` plane of ``rope_dtype``
    (default bf16) per layer (fp8 mode); ``dtype`` defaults to bf16 and
    ``block_size`` to ServeConfig's.
    """
    if isinstance(plan_or_ratios, KvPlan):
        if num_swa_blocks is not None or head_dim is not None or num_compress_blocks is not None or \
                type_slots is not None or block_size is not None or rope_head_dim is not None:
            raise ValueError("allocate_unified_kv(plan) takes only dtype, rope_dtype and device: the plan has the rest")
        return _allocate_plan(plan_or_ratios, dtype, rope_dtype, device)
    if num_swa_blocks is None or head_dim is None:
        raise ValueError("allocate_unified_kv: give a KvPlan, or compress_ratios, num_swa_blocks and head_dim")
    return _allocate_by_keywords(plan_or_ratios, num_swa_blocks, head_dim, num_compress_blocks=num_compress_blocks,
                                 type_slots=type_slots, dtype=dtype or torch.bfloat16, device=device,
                                 block_size=block_size or ServeConfig().block_size, unified=unified,
                                 rope_head_dim=rope_head_dim, rope_dtype=rope_dtype or torch.bfloat16)


def _allocate_by_keywords(
    compress_ratios: Sequence[int],
    num_swa_blocks: int,
    head_dim: int,
    *,
    num_compress_blocks: Optional[int] = None,
    type_slots: Optional[Mapping[int, int]] = None,
    dtype: torch.dtype,
    device: Optional[torch.device],
    block_size: int,
    unified: bool,
    rope_head_dim: Optional[int],
    rope_dtype: torch.dtype,
) -> UnifiedKv:
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
    return UnifiedKv(kv, rope, [None] * len(kv), [])


def check_plan_tensors(plan: KvPlan, kv: UnifiedKv) -> None:
    """Refuse KV tensors that are not the ones ``allocate_unified_kv(plan)`` lays out:
    allocated for another plan, of another model (widths, element sizes) or
    another plan of the same model (row counts), or, in the row space,
    per-layer tensors that are not views of
    ``kv.planes`` at the plan's base rows. A ValueError (TypeError for a wrong
    type) names the tensor and the expectation; nothing is read or written."""
    if not isinstance(kv, UnifiedKv):
        raise TypeError(f"kv must be the UnifiedKv of allocate_unified_kv(plan), got {type(kv).__name__}")
    model, layers = plan.model, len(plan.model.layer_ratios)
    if len(kv.kv) != layers or len(kv.rope) != layers:
        raise ValueError(f"kv has {len(kv.kv)} layers ({len(kv.rope)} rope entries), the plan's model {layers}")
    row_space = plan.config.layout == "row_space"
    if row_space:
        _check_planes(plan, kv)
    for layer in range(layers):
        rows = plan.pools.total_rows - plan.layer_base_rows[layer] if row_space else plan.layer_rows[layer]
        _check_tensor(f"kv.kv[{layer}]", kv.kv[layer], rows, model.head_dim, model.kv_elem_bytes)
        if model.rope_head_dim:
            _check_tensor(f"kv.rope[{layer}]", kv.rope[layer], rows, model.rope_head_dim, model.rope_elem_bytes)
        elif kv.rope[layer] is not None:
            raise ValueError(f"kv.rope[{layer}] must be None: the plan's model keeps no rope plane")
        indexer = kv.indexer[layer] if layer < len(kv.indexer) else None
        if indexer is not None and (indexer.dim() != 3 or indexer.shape[0] != plan.pools.num_logical_blocks
                                    or indexer[0].numel() * indexer.element_size() != model.indexer_bytes_per_block):
            raise ValueError(f"kv.indexer[{layer}] must be the plan's [{plan.pools.num_logical_blocks}, k, entry] "
                             f"indexer cache of {model.indexer_bytes_per_block} bytes per block, got "
                             f"{tuple(indexer.shape)} {indexer.dtype}")
        if row_space:
            for name, plane, view in (("kv", 0, kv.kv[layer]), ("rope", 1, kv.rope[layer])):
                if view is not None and view.data_ptr() != _row_ptr(kv.planes[plane], plan.layer_base_rows[layer]):
                    raise ValueError(f"kv.{name}[{layer}] must be a view of kv.planes[{plane}] starting at the "
                                     f"layer's base row {plan.layer_base_rows[layer]}")
    if kv.plan is not None and kv.plan != plan:  # of the same shapes, but another plan's geometry
        raise ValueError("kv was allocated for another plan (kv.plan): KV tensors of another model or plan")


def _check_planes(plan: KvPlan, kv: UnifiedKv) -> None:
    model = plan.model
    widths = [(model.head_dim, model.kv_elem_bytes)] + ([(model.rope_head_dim, model.rope_elem_bytes)]
                                                         if model.rope_head_dim else [])
    if len(kv.planes) != len(widths):
        raise ValueError(f"kv.planes must hold {len(widths)} planes in the row-space layout, got {len(kv.planes)}")
    for i, (width, elem_bytes) in enumerate(widths):
        _check_tensor(f"kv.planes[{i}]", kv.planes[i], plan.pools.total_rows, width, elem_bytes)


def _check_tensor(name: str, t: Optional[torch.Tensor], rows: int, width: int, elem_bytes: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a [{rows}, {width}] tensor of {elem_bytes}-byte elements, got "
                         f"{type(t).__name__}")
    if tuple(t.shape) != (rows, width) or t.element_size() != elem_bytes:
        raise ValueError(f"{name} must be the plan's [{rows}, {width}] tensor of {elem_bytes}-byte elements, got "
                         f"{tuple(t.shape)} {t.dtype}: KV tensors of another model or plan")


def _row_ptr(plane: torch.Tensor, row: int) -> int:
    return plane.data_ptr() + row * plane.stride(0) * plane.element_size()
