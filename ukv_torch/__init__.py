"""ukv_torch: the DeepSeek-V4 unified KV pool as PyTorch custom ops and classes.

`_C` is loaded before any Python registration (fake kernels, fake classes),
because those refer to the schemas it defines.
"""
from ._loader import load_extension

_build_info = load_extension()
BACKEND = _build_info.BACKEND

from . import _fake_classes  # noqa: E402,F401  (after _C)
from .manager import KvEventKind, KvManager  # noqa: E402
from .planning import MODEL_PRESETS, KvPlan, plan_kv_layout  # noqa: E402
from .allocator import (  # noqa: E402
    OutOfSlots,
    UnifiedKvCoordinator,
    UnifiedTypePool,
    slot_counts,
    unified_slot_counts,
)

__version__ = "0.1.0"
__all__ = [
    "BACKEND",
    "KvEventKind",
    "KvPlan",
    "MODEL_PRESETS",
    "KvManager",
    "OutOfSlots",
    "UnifiedKvCoordinator",
    "UnifiedTypePool",
    "slot_counts",
    "unified_slot_counts",
    "plan_kv_layout",
    "__version__",
]
