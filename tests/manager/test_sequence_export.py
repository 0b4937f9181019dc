"""KvManager.describe_sequence and import_sequence: what an export holds, when
a sequence can be exported, and the importing manager's answers: admitted as
decoding with the counts of the exporter, or NOT_NOW / NEVER_FITS with the
state of both managers unchanged; every bad argument refused by name with
nothing changed. (The KV rows' journey is tests/integration/test_sequence_transfer.py.)"""
import random

import pytest
import torch

import ukv_torch
from ukv_torch import KvManager, SequenceExport, ServeConfig, plan_kv_layout

LAYERS = (0, 4, 128)
LAYOUTS = ["static", "upstream", "elastic", "row_space"]


def manager(layout, budget_kib=400, **options):
    config = ServeConfig(layout=layout, window=128, mtp_k=2, compress_ratios=(4, 128), max_num_seqs=8,
                         max_num_batched_tokens=512, max_blocks_per_seq=12, swa_sizing="step",
                         swa_page_tokens=32 if layout == "row_space" else 0, **options)
    plan = plan_kv_layout(budget_kib << 10, LAYERS, config, head_dim=1, kv_elem_bytes=8, rope_head_dim=0,
                          indexer_bytes_per_block=0)
    return KvManager(plan)


def tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(32000) for _ in range(n)]


def decoding(mgr, seq_id, prompt, sampled=7, salt=None):
    """Admit and prefill prompt in one chunk, then commit the sampled token: a decoding sequence."""
    cached = mgr.allocate(seq_id, prompt, salt=salt)
    assert cached >= 0
    mgr.ensure_for_tokens([seq_id], [len(prompt) - cached])
    mgr.commit_prefill([seq_id], [len(prompt) - cached], [sampled])


def too_small(layout):
    """A manager of the layout that a 1000-token sequence can never fit: few logical
    blocks (slot layouts), few rows (row space)."""
    if layout == "row_space":
        return manager(layout, budget_kib=6)
    big = manager(layout)
    return KvManager(big.config, big.pools.replace(num_logical_blocks=6))


def state(mgr):
    return mgr.torch_object.__getstate__()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_describe_a_decoding_sequence(layout):
    mgr = manager(layout)
    prompt = tokens(700)
    decoding(mgr, 3, prompt)
    before = state(mgr)
    e = mgr.describe_sequence(3)
    assert state(mgr) == before
    assert isinstance(e, SequenceExport) and e.config == mgr.config
    assert e.tokens.tolist() == prompt + [7] and e.num_computed == 700 and e.swa_begin == 700 - 127
    assert e.block_hashes.dtype == torch.int64 and len(e.block_hashes) <= 700 // 128
    assert e.logical.tolist() == mgr.logical_table(3).tolist()
    assert e.phys.shape == (1 if layout == "row_space" else 2, len(e.logical))
    assert len(e.swa_units) == len(mgr.swa_table(3))


def test_only_a_decoding_sequence_between_steps_can_be_exported():
    mgr = manager("row_space")
    mgr.allocate(1, tokens(300))
    with pytest.raises(RuntimeError, match="sequence 1 is still prefilling"):
        mgr.describe_sequence(1)
    decoding(mgr, 2, tokens(300, 1))
    mgr.append([2], [3])
    with pytest.raises(RuntimeError, match="sequence 2 has 3 positions appended but not committed"):
        mgr.describe_sequence(2)
    with pytest.raises(ValueError, match="unknown sequence id 99"):
        mgr.describe_sequence(99)


@pytest.mark.parametrize("a_layout, b_layout", [("static", "row_space"), ("row_space", "elastic"),
                                                ("upstream", "static"), ("elastic", "upstream")])
def test_import_decodes_as_if_prefilled_there(a_layout, b_layout):
    a, b, replay = manager(a_layout), manager(b_layout), manager(b_layout)
    prompt = tokens(650)
    decoding(a, 1, prompt)
    a.append([1], [2])
    a.commit_decode([1], [2], [11, 12])  # decoded a while: 652 computed, 653 known
    e = a.describe_sequence(1)
    decoding(b, 5, tokens(400, 9))       # B has another sequence live
    decoding(replay, 5, tokens(400, 9))
    assert b.import_sequence(8, e) == 0
    assert (b.num_computed(8), b.num_tokens(8)) == (652, 653)
    b.check_invariants()
    # As if prefilled there: the same sequence prefilled on a twin of B in one chunk holds as much.
    decoding(replay, 8, e.tokens.tolist()[:-1], sampled=int(e.tokens[-1]))
    assert len(b.logical_table(8)) == len(replay.logical_table(8))
    assert b.stats()["held_swa_slots"] <= replay.stats()["held_swa_slots"]
    assert b.can_append([5, 8], [3, 3]) == 2
    b.append([5, 8], [3, 3])
    b.commit_decode([5, 8], [1, 2], [1, 2, 3])
    assert (b.num_computed(8), b.num_tokens(8)) == (654, 655)
    b.check_invariants()


def test_import_reuses_the_prefix_the_importer_caches():
    a, b = manager("elastic"), manager("row_space")
    prompt = tokens(700)
    decoding(a, 1, prompt)
    decoding(b, 2, prompt[:600] + tokens(10, 5))  # B computed the first 4 blocks of it
    b.deallocate([2])
    cached = b.import_sequence(3, a.describe_sequence(1))
    assert cached > 0 and cached % 128 == 0 and b.num_computed(3) == 700


def test_an_imported_sequence_keeps_its_cache_salt():
    """The importer admits the sequence under the exporter's salt: it reuses a
    prefix cached under that salt, and an unsalted export of the same tokens
    does not."""
    a, b = manager("elastic"), manager("row_space")
    prompt = tokens(700)
    decoding(a, 1, prompt, salt=b"tenant-a")
    decoding(a, 2, prompt)
    salted, plain = a.describe_sequence(1), a.describe_sequence(2)
    assert (salted.salt, plain.salt) == (ukv_torch.cache_salt(b"tenant-a"), 0)
    decoding(b, 5, prompt[:600] + tokens(10, 5), salt=b"tenant-a")  # B caches 4 blocks under the salt
    b.deallocate([5])
    assert b.import_sequence(4, plain) == 0
    cached = b.import_sequence(3, salted)
    assert cached > 0 and cached % 128 == 0 and b.num_computed(3) == 700


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_refused_import_changes_nothing(layout):
    a = manager("row_space")
    decoding(a, 1, tokens(1000))
    e = a.describe_sequence(1)
    a_before = state(a)
    # NEVER_FITS: too small for it with nothing live.
    small = too_small(layout)
    before = state(small)
    assert small.import_sequence(4, e) == KvManager.NEVER_FITS
    assert state(small) == before
    # NOT_NOW: live sequences hold the room.
    busy = manager(layout, budget_kib=200)
    seq = 10
    while busy.can_allocate(tokens(1000, seq)) >= 0:
        decoding(busy, seq, tokens(1000, seq))
        seq += 1
    before = state(busy)
    assert busy.import_sequence(4, e) == KvManager.NOT_NOW
    assert state(busy) == before and not busy.has_sequence(4)
    assert state(a) == a_before


def test_bad_imports_are_refused_by_name_with_nothing_changed():
    a, b = manager("elastic"), manager("row_space")
    decoding(a, 1, tokens(300))
    decoding(b, 2, tokens(200, 3))
    e = a.describe_sequence(1)
    before = state(b)
    cases = [
        (lambda: b.import_sequence(-1, e), ValueError, "sequence ids must be >= 0"),
        (lambda: b.import_sequence(2, e), ValueError, "sequence id 2 is already allocated"),
        (lambda: b.import_sequence(3, e._replace(num_computed=299)), ValueError, "num_computed must be len"),
        (lambda: b.import_sequence(3, e._replace(tokens=e.tokens[:1], num_computed=0)), ValueError,
         "num_computed must be len"),
        (lambda: b.import_sequence(3, e._replace(config=e.config.replace(window=64))), ValueError,
         "exported with window=64, this pool has window=128"),
        (lambda: b.import_sequence(3, e._replace(config=e.config.replace(block_size=256))), ValueError,
         "block_size=256"),
        (lambda: b.import_sequence(3, e._replace(tokens=torch.tensor([-5] * 301))), ValueError, "tokens"),
        (lambda: b.import_sequence(3, tuple(e)), TypeError, "export must be a SequenceExport"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
        assert state(b) == before


def test_full_retain_cannot_import():
    a = manager("elastic")
    decoding(a, 1, tokens(300))
    b = manager("upstream", full_retain=True, swa_budget_frac=0.5)
    before = state(b)
    with pytest.raises(ValueError, match="full_retain"):
        b.import_sequence(3, a.describe_sequence(1))
    assert state(b) == before
