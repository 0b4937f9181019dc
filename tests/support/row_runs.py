"""Row runs for the gather_rows / scatter_rows tests: random runs over disjoint
rows, packed at shuffled buffer offsets, and their tensors on a device."""
import torch


def row_bytes(t):
    return t.shape[1] * t.element_size()


def random_runs(rng, tensors, max_runs):
    """Runs over disjoint rows, packed one after the other at shuffled buffer offsets."""
    runs, used = [], [set() for _ in tensors]
    for _ in range(max_runs):
        i = rng.randrange(len(tensors))
        rows = rng.randint(1, 4)
        first = rng.randrange(tensors[i].shape[0] - rows + 1)
        if used[i] & set(range(first, first + rows)):
            continue
        used[i] |= set(range(first, first + rows))
        runs.append([i, first, rows, 0])
    order = list(range(len(runs)))
    rng.shuffle(order)
    offset = 0
    for j in order:
        runs[j][3] = offset
        offset += runs[j][2] * row_bytes(tensors[runs[j][0]]) + rng.randrange(3)  # gaps stay untouched
    return runs, offset


def run_tensors(runs, count, device):
    return (torch.tensor(runs, dtype=torch.int64).view(-1, 4).to(device),
            torch.tensor([count], dtype=torch.int32).to(device))
