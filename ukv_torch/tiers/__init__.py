"""KV tiers beyond HBM: the backend interface (backend.py), one module per
backend (host.py), and what sits above them: object format (objects.py), keys
(keys.py), staging memory (staging.py) and the engine's side (cache.py)."""
from .backend import TierBackend
from .cache import TierCache
from .host import HostTier
from .objects import ObjectLayout

__all__ = ["TierBackend", "TierCache", "HostTier", "ObjectLayout"]
