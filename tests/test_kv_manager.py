"""Scenario tests of ukv_torch.KvManager: the behaviours of issue 4 and the
SPEC.md §5 hazards, bad inputs, pickling, determinism, events, stats,
threads and graph-safe staging. Expected values are derived by hand from
SPEC.md / ARCHITECTURE.md; the randomized whole-run comparison with the
pure-Python model is in test_kv_manager_model.py.
"""
import random

import pytest
import torch

import ukv_torch
from ukv_torch import KvManager

BS = 128


def manager(unified=True, **overrides):
    options = dict(num_logical_blocks=32, num_swa_blocks=16, unified=unified, max_num_seqs=8, max_blocks_per_seq=16)
    options.update(overrides)
    return KvManager(**options)


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


layouts = pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])


# ------------------------------------------------------------- phase checks --
@layouts
def test_decode_calls_refuse_a_prompt_one_token_short(unified):
    m = manager(unified)
    m.allocate(1, tokens(200, 1))
    m.ensure_for_tokens([1], [199])
    m.commit_prefill([1], [199])  # one prompt token left: num_tokens == num_computed + 1, yet prefilling
    before = state(m)
    with pytest.raises(ValueError, match="not decoding"):
        m.can_append([1])
    with pytest.raises(ValueError, match="not decoding"):
        m.append([1])
    with pytest.raises(ValueError, match="not decoding"):
        m.commit_decode([1], [1], [5])
    assert state(m) == before


@layouts
def test_prefill_calls_refuse_a_decoding_sequence(unified):
    m = manager(unified)
    m.allocate(1, tokens(256, 1))
    prefill(m, 1, tokens(256, 1))  # the sampled token makes it decode; blocks cover 256 positions
    before = state(m)
    with pytest.raises(ValueError, match="decoding"):
        m.ensure_for_tokens([1], [1])
    with pytest.raises(ValueError, match="decoding"):
        m.commit_prefill([1], [1])
    assert state(m) == before
    m.check_invariants()


@layouts
def test_commit_decode_refuses_more_positions_than_append_scheduled(unified):
    m = manager(unified, mtp_k=2)
    m.allocate(1, tokens(100, 1))
    prefill(m, 1, tokens(100, 1))  # 101 tokens: the decode block has room for 27 more
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [1], [5])  # nothing scheduled yet
    m.append([1], 2)
    before = state(m)
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [3], [5, 6, 7])  # 3 > the 2 positions computed this step
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [0], [])
    assert state(m) == before
    m.commit_decode([1], [2], [5, 6])
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [1], [5])  # the step is committed
    assert m.num_computed(1) == 102


@layouts
def test_clear_cache_drops_checkpoint_pins(unified):
    m = manager(unified, full_retain=True, retention_interval=256, checkpoint_frac=0.25,
                max_num_batched_tokens=256, num_swa_blocks=32)
    toks = tokens(1000, 1)
    m.allocate(1, toks)
    prefill(m, 1, toks, chunk=128)
    m.deallocate([1])
    pinned = m.stats()["held_swa_slots"]
    assert 0 < pinned <= 8  # checkpoints of a freed prompt stay pinned (capacity 32 * 0.25)
    assert m.can_allocate(toks + [1]) == 7  # and serve its prefix
    m.clear_cache()
    assert m.stats()["held_swa_slots"] == 0
    assert m.can_allocate(toks + [1]) == 0
    m.check_invariants()
