"""Tier keys against the formula keys.py documents, computed here with hashlib:
the root, the chain over the prefix, the tail key, and KeyChain's keys of a
manager's Stored events (tokens as tuples) equal to chain_keys' (tokens as an
array)."""
import hashlib
import random

import numpy as np
import pytest
import torch

from ukv_torch import KvManager, ServeConfig
from ukv_torch.manager.kv_events import KvEventKind, KvRole
from ukv_torch.tiers.keys import KeyChain, chain_keys, root_key, tail_key, token_bytes

BS = 16
FP = hashlib.sha256(b"a model").digest()[:16]


def sha128(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()[:16]


def reference_keys(tokens, salt: int, count: int):
    key = sha128(b"ukv-tier-root", FP, salt.to_bytes(8, "little"))
    keys = []
    for i in range(count):
        key = sha128(key, b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens[i * BS: (i + 1) * BS]))
        keys.append(key)
    return keys


@pytest.mark.parametrize("seed", range(4))
def test_chain_keys_follow_the_documented_formula(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(1 << 31) for _ in range(6 * BS + 3)]
    salt = rng.randrange(1 << 64)
    expected = reference_keys(tokens, salt, 6)
    for form in (tokens, np.array(tokens), torch.tensor(tokens)):
        assert chain_keys(root_key(FP, salt), form, BS, 6) == expected
        # from the middle, chained from the key before
        assert chain_keys(expected[2], form, BS, 3, start=3) == expected[3:]
    assert tail_key(expected[4]) == sha128(expected[4], b"swa-tail")


def test_token_bytes_are_8_byte_little_endian_whatever_the_form():
    tokens = [0, 1, 255, 256, (1 << 31) - 1, -1]
    expected = b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
    for form in (tokens, tuple(tokens), np.array(tokens), torch.tensor(tokens)):
        assert token_bytes(form) == expected


def test_the_events_keys_are_the_prompts_chain():
    mgr = KvManager(ServeConfig(block_size=BS, window=8, compress_ratios=(4,), max_num_seqs=2,
                                max_num_batched_tokens=8 * BS, max_blocks_per_seq=8),
                    num_logical_blocks=32, num_swa_blocks=32, type_slots=[32])
    rng = random.Random(7)
    tokens = [rng.randrange(1 << 31) for _ in range(5 * BS + 1)]
    mgr.allocate(0, tokens, salt=9)
    mgr.ensure_for_tokens([0], [len(tokens)])
    mgr.commit_prefill([0], [len(tokens)], [1])
    chain = KeyChain(FP, limit=100)
    keys = [chain.key_of(ev, token_bytes(ev.token_ids)) for ev in mgr.take_events()
            if ev.kind == KvEventKind.STORED and ev.role == KvRole.COMPRESS]
    assert keys == reference_keys(tokens, 9, 5)
