"""Planning the KV layout from a byte budget (`plan_kv_layout`).

The arithmetic lives in C++ (csrc/core/config/kv_plan.cpp) and uses the same sizing
functions as the allocator, so a plan's rows are exactly what the pools hand
out. The layouts of ``ServeConfig.layout`` under one budget:

- "static":   the upstream static split (flag off);
- "upstream": the unified pool with upstream sizing: logical blocks = what
  the own compress region holds, so flag-on capacity equals flag-off;
- "elastic":  the unified pool whose logical block space covers every compress
  block the tensors can physically hold, so SWA slots left idle serve
  compress (the manager lets compress borrow SWA slots SWA never used).
  Per-logical-block side pools (the CSA indexer) are charged.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import torch

from .records import KvPlan, ModelKvSpec, ServeConfig

__all__ = ["KvPlan", "plan_kv_layout", "MODEL_PRESETS"]

# Layer mixes (compress ratio per layer, MTP/draft layers last).
MODEL_PRESETS: Dict[str, List[int]] = {
    # V4-Flash-DSpark as listed in the upstream tests: 5 dense, 21 CSA, 20 HCA (46 with the draft layer).
    "v4-flash": [0, 0] + [4, 128] * 20 + [4] + [0, 0, 0],
    # V4-Pro per the model docstrings: 30 CSA + 31 HCA + 1 dense (the MTP layer), 62 layers.
    "v4-pro": [4, 128] * 30 + [128] + [0],
}


_LEGACY_SERVE = ("block_size", "window", "mtp_k", "max_num_seqs", "full_retain", "swa_budget_frac")


def plan_kv_layout(budget_bytes: int, model: Union[ModelKvSpec, Sequence[int]], config: Optional[ServeConfig] = None,
                   **options) -> KvPlan:
    """Lay out the KV memory of a model in budget_bytes.

    ``model`` is a :class:`ModelKvSpec`, or the compress ratio of every layer
    (4 CSA, 128 HCA, 0 dense) with ModelKvSpec's other fields as keywords
    (``head_dim``, ``kv_elem_bytes``, ``rope_head_dim``, ``rope_elem_bytes``,
    ``indexer_bytes_per_block``); their defaults are DeepSeek-V4 in fp8 mode:
    512-wide latent fp8 rows plus a 64-wide bf16 rope plane, the lightning
    indexer charged per CSA layer. ``config`` is the engine's
    :class:`ServeConfig`; its layout decides the plan and the plan carries it
    (``KvManager(plan)`` needs nothing else).

    In the slot layouts the SWA pool holds every running sequence's window plus
    the blocks one step's prefill chunks span: max_num_seqs x
    (ceil((window + mtp_k) / block_size) + 1) blocks plus a chunk term, which
    is upstream's fixed 64 blocks with ``swa_sizing="upstream"`` and
    ceil(max_num_batched_tokens / block_size) with ``swa_sizing="step"`` (an
    engine with a smaller token budget than 8192 should use it, or every layer
    tensor carries SWA rows no step can fill). With full_retain the SWA pool is
    swa_budget_frac of the budget instead.

    With ``layout="row_space"`` the budget becomes one row space of
    budget_bytes // row_bytes rows (NoPE plus RoPE bytes of a row; at most
    2^31 - 1, as row indices are int32), cut into envelopes of E rows (one
    logical block of every compress layer, then the CSA indexer blocks in the
    fewest rows that hold them) and SWA units of swa_page_tokens x every
    layer's rows; the plan gives each layer's base row and each class's SWA
    row constants (``plan.swa_rows(ratio)``, ``plan.compress_args(ratio)``).
    A budget below one sequence's envelope and decode window is a ValueError.

    Without ``config``, the keyword form of earlier versions is accepted:
    ``mode`` (the layout), ``block_size``, ``window``, ``mtp_k``,
    ``max_num_seqs``, ``full_retain``, ``swa_budget_frac`` and
    ``max_num_batched_tokens`` (None: upstream's chunk term; a number: the step's),
    with the compress types taken from the layers.
    """
    model_options = {f.name: options.pop(f.name) for f in ModelKvSpec._fields if f.name in options}
    if not isinstance(model, ModelKvSpec):
        model = ModelKvSpec(layer_ratios=tuple(model), **model_options)
    elif model_options:
        raise TypeError(f"plan_kv_layout: model is a ModelKvSpec; {', '.join(sorted(model_options))} belong in it")
    if config is None:
        config = _legacy_config(model.layer_ratios, options)
    elif options:
        raise TypeError(f"plan_kv_layout: give either config or the keyword options, not both "
                        f"(got {', '.join(sorted(options))})")
    return KvPlan.decode(torch.ops.ukv.plan_kv_layout(budget_bytes, model.encode(), config.encode()))


def _legacy_config(layer_ratios: Sequence[int], options: dict) -> ServeConfig:
    unknown = set(options) - set(_LEGACY_SERVE) - {"mode", "max_num_batched_tokens"}
    if unknown:
        raise TypeError(f"plan_kv_layout: unknown option(s) {', '.join(sorted(unknown))}")
    kwargs = {name: options[name] for name in _LEGACY_SERVE if name in options}
    kwargs["layout"] = options.get("mode", "elastic")
    kwargs["compress_ratios"] = tuple(sorted({int(r) for r in layer_ratios if r}))
    tokens = options.get("max_num_batched_tokens")
    kwargs["swa_sizing"] = "upstream" if tokens is None else "step"
    if tokens is not None:
        kwargs["max_num_batched_tokens"] = tokens
    return ServeConfig(**kwargs)
