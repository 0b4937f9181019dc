"""Random inputs of apply_row_copies, and the op against the reference
(ukv_torch.testing.index_reference.apply_row_copies) on the planes' bytes."""
import random
from dataclasses import dataclass
from typing import List

import pytest
import torch

from ukv_torch.testing import index_reference as ref

INT32_MAX = 2**31 - 1
PLANE_DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.float64, torch.int16, torch.uint8, torch.bool,
                torch.complex64, torch.float8_e4m3fn]
# Entries outside any plane of fewer than 2^31 - 1 rows: the op skips them.
OUT_OF_RANGE = [[-1, 0, 1], [0, -3, 1], [0, 1, 0], [0, 1, -4], [INT32_MAX, 0, 1], [0, INT32_MAX, 1],
                [0, 1, INT32_MAX], [-(2**31), 0, 2]]


@dataclass
class CopyCase:
    """copies ([n, 3] rows of (src, dst, rows)) and counts (one per phase)."""

    copies: List[List[int]]
    counts: List[int]


def disjoint_phase(rng, num_rows, max_copies, max_rows=6):
    """Copies touching disjoint rows (none reads or writes a row another touches)."""
    touched, phase = set(), []
    for _ in range(rng.randint(0, max_copies)):
        n = rng.randint(1, min(max_rows, num_rows))
        src, dst = rng.randint(0, num_rows - n), rng.randint(0, num_rows - n)
        rows = set(range(src, src + n)) | set(range(dst, dst + n))
        if len(rows) < 2 * n or rows & touched:
            continue
        touched |= rows
        phase.append([src, dst, n])
    return phase


def random_copy_case(rng, num_rows, *, num_phases=None, max_copies=8, max_rows=6, invalid=True, trailing=True,
                     over_count=True):
    """Phases of disjoint copies (a later phase reads and writes rows of earlier
    ones as chance has it), with out-of-range entries mixed in, an empty phase
    of zero or negative count, and either a last count past the list or
    trailing entries past every count, which must not be applied."""
    copies, counts = [], []
    for _ in range(rng.randint(1, 4) if num_phases is None else num_phases):
        if invalid and rng.random() < 0.2:
            counts.append(rng.choice([0, -1, -(2**31)]))
            continue
        phase = disjoint_phase(rng, num_rows, max_copies, max_rows)
        if invalid:
            for _ in range(rng.randint(0, 2)):
                phase.insert(rng.randint(0, len(phase)), list(rng.choice(OUT_OF_RANGE)))
            if num_rows > 0:
                n = rng.randint(1, 4)  # a range that runs past the last row
                phase.append([num_rows - n + 1, 0, n] if rng.random() < 0.5 else [0, num_rows - n + 1, n])
        copies += phase
        counts.append(len(phase))
    if over_count and counts and counts[-1] >= 0 and rng.random() < 0.5:  # then no entry trails the last phase
        counts[-1] += rng.choice([1, 5, INT32_MAX - sum(max(c, 0) for c in counts)])
    elif trailing and num_rows > 1:
        copies += [[0, 1, 1], [num_rows - 1, 0, 1]]
    return CopyCase(copies, counts)


def random_planes(rng, num_rows, device, num_planes=None, widths=(1, 3, 8, 16, 33, 128)):
    """1 to 4 planes of num_rows rows, each its own dtype and width, random bytes."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    planes = []
    for _ in range(rng.randint(1, 4) if num_planes is None else num_planes):
        dtype, width = rng.choice(PLANE_DTYPES), rng.choice(widths)
        size = torch.empty(0, dtype=dtype).element_size()
        cells = torch.randint(0, 256, (num_rows, width * size), dtype=torch.uint8, generator=g)
        planes.append(cells.view(dtype).to(device))
    return planes


def plane_bytes(plane):
    """A plane's rows as lists of bytes (the reference's planes)."""
    return plane.contiguous().view(torch.uint8).reshape(plane.shape[0], -1).cpu().tolist()


def copies_tensor(case, device, min_rows=0):
    """case.copies as an int32 [max(n, min_rows), 3] tensor (extra rows are zero entries, never in a phase)."""
    rows = case.copies + [[0, 0, 0]] * max(0, min_rows - len(case.copies))
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 3)


def expected_bytes(planes, case):
    """Each plane's bytes after the reference applies the case's copies."""
    rows = [plane_bytes(p) for p in planes]
    ref.apply_row_copies(rows, case.copies, case.counts)
    return rows


def run_and_compare(planes, case, device):
    """apply_row_copies on planes (modified), checked against the reference. On the
    host a list the reference says is refused raises, naming an entry, with
    the planes unchanged; on the GPU its bad entries are skipped."""
    expected = expected_bytes(planes, case)
    counts = torch.tensor(case.counts, dtype=torch.int32, device=device)
    num_rows = planes[0].shape[0] if planes else 0
    if torch.device(device).type == "cpu" and ref.refused_row_copies(case.copies, case.counts, num_rows):
        before = [plane_bytes(p) for p in planes]
        with pytest.raises(ValueError, match=r"apply_row_copies: copies\["):
            torch.ops.ukv.apply_row_copies.default(planes, copies_tensor(case, device), counts)
        assert [plane_bytes(p) for p in planes] == before
        return
    torch.ops.ukv.apply_row_copies.default(planes, copies_tensor(case, device), counts)
    assert [plane_bytes(p) for p in planes] == expected


def fresh_case(seed, num_rows, device, **kwargs):
    rng = random.Random(seed)
    return random_planes(rng, num_rows, device), random_copy_case(rng, num_rows, **kwargs)
