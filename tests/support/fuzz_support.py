"""Shared pieces of the hypothesis fuzz tests: one deterministic settings
profile (CI runs the same cases every time), outputs allocated as views inside
larger guard-filled buffers, and the layouts a tensor argument can arrive in."""
import torch
from hypothesis import HealthCheck, settings

GUARD = 8                  # guard cells on each side of every output
GUARD_VALUE = -1515870811  # 0xA5A5A5A5 as int32: no op writes it by accident


def fuzz_settings(max_examples):
    """Fixed example count, no deadline (the host is shared), derandomized and
    without the example database, so a run is the same on every machine."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class GuardedOutputs:
    """An allocator of outputs: each is the middle of a buffer GUARD cells
    longer at both ends, so a write outside an output shows in its guards."""

    def __init__(self, device):
        self.device = device
        self.buffers = []

    def __call__(self, n, fill, dtype=torch.int32):
        base = torch.full((n + 2 * GUARD,), GUARD_VALUE, dtype=dtype, device=self.device)
        base[GUARD:GUARD + n] = fill
        self.buffers.append((base, n))
        return base[GUARD:GUARD + n]

    def assert_untouched(self):
        for base, n in self.buffers:
            cells = base.tolist()
            assert cells[:GUARD] == [GUARD_VALUE] * GUARD, "a write before the start of an output"
            assert cells[GUARD + n:] == [GUARD_VALUE] * GUARD, "a write past the end of an output"


# Layouts of a 1-D integer argument: (name, accepted by an int64 id argument).
# "strided" is every other element of a longer tensor: any strides are accepted.
ID_LAYOUTS = ["contiguous", "strided", "int32", "float64", "bool", "2d", "0d", "meta", "none"]
ACCEPTED_ID_LAYOUTS = {"contiguous", "strided"}
# Token arguments also take int32.
ACCEPTED_TOKEN_LAYOUTS = ACCEPTED_ID_LAYOUTS | {"int32"}


def in_layout(values, layout, dtype=torch.int64):
    """values (a list of ints) as a tensor argument in `layout` (None for "none")."""
    t = torch.tensor(values, dtype=dtype)
    if layout == "contiguous":
        return t
    if layout == "strided":
        return torch.stack([t, torch.full_like(t, -7)], dim=1).flatten()[::2]
    if layout in ("int32", "float64", "bool"):
        return t.to(getattr(torch, layout))
    if layout == "2d":
        return t.unsqueeze(0)
    if layout == "0d":
        return t[0] if values else torch.tensor(0, dtype=dtype)
    if layout == "meta":
        return t.to("meta")
    assert layout == "none", layout
    return None
