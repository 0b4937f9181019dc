"""Load the compiled extension, refusing clearly when it does not match torch.

A torch extension is tied to the exact torch it was compiled against (C++ ABI,
dispatcher symbols). Loading a stale build gives an `undefined symbol` error at
best and memory corruption at worst, so we compare versions first.
"""
import torch

_REBUILD = "rebuild it with `make build` (pip install --no-build-isolation -e .)"


def load_extension():
    try:
        from .. import _build_info
    except ImportError as exc:
        raise ImportError(f"ukv_torch._C has not been built; {_REBUILD}") from exc
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"ukv_torch._C was built against torch {_build_info.TORCH_VERSION} "
            f"but torch {torch.__version__} is installed; {_REBUILD}"
        )
    try:
        from .. import _C  # noqa: F401  (runs the TORCH_LIBRARY registrars)
    except ImportError as exc:
        raise ImportError(f"ukv_torch._C failed to load ({exc}); {_REBUILD}") from exc
    return _build_info
