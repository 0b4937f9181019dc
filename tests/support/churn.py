"""A fixed pseudo-random churn of allocations and frees on any allocator front end
(torch TypePool / Coordinator, the drop-in UnifiedTypePool / UnifiedKvCoordinator),
for the determinism and copy tests; importable by a subprocess too."""
import random

from ukv_torch import UnifiedKvCoordinator, UnifiedTypePool


def churn(obj, seed, steps):
    """A fixed pseudo-random sequence of allocations and frees on any of the
    four front ends; returns what every call returned (or that it refused)."""
    rng = random.Random(seed)
    held, log = [], []
    for _ in range(steps):
        if held and rng.random() < 0.45:
            free, ident = held.pop(rng.randrange(len(held)))
            free(ident)
            continue
        alloc, free = rng.choice(roles(obj))
        try:
            ident = alloc()
        except RuntimeError as exc:
            log.append(str(exc))
            continue
        held.append((free, ident))
        log.append(ident)
    return log


def roles(obj):
    """(allocate, free) pairs of each role a front end offers."""
    if isinstance(obj, UnifiedKvCoordinator):
        return [(obj.alloc_swa, obj.free_swa), (obj.alloc_csa, obj.free_csa), (obj.alloc_hca, obj.free_hca)]
    if isinstance(obj, UnifiedTypePool):
        return [(obj.alloc_swa, obj.free_swa), (obj.alloc_compress, obj.free_compress)]
    if hasattr(obj, "num_types"):  # torch Coordinator
        return [(obj.alloc_swa, obj.free_swa)] + [
            (lambda t=t: obj.alloc_compress(t), lambda p, t=t: obj.free_compress(t, p)) for t in range(obj.num_types())]
    return [(obj.alloc_swa, obj.free_swa), (obj.alloc_compress, obj.free_compress)]
