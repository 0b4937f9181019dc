"""Fake (tracing) classes for the torch classes, so modules that hold a
TypePool, Coordinator or KvManager can be traced by torch.compile / export.

Host-side allocation never runs inside a traced graph; the fakes carry the
flattened state (`__obj_flatten__`) and nothing else.
"""
import torch


def _register(qualname: str) -> None:
    @torch._library.register_fake_class(qualname)
    class _Fake:
        def __init__(self, state: torch.Tensor, device: str = ""):
            self.state = state
            self.device = device

        @classmethod
        def __obj_unflatten__(cls, flat):
            return cls(**dict(flat))

    _Fake.__name__ = "Fake" + qualname.split("::")[-1]


for _name in ("ukv::TypePool", "ukv::Coordinator", "ukv::KvManager"):
    _register(_name)
