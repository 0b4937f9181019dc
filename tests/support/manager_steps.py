"""Small building blocks of the KV manager's scenario tests: managers of each
layout from one set of options (the same options build the pure-Python
model), token lists, whole prefills and decode steps, and the serialized
state a refused call must leave unchanged."""
import random

from ukv_torch import KvManager
from ukv_torch.testing.kv_manager_model import KvManagerModel

BS = 128
# The four layouts with pools of about the same size: 32 logical blocks and
# 16 SWA blocks (64 SWA pages of 32 tokens in the row space).
ENVELOPE_ROWS, UNIT_ROWS, PAGE = 40, 32, 32
LAYOUTS = {
    "static": dict(unified=False, num_logical_blocks=32, num_swa_blocks=16),
    "upstream": dict(layout="upstream", num_logical_blocks=32, num_swa_blocks=16),
    "elastic": dict(layout="elastic", num_logical_blocks=32, num_swa_blocks=16),
    "row_space": dict(layout="row_space", total_rows=32 * ENVELOPE_ROWS + 64 * UNIT_ROWS,
                      envelope_rows=ENVELOPE_ROWS, swa_unit_rows=UNIT_ROWS, swa_page_tokens=PAGE),
}


def options(layout, **overrides):
    """A layout's options (KvManager keywords), with overrides."""
    opts = dict(LAYOUTS[layout], max_num_seqs=8, max_blocks_per_seq=16)
    opts.update(overrides)
    return opts


def pair(layout, **overrides):
    """The C++ manager and the model, built from the same options."""
    opts = options(layout, **overrides)
    return KvManager(**opts), KvManagerModel(**opts)


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1, 1 << 20) for _ in range(n)]


def prefill(m, sid, toks, chunk=None, sampled=7):
    """Prefill the uncomputed part of a prompt in chunks (whole when chunk is None)."""
    left = len(toks) - m.num_computed(sid)
    while left > 0:
        n = left if chunk is None else min(chunk, left)
        m.ensure_for_tokens([sid], [n])
        left -= n
        m.commit_prefill([sid], [n], [sampled if left == 0 else -1])


def decode(m, sid, steps=1, token=9):
    for _ in range(steps):
        assert m.can_append([sid]) == 1
        m.append([sid])
        m.commit_decode([sid], [1], [token])


def state(m):
    return m.torch_object.__getstate__()
