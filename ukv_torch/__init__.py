"""ukv_torch: the DeepSeek-V4 unified KV pool as PyTorch custom ops and classes.

`_C` is loaded before any Python registration (fake kernels, fake classes),
because those refer to the schemas it defines.
"""
from ._extension.loader import load_extension

_build_info = load_extension()
BACKEND = _build_info.BACKEND

from ._extension import fake_classes  # noqa: E402,F401  (after _C)
from ._extension import fake_ops  # noqa: E402,F401  (registers fake kernels; needs _C's schemas)
from .allocator.drop_ins import (  # noqa: E402
    OutOfSlots,
    UnifiedKvCoordinator,
    UnifiedTypePool,
    slot_counts,
    unified_slot_counts,
)
from .allocator.batch_calls import BatchCalls  # noqa: E402
from .manager.kv_events import KvEvent, KvEventKind, KvRole  # noqa: E402
from .manager.kv_manager import KvManager, staged_tables_shape, table_index  # noqa: E402
from .ops import (  # noqa: E402
    apply_row_copies,
    bind_compress_view,
    csa_translate_pack,
    decode_index_metadata,
    gather_rows,
    hca_decode_indices,
    paged_decode_indices,
    paged_prefill_indices,
    prefill_index_metadata,
    scatter_rows,
    swa_slot_mapping,
)
from .manager.prefix_hashing import block_hashes, cache_salt, key_tensor, swa_page_hashes  # noqa: E402
from .plan.planning import MODEL_PRESETS, plan_kv_layout  # noqa: E402
from .plan.records import KvPlan, ModelKvSpec, PoolSizes, ServeConfig  # noqa: E402
from .transfer import SequenceExport, gather_sequence, scatter_sequence, transfer_bytes  # noqa: E402
from .step_ops import KvStepOps  # noqa: E402
from .plan.unified_kv import UnifiedKv, allocate_unified_kv  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "BACKEND",
    "BatchCalls",
    "KvEvent",
    "KvEventKind",
    "KvManager",
    "KvPlan",
    "KvRole",
    "KvStepOps",
    "MODEL_PRESETS",
    "ModelKvSpec",
    "OutOfSlots",
    "PoolSizes",
    "SequenceExport",
    "ServeConfig",
    "UnifiedKv",
    "UnifiedKvCoordinator",
    "UnifiedTypePool",
    "allocate_unified_kv",
    "apply_row_copies",
    "bind_compress_view",
    "block_hashes",
    "cache_salt",
    "csa_translate_pack",
    "decode_index_metadata",
    "gather_rows",
    "gather_sequence",
    "hca_decode_indices",
    "key_tensor",
    "paged_decode_indices",
    "paged_prefill_indices",
    "plan_kv_layout",
    "prefill_index_metadata",
    "scatter_rows",
    "scatter_sequence",
    "slot_counts",
    "staged_tables_shape",
    "swa_page_hashes",
    "swa_slot_mapping",
    "table_index",
    "transfer_bytes",
    "unified_slot_counts",
    "__version__",
]
