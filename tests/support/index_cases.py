"""Randomised decode and prefill steps for the index-op tests."""
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import List, Optional

import torch

from ukv_torch.testing import index_reference as ref

# Output cells start as SENTINEL; every buffer has SLACK cells past the last
# slice, so a write outside its slice or a cell left unwritten shows up.
SENTINEL = -7
SLACK = 6
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass
class Step:
    """One forward's inputs, as Python lists (the reference reads these)."""

    block_size: int
    window: int
    index_topk: int
    compress_base: int
    positions: List[int]
    batch_id: List[int]
    swa_table: List[List[int]]
    csa_table: List[List[int]]
    hca_table: List[List[int]]
    n_csa: List[int]
    n_hca: List[int]
    topk: List[List[int]]
    chunk_start: List[int] = field(default_factory=list)
    query_start: List[int] = field(default_factory=list)
    csa_ratio: int = 4
    hca_ratio: int = 128
    # The row-space layout's constants (RowSpaceArgs); None: the slot layouts.
    row_space: Optional["RowSpaceArgs"] = None

    @property
    def num_seqs(self):
        return len(self.swa_table)

    def swa_rows_of(self, name):
        """The SWA row constants of output 'swa', 'csa' or 'hca' (None: plain)."""
        return None if self.row_space is None else self.row_space.swa_rows_of(name)

    @property
    def csa_stride(self):
        return None if self.row_space is None else self.row_space.csa_stride

    @property
    def hca_stride(self):
        return None if self.row_space is None else self.row_space.hca_stride

    def swa_rows_kwargs(self, row_space=None):
        """swa_rows / csa_swa_rows / hca_swa_rows of the paged ops: of row_space if
        given, else the step's (all None in the slot layouts)."""
        return swa_rows_kwargs(row_space or self.row_space)

    @property
    def csa_k(self):
        return self.block_size // self.csa_ratio

    @property
    def hca_k(self):
        return self.block_size // self.hca_ratio

    def csa_valid_k(self, t):
        b, p = self.batch_id[t], self.positions[t]
        if not ref.is_real(b, self.num_seqs):
            return 0
        return min((p + 1) // self.csa_ratio, self.n_csa[b], self.index_topk)

    def tensors(self, device, positions_dtype=torch.int64, strided_tables=False):
        """The step as tensors on device; tables optionally as column slices of wider buffers."""
        def vec(values, dtype=torch.int32):
            return torch.tensor(values, dtype=dtype, device=device)

        def table(rows):
            t = torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(rows), -1)
            if not strided_tables:
                return t
            wide = torch.full((t.shape[0], t.shape[1] + 3), 999, dtype=torch.int32, device=device)
            wide[:, : t.shape[1]] = t
            return wide[:, : t.shape[1]]

        topk = torch.tensor(self.topk, dtype=torch.int32, device=device).reshape(len(self.topk), self.index_topk)
        return SimpleNamespace(
            positions=vec(self.positions, positions_dtype),
            batch_id=vec(self.batch_id),
            swa_table=table(self.swa_table),
            csa_table=table(self.csa_table),
            hca_table=table(self.hca_table),
            n_csa=vec(self.n_csa),
            n_hca=vec(self.n_hca),
            chunk_start=vec(self.chunk_start),
            query_start=vec(self.query_start),
            topk=topk,
        )


# The outputs of the paged ops and the prefix of their swa_rows arguments.
OUTPUT_PREFIXES = {"swa": "", "csa": "csa_", "hca": "hca_"}


@dataclass
class RowSpaceArgs:
    """The row-space arguments of a step: each output class's SWA row
    constants [page, unit_rows, offset, group, group_stride] (None: the slot
    formula, allowed where page and unit_rows are block_size) and the CSA and
    HCA block strides (None: k)."""

    swa_rows: Optional[List[int]]
    csa_swa_rows: Optional[List[int]]
    hca_swa_rows: Optional[List[int]]
    csa_stride: Optional[int]
    hca_stride: Optional[int]
    page: int

    def swa_rows_of(self, name):
        return getattr(self, OUTPUT_PREFIXES[name] + "swa_rows")


def swa_rows_kwargs(row_space):
    """swa_rows / csa_swa_rows / hca_swa_rows of the paged ops for RowSpaceArgs (None: all None)."""
    return {f"{prefix}swa_rows": None if row_space is None else row_space.swa_rows_of(name)
            for name, prefix in OUTPUT_PREFIXES.items()}


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def random_class_rows(rng, page, unit_rows):
    """One layer class's valid constants in units of (page, unit_rows >= page): the
    page's groups do not overlap and span at most a unit (the group stride of a
    page of one group is never used)."""
    group = rng.choice([page, 1] + divisors(page))
    groups = page // group
    if groups == 1:
        group_stride = rng.randint(1, 3 * group)
    else:
        widest = (unit_rows - group) // (groups - 1)
        group_stride = rng.choice([group, rng.randint(group, widest), widest])
    return [page, unit_rows, rng.randint(0, 2 * unit_rows), group, group_stride]


def random_row_space(rng, block_size, csa_k, hca_k, *, page=None):
    """Random valid row-space arguments: one page and unit size, each class
    its own offset, group and group stride (so the three outputs' rows
    differ), sometimes a class in the slot formula (when page and unit rows
    are block_size), block strides of k or an envelope past it."""
    page = page or rng.choice([p for p in (block_size, block_size, 16, 32, 48, 64, 96) if block_size % p == 0])
    unit_rows = rng.choice([page, block_size, 3 * page, 3 * page + rng.randint(1, 50), rng.randint(page, 4 * page)])
    plain_ok = page == block_size and unit_rows == block_size
    sets = [None if plain_ok and rng.random() < 0.3 else random_class_rows(rng, page, unit_rows) for _ in range(3)]

    def stride(k):
        return rng.choice([None, k, k + rng.randint(1, 3 * k + 8), k + rng.randint(1, 5000)])
    return RowSpaceArgs(*sets, csa_stride=stride(csa_k), hca_stride=stride(hca_k), page=page)


def output_buffer(indptr, device):
    """A sentinel-filled output for the slices of indptr (plus SLACK cells)."""
    return torch.full((indptr[-1] + SLACK,), SENTINEL, dtype=torch.int32, device=device)


def reference_buffer(indptr):
    return [SENTINEL] * (indptr[-1] + SLACK)


def _random_table(rng, num_seqs, cols, num_ids):
    return [[rng.randrange(num_ids) for _ in range(cols)] for _ in range(num_seqs)]


def _row_space_swa_table(rng, num_seqs, cols, num_ids, block_size, page):
    """A staged SWA table of the row-space layout: as many pages of `page`
    tokens as the slot table's cols blocks hold, plus one, and -1 for some
    pages a sequence does not hold (the ops read such an entry as unit 0)."""
    page_cols = -(-cols * block_size // page) + 1
    return [[-1 if rng.random() < 0.15 else rng.randrange(num_ids) for _ in range(page_cols)]
            for _ in range(num_seqs)]


def _row_space_of(rng, row_space, block_size):
    """row_space as given to a step maker: False / None, True (random), or RowSpaceArgs."""
    if row_space is True:
        return random_row_space(rng, block_size, block_size // 4, block_size // 128)
    return row_space or None


def _topk_rows(rng, step):
    """Valid sequence-local entries in [0, valid_k) lanes, garbage after them (as the top-k kernel leaves them)."""
    rows = []
    for t in range(len(step.positions)):
        valid_k = step.csa_valid_k(t)
        b, p = step.batch_id[t], step.positions[t]
        visible = min((p + 1) // step.csa_ratio, step.n_csa[b]) if ref.is_real(b, step.num_seqs) else 0
        row = [rng.randrange(visible) for _ in range(valid_k)]
        row += [rng.randint(INT32_MIN, INT32_MAX) for _ in range(step.index_topk - valid_k)]
        rows.append(row)
    return rows


def _finish(rng, step, num_padding):
    for _ in range(num_padding):
        step.positions.append(rng.randint(-5, 10**6))
        step.batch_id.append(-1)
    step.topk = _topk_rows(rng, step)
    return step


def _layout(rng, unified, block_size):
    num_swa_blocks = 40
    base = 0 if unified else torch.ops.ukv.compress_base_row(False, num_swa_blocks, block_size)
    return num_swa_blocks, base


def _swa_table(rng, row_space, num_seqs, cols, num_swa_blocks, block_size):
    if row_space is None:
        return _random_table(rng, num_seqs, cols, num_swa_blocks)
    return _row_space_swa_table(rng, num_seqs, cols, num_swa_blocks, block_size, row_space.page)


def make_decode_step(rng: random.Random, *, contexts: List[int], q_lens: Optional[List[int]] = None,
                     num_padding=0, window=128, block_size=128, index_topk=64, unified=True,
                     table_cols: Optional[int] = None, row_space=None) -> Step:
    """A decode (or MTP verify, q_len > 1) step: sequence i has contexts[i] tokens
    after this forward and min(q_lens[i], contexts[i]) tokens in it; then
    num_padding bid -1 tokens. row_space: True for random row-space arguments
    (random_row_space), or the RowSpaceArgs to use."""
    q_lens = [min(q, ctx) for q, ctx in zip(q_lens or [1] * len(contexts), contexts)]
    row_space = _row_space_of(rng, row_space, block_size)
    num_swa_blocks, base = _layout(rng, unified, block_size)
    cols = table_cols or max(contexts) // block_size + 2
    n = len(contexts)
    step = Step(block_size=block_size, window=window, index_topk=index_topk, compress_base=base,
                positions=[], batch_id=[], swa_table=_swa_table(rng, row_space, n, cols, num_swa_blocks, block_size),
                csa_table=_random_table(rng, n, cols, 500), hca_table=_random_table(rng, n, cols, 500),
                n_csa=[c // 4 for c in contexts], n_hca=[c // 128 for c in contexts], topk=[], row_space=row_space)
    for b, (ctx, q) in enumerate(zip(contexts, q_lens)):
        for i in range(q):
            step.positions.append(ctx - q + i)
            step.batch_id.append(b)
    return _finish(rng, step, num_padding)


def make_prefill_step(rng: random.Random, *, prefixes: List[int], chunk_lens: List[int], num_padding=0,
                      window=128, block_size=128, index_topk=64, unified=True, table_cols: Optional[int] = None,
                      row_space=None) -> Step:
    """A prefill forward: sequence i already has prefixes[i] tokens (cached prefix
    or earlier chunks) and computes chunk_lens[i] more. row_space: as in
    make_decode_step."""
    row_space = _row_space_of(rng, row_space, block_size)
    num_swa_blocks, base = _layout(rng, unified, block_size)
    contexts = [p + c for p, c in zip(prefixes, chunk_lens)]
    cols = table_cols or max(contexts) // block_size + 2
    n = len(prefixes)
    step = Step(block_size=block_size, window=window, index_topk=index_topk, compress_base=base,
                positions=[], batch_id=[], swa_table=_swa_table(rng, row_space, n, cols, num_swa_blocks, block_size),
                csa_table=_random_table(rng, n, cols, 500), hca_table=_random_table(rng, n, cols, 500),
                n_csa=[c // 4 for c in contexts], n_hca=[c // 128 for c in contexts], topk=[],
                chunk_start=list(prefixes), query_start=[], row_space=row_space)
    row = 0
    for b, (prefix, length) in enumerate(zip(prefixes, chunk_lens)):
        step.query_start.append(row)
        for i in range(length):
            step.positions.append(prefix + i)
            step.batch_id.append(b)
        row += length
    return _finish(rng, step, num_padding)
