"""What the guide says equals what the code does: each documented formula or
rule computed here independently of the product (hashlib, xxhash, a Python
finaliser, the manager's answers) and found in docs/serving-loop.md. A
router or engine written from the guide alone computes the same keys and
makes the same calls."""
import hashlib
import random
import re
from pathlib import Path

import pytest
import torch
import xxhash

import ukv_torch
from support.hash_formulas import M64, fmix64
from support.transfer_pools import Pool, prefilled

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "serving-loop.md").read_text()
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def in_guide(text):
    """The guide contains text, whatever its line breaks."""
    return " ".join(text.split()) in " ".join(GUIDE.split())


@pytest.mark.parametrize("data", [b"tenant-a", b"", bytes(range(200))], ids=["tenant", "empty", "200_bytes"])
def test_a_bytes_salt_is_blake2b_with_an_8_byte_digest_size(data):
    documented = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    first_8_bytes = int.from_bytes(hashlib.blake2b(data).digest()[:8], "little")
    assert ukv_torch.cache_salt(data) == documented != first_8_bytes
    assert in_guide('`int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")`')
    assert "first 8 bytes of their BLAKE2b digest" not in GUIDE
    assert "digest_size=8" in ukv_torch.cache_salt.__doc__ and "digest_size=8" in README


@pytest.mark.parametrize("pages_per_block", [1, 2, 4, 8])
def test_the_swa_page_key_is_the_documented_formula(pages_per_block):
    rng = random.Random(pages_per_block)
    hashes = [rng.getrandbits(64) for _ in range(5)] + [0, M64]
    expected = [h if pages_per_block == 1 else fmix64(h ^ (((j + 1) * 0x9E3779B97F4A7C15) & M64))
                for h in hashes for j in range(pages_per_block)]
    assert ukv_torch.swa_page_hashes(hashes, pages_per_block) == expected
    assert in_guide("`fmix64(h ^ ((j + 1) * 0x9E3779B97F4A7C15))`")
    assert in_guide("`x ^= x >> 33; x *= 0xFF51AFD7ED558CCD; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53; x ^= x >> 33`")


@pytest.mark.parametrize("salt", [None, 12345, b"tenant"])
def test_block_hashes_are_the_documented_xxh64_chain(salt):
    tokens = [random.Random(7).randrange(2**31) for _ in range(3 * 16 + 5)]
    seed = ukv_torch.cache_salt(salt)
    expected, parent = [], None
    for i in range(len(tokens) // 16):
        block = b"".join(t.to_bytes(8, "little") for t in tokens[16 * i: 16 * i + 16])
        parent = (xxhash.xxh64(parent.to_bytes(8, "little") + block, seed=0).intdigest() if parent is not None
                  else xxhash.xxh64(block, seed=seed).intdigest())
        expected.append(parent)
    assert ukv_torch.block_hashes(tokens, 16, salt=salt) == expected
    assert in_guide("with the request's salt as the XXH64 seed")


def test_a_second_ensure_for_tokens_before_its_commit_replaces_the_first():
    pool = Pool("row_space")
    pool.mgr.allocate(1, list(range(500)))
    pool.mgr.ensure_for_tokens([1], [300])
    pool.mgr.ensure_for_tokens([1], [200])
    with pytest.raises(ValueError, match="commits 300 tokens but ensure_for_tokens provisioned 200"):
        pool.mgr.commit_prefill([1], [300])
    pool.mgr.commit_prefill([1], [200])
    assert pool.mgr.num_computed(1) == 200
    pool.mgr.check_invariants()
    assert in_guide("A second `ensure_for_tokens` of a sequence before its `commit_prefill` replaces the first: "
                    "the chunk is the count given last")


def test_a_second_append_before_its_commit_replaces_the_first():
    pool = Pool("row_space")
    prefilled(pool, 1, 300)
    pool.mgr.append([1], 3)
    pool.mgr.append([1], 1)
    with pytest.raises(ValueError, match=r"counts must be in \[1, 1\]"):
        pool.mgr.commit_decode([1], [2], [5, 6])
    pool.mgr.commit_decode([1], [1], [5])
    assert pool.mgr.num_computed(1) == 301
    pool.mgr.check_invariants()
    assert in_guide("A second `append` of a sequence before its `commit_decode` replaces the first's count")
    assert in_guide('is refused ("no positions scheduled")')


def test_swa_slot_mapping_takes_the_page_from_swa_rows_and_checks_block_size():
    rows = [32, 192, 10, 32, 64]
    table = torch.tensor([[5, 7, 9, 11]], dtype=torch.int32)
    positions = torch.arange(0, 128, 13)
    out = torch.empty(len(positions), dtype=torch.int32)
    for block_size in (128, 256):  # the page comes from swa_rows; block_size must be a multiple of it
        ukv_torch.swa_slot_mapping(table, positions, torch.zeros(len(positions), dtype=torch.int32), out,
                                   block_size=block_size, swa_rows=rows)
        assert out.tolist() == [int(table[0, p // 32]) * 192 + 10 + p % 32 for p in positions.tolist()]
    with pytest.raises(ValueError, match="swa_slot_mapping: swa_rows: the page of 32 tokens must divide block_size 48"):
        ukv_torch.swa_slot_mapping(table, positions, torch.zeros(len(positions), dtype=torch.int32), out,
                                   block_size=48, swa_rows=rows)
    assert in_guide("Given `swa_rows`, the raw op reads the page size from it and uses `block_size` only to check "
                    "the pair: a page that does not divide `block_size` is refused")


def test_chunks_within_the_budget_pass_the_copy_list_and_larger_ones_are_refused_changing_nothing():
    """The guide's promise: a step's chunks within max_num_batched_tokens are never
    refused for the row copies; beyond, a refusal changes nothing and a chunk
    cut back to the budget, down to one token, proceeds."""
    # A step budget of 128 tokens: the chunks' share of the copy list (the list
    # also keeps a share for the step's appends and one for loads from a KV
    # tier) holds far less than four 1,000-token chunks.
    pool = Pool("row_space", max_num_batched_tokens=128)  # max_num_seqs 4
    budget = pool.plan.config.max_num_batched_tokens
    ids = [1, 2, 3, 4]
    for i in ids:
        assert pool.mgr.allocate(i, [i] * 1000) == 0
    before = pool.mgr.torch_object.__getstate__()
    with pytest.raises(ValueError, match=r"^ensure_for_tokens: the chunks bind \d+ row-space units, more than the "
                                         r"moves the step's copy list has room for"):
        pool.mgr.ensure_for_tokens(ids, [1000] * 4)
    assert pool.mgr.torch_object.__getstate__() == before
    for counts in ([1] * 4, [budget - 3, 1, 1, 1], [budget // 4] * 4):  # over several calls, as an engine may
        for i, count in zip(ids, counts):
            pool.mgr.ensure_for_tokens([i], [count])
        pool.mgr.stage(ids)
        pool.mgr.commit_prefill(ids, counts)
    pool.mgr.check_invariants()
    assert in_guide("never refuses a step's chunks as long as they hold at most `max_num_batched_tokens` tokens")
