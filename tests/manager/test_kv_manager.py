"""Scenario tests of ukv_torch.KvManager: phase checks, the upstream hazards
it fixes (test_h*: greedy borrowing, admission counting a slot twice,
livelock on retained bindings, partly written SWA pages, freeing with the
scheduled length, stale-window hits), bad inputs, pickling, determinism,
events, stats, threads and graph-safe staging. Expected values are derived
by hand from upstream's behaviour and ukv's rules; the randomized whole-run
comparison with the pure-Python model is in test_kv_manager_model.py.
"""
import itertools
import random

import pytest
import torch

import ukv_torch
from support.manager_steps import BS, decode, options, pair, prefill, state, tokens
from ukv_torch import KvEventKind, KvManager, KvRole


def manager(unified=True, **overrides):
    opts = dict(num_logical_blocks=32, num_swa_blocks=16, unified=unified, max_num_seqs=8, max_blocks_per_seq=16)
    opts.update(overrides)
    return KvManager(**opts)


def compress_kinds(events):
    """The kinds of the compress blocks' events."""
    return [e.kind for e in events if e.role == KvRole.COMPRESS]


def tightest_swa_pool(unified, request, **overrides):
    """The manager with the fewest SWA blocks that admit `request`: its promise
    and nothing beyond it, so no page outside a chunk's window can be lent."""
    for n in itertools.count(1):
        m = manager(unified, num_swa_blocks=n, **overrides)
        if m.can_allocate(request) >= 0:
            return m


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
    with pytest.raises(ValueError, match="sequence 1 has no positions scheduled: call append"):
        m.commit_decode([1], [1], [5])  # nothing scheduled yet
    m.append([1], 2)
    before = state(m)
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [3], [5, 6, 7])  # 3 > the 2 positions computed this step
    with pytest.raises(ValueError, match="counts"):
        m.commit_decode([1], [0], [])
    assert state(m) == before
    m.commit_decode([1], [2], [5, 6])
    with pytest.raises(ValueError, match="no positions scheduled"):
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
    assert m.can_allocate(toks + [1]) == 7 * BS  # and serve its prefix
    m.clear_cache()
    assert m.stats()["held_swa_slots"] == 0
    assert m.can_allocate(toks + [1]) == 0
    m.check_invariants()


# ------------------------------------------------------------------ hazards --
def elastic(**overrides):
    """One compress type of one block per slot (ratio 1: k = 128 rows), 2 own slots: borrowing is easy to steer."""
    options = dict(num_logical_blocks=10, num_swa_blocks=8, compress_ratios=[1], type_slots=[8 + 2])
    options.update(overrides)
    return manager(True, **options)


def test_h5_and_ha_compress_borrows_only_when_its_own_region_is_full_and_drops_the_swa_entry_first():
    m = elastic(num_logical_blocks=6, type_slots=[8 + 4])  # own region: 4 blocks
    a = tokens(4 * BS, 1)
    m.allocate(1, a)                         # 4 blocks: the own region, nothing borrowed
    prefill(m, 1, a, chunk=BS)               # SWA slots 0 and 1 window-freed (released, cached)
    assert m.stats()["ratio1_borrows"] == 0
    # The own region is full of live blocks and nothing cached can stand in.
    m.allocate(3, tokens(100, 4))            # must borrow: the longest-released shared slot, 0
    st = m.stats()
    assert (st["ratio1_borrows"], st["swa_evictions"], st["compress_evictions"]) == (1, 1, 0)
    assert m.phys_table(3, 0).tolist() == [0]  # base 0: compress block 0 = the rows of SWA slot 0
    m.deallocate([3, 1])  # everything cached: the probes below fit, so they show what hits
    assert m.can_allocate(a[:BS] + tokens(50, 2)) == 0  # the evicted SWA entry is never hit again
    assert m.can_allocate(a[:2 * BS] + [5]) == 2 * BS   # block 1's window (slot 1) is still cached
    m.check_invariants()


def test_a_cached_binding_stands_in_before_compress_borrows_a_shared_slot():
    m = elastic(num_logical_blocks=4, type_slots=[8 + 3])  # own region: 3 blocks
    a = tokens(256, 1)
    m.allocate(1, a)
    prefill(m, 1, a, chunk=BS)
    a_phys = m.phys_table(1, 0).tolist()
    m.deallocate([1])                      # free list: 2, 3, then A's blocks last-first: 1, 0
    m.allocate(2, tokens(100, 3))          # block 2 binds the last own block
    # The own region is full (2 cached bindings, 1 live); free: the 2 released shared slots.
    assert m.stats()["ratio1_free_blocks"] == 2
    m.allocate(3, tokens(100, 4))          # block 3 has no binding: A's block 1 (coldest) stands in
    st = m.stats()
    assert (st["ratio1_borrows"], st["swa_evictions"], st["compress_evictions"]) == (0, 0, 1)
    assert m.logical_table(3).tolist() == [1] and m.phys_table(3, 0).tolist() == [a_phys[1]]
    m.deallocate([2, 3])
    assert m.can_allocate(a + [5]) == BS   # block 0 is still cached, block 1 is not
    m.check_invariants()


def test_h2_a_yes_is_a_promise_under_swa_pressure():
    m = manager(True, num_swa_blocks=8)  # quota 4 blocks per long sequence
    prompts = [tokens(600, i) for i in range(3)]
    assert [m.allocate(i, p) for i, p in enumerate(prompts)] == [0, 0, KvManager.NOT_NOW]  # 2 quotas fill the 8 slots
    assert m.stats()["swa_reserved"] == 8
    assert m.stats()["free_swa_slots"] == 8  # upstream counted these free slots and admitted a third
    for i in range(2):
        prefill(m, i, prompts[i], chunk=100)
    for _ in range(300):  # across block boundaries: decode blocks and windows move
        assert m.can_append([0, 1]) == 2
        m.append([0, 1])
        m.commit_decode([0, 1], [1, 1], [3, 4])
    m.check_invariants()


def test_h3_admission_succeeds_with_every_logical_block_bound_and_the_own_region_full():
    m = manager(True, num_logical_blocks=8, num_swa_blocks=4)  # CSA own region: 2 slots = 8 blocks
    m.allocate(1, tokens(1000, 1))
    prefill(m, 1, tokens(1000, 1))
    m.deallocate([1])
    # Every CSA block of the own region is bound to a cached block; the 8 free
    # blocks are the 2 shared slots SWA released.
    assert m.stats()["ratio4_free_blocks"] == 8
    assert m.allocate(2, tokens(1000, 2)) == 0  # reuse credits the retained bindings
    st = m.stats()
    assert (st["ratio4_borrows"], st["ratio4_free_blocks"]) == (0, 8)  # reused in place, nothing borrowed
    m.check_invariants()


def cached_prompt_beside_free_blocks():
    """10 physical blocks (8 shared slots + 2 own) and 10 logical blocks; a
    4-block prompt computed and freed: the free list is never-used 4..9, then
    its blocks last-first (3, 2, 1, 0), each cached and holding its binding."""
    from ukv_torch.testing.kv_manager_model import block_hash
    m = elastic(num_logical_blocks=10, borrow_unreleased_swa=True)
    a = tokens(4 * BS, 1)
    m.allocate(1, a)
    prefill(m, 1, a)
    phys = m.phys_table(1, 0).tolist()
    h = []
    for i in range(4):
        h.append(block_hash(a[i * BS:(i + 1) * BS], h[-1] if h else None))
    m.deallocate([1])
    m.take_events()
    assert m.stats()["ratio1_free_blocks"] == 6
    return m, phys, h


def test_fresh_blocks_bind_own_room_first_and_cached_ones_stand_in_for_the_rest():
    m = elastic(num_logical_blocks=10, type_slots=[8 + 4], borrow_unreleased_swa=True)  # own region: 4
    a = tokens(2 * BS, 1)
    m.allocate(1, a)
    prefill(m, 1, a)
    a_phys = m.phys_table(1, 0).tolist()
    m.deallocate([1])  # free list: never-used 2..9, then A's blocks last-first: 1, 0
    m.take_events()
    assert m.allocate(2, tokens(BS, 2)) == 0  # room in the own region: block 2 binds afresh
    assert m.logical_table(2).tolist() == [2] and m.stats()["compress_evictions"] == 0
    # 3 unbound blocks (3, 4, 5), 1 block of own room: the last two give way to
    # A's cached blocks, coldest first, rather than opening a shared slot.
    assert m.allocate(3, tokens(3 * BS, 3)) == 0
    assert m.logical_table(3).tolist() == [3, 1, 0]
    assert m.phys_table(3, 0).tolist()[1:] == [a_phys[1], a_phys[0]]  # re-used in place
    st = m.stats()
    assert (st["compress_evictions"], st["ratio1_borrows"]) == (2, 0)
    m.check_invariants()


def test_a_fresh_request_takes_the_coldest_cached_bindings_when_compress_is_full():
    m, a_phys, h = cached_prompt_beside_free_blocks()
    # 5 blocks and an SWA quota of 4: 9 of the 10 physical blocks. The longest-
    # free blocks 4..8 have no binding and the own region is full, so every
    # cached block stands in, the coldest first (3, 2, 1, 0); the one block
    # left unbound borrows a shared slot.
    assert m.allocate(2, tokens(5 * BS, 2)) == 0
    assert m.logical_table(2).tolist() == [4, 3, 2, 1, 0]
    assert m.phys_table(2, 0).tolist()[1:] == a_phys[::-1]  # re-used in place
    assert m.stats()["compress_evictions"] == 4
    removed = [e.block_hash for e in m.take_events() if (e.kind, e.role) == (KvEventKind.REMOVED, KvRole.COMPRESS)]
    assert sorted(removed) == sorted(h)
    # Past what evicting every cached block gives, the answer is no and nothing changes.
    assert m.can_allocate(tokens(2 * BS, 3)) == KvManager.NOT_NOW  # 2 compress + 2 SWA, 1 block left
    assert m.allocate(3, tokens(2 * BS, 3)) == KvManager.NOT_NOW
    assert m.stats()["compress_evictions"] == 4 and m.take_events() == []
    assert m.logical_table(2).tolist() == [4, 3, 2, 1, 0] and not m.has_sequence(3)
    assert m.stats()["free_logical_blocks"] == 5
    m.check_invariants()


@layouts
def test_a_one_chunk_prompt_is_hit_whole_when_the_pool_has_room(unified):
    """Room beyond every promise: the chunk's pages below its window are lent
    too, so a one-chunk prompt is hit like a chunked one (the chunking does
    not decide what is cached)."""
    m = manager(unified)
    t = tokens(300, 1)
    m.allocate(1, t)
    prefill(m, 1, t)
    assert m.stats()["whole_chunks"] == 1
    m.deallocate([1])
    assert m.can_allocate(t + tokens(300, 2)) == 2 * BS


@layouts
def test_h7_pages_a_window_reaches_into_are_written_whole_and_hit(unified):
    """No room beyond the promise: a one-chunk prefill writes its last window
    only, [172, 300) here. The model writes every position of every page the
    chunk holds, so block 1, which the window reaches into, is written whole
    and a hit ending at it is served; block 0's page was never written."""
    t = tokens(300, 1)
    m = tightest_swa_pool(unified, t)
    m.allocate(1, t)
    prefill(m, 1, t)
    assert m.stats()["whole_chunks"] == 0
    m.deallocate([1])
    assert m.can_allocate(t + [5]) == 2 * BS
    assert m.can_allocate(t[:BS] + [5]) == 0  # block 0's own trailing window is missing


def tightest_row_space(request, **overrides):
    """A row space of 32-token pages with the rows `request` needs and not one unit more."""
    for units in itertools.count(1):
        m, _ = pair("row_space", total_rows=3 * 40 + units * 32, **overrides)
        if m.can_allocate(request) >= 0:
            return m


def test_h7_a_partly_written_trailing_window_is_neither_published_nor_hit():
    """Pages of 32 tokens, smaller than the window: a one-chunk prefill with
    no room beyond the promise writes pages 5..9 ([160, 300)), but a hit at
    block 2 needs pages 4..7 (tail_pages 4) and one at block 1 pages 0..3.
    So no boundary can be served, and no block is published (no stored event
    names a block no later request could hit); chunked by blocks, every page
    is written and both full blocks are hit."""
    t = tokens(300, 1)
    m = tightest_row_space(t)
    assert m.quota_bounds()["tail_pages"] == 4
    m.allocate(1, t)
    prefill(m, 1, t)
    assert m.stats()["whole_chunks"] == 0
    assert m.take_events() == []
    m.deallocate([1])
    assert m.can_allocate(t + [5]) == 0
    m.allocate(2, t)
    prefill(m, 2, t, chunk=BS)
    assert compress_kinds(m.take_events()) == [KvEventKind.STORED] * 2
    m.deallocate([2])
    assert m.can_allocate(t + [5]) == 2 * BS


@layouts
def test_hj_chunked_prefill_frees_with_the_computed_length(unified):
    m = manager(unified)
    t = tokens(600, 1)
    m.allocate(1, t)
    m.ensure_for_tokens([1], [300])
    m.commit_prefill([1], [300])
    m.ensure_for_tokens([1], [300])
    swa = m.swa_table(1).tolist()
    # The second chunk's first token reads positions 173..299 (blocks 1 and 2):
    # freeing with the scheduled length 600 would have dropped them.
    assert swa[0] == -1 and swa[1] >= 0 and swa[2] >= 0 and swa[3] >= 0 and swa[4] >= 0
    m.commit_prefill([1], [300], [7])
    assert m.swa_table(1).tolist()[:3] == [-1, -1, -1]


def test_ho_stale_window_hit_refused():
    """No room beyond the promise: a one-chunk 512-token prompt writes page 3
    only. Its 4 blocks are published (a hit ending at block 4 could be
    served), so a later request matches 3 compress blocks, but their trailing
    window was never written: the gate refuses the stale hit."""
    t = tokens(512, 1)
    m = tightest_swa_pool(True, t)
    m.allocate(1, t)
    prefill(m, 1, t)
    assert compress_kinds(m.take_events()) == [KvEventKind.STORED] * 4
    m.deallocate([1])
    assert m.can_allocate(t) == 0
    m.allocate(2, t)
    st = m.stats()
    assert (st["compressed_hit_blocks"], st["prefix_hit_blocks"]) == (3, 0)
    prefill(m, 2, t, chunk=BS)  # each chunk is its own window: every page written
    m.deallocate([2])
    assert m.can_allocate(t) == 3 * BS


def test_a_boundary_whose_longer_swa_tail_was_not_written_is_not_published():
    """With 2 speculative tokens a hit needs the 2 pages before its boundary.
    A one-chunk prompt without room writes its last window, one page before
    each boundary at most: nothing is published, and nothing is hit."""
    t = tokens(512, 1)
    m = tightest_swa_pool(True, t, mtp_k=2)
    assert m.quota_bounds()["tail_pages"] == 2
    m.allocate(1, t)
    prefill(m, 1, t)
    assert m.take_events() == []
    m.deallocate([1])
    assert m.can_allocate(t) == 0
    m.allocate(2, t)
    prefill(m, 2, t, chunk=BS)
    m.deallocate([2])
    assert m.can_allocate(t) == 3 * BS


# --------------------------------------------------------------- bad inputs --
def started(unified=True):
    m = manager(unified, mtp_k=1)
    m.allocate(1, tokens(300, 1))          # prefilling
    m.allocate(2, tokens(200, 2))
    prefill(m, 2, tokens(200, 2))          # decoding
    return m


BAD_CALLS = [
    ("can_allocate", lambda o: o.can_allocate(torch.ones(2, 3, dtype=torch.int32)), "tokens"),
    ("can_allocate", lambda o: o.can_allocate(torch.ones(3, dtype=torch.float32)), "tokens"),
    ("can_allocate", lambda o: o.can_allocate(torch.tensor([1, -2], dtype=torch.int32)), "tokens"),
    ("can_allocate", lambda o: o.can_allocate(torch.tensor([2**40])), "tokens"),
    ("can_allocate", lambda o: o.can_allocate(torch.ones(3, dtype=torch.int32, device="meta")), "tokens"),
    ("allocate", lambda o: o.allocate(1, torch.ones(3, dtype=torch.int32)), "already allocated"),
    ("allocate", lambda o: o.allocate(5, torch.ones(0, dtype=torch.int32)), "at least one token"),
    ("allocate", lambda o: o.allocate(5, torch.ones(17 * BS, dtype=torch.int32)), "max_blocks_per_seq"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([1], dtype=torch.int32), torch.tensor([1])), "seq_ids"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([1]), torch.tensor([1, 2])), "same length"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([9]), torch.tensor([1])), "unknown sequence"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([1, 1]), torch.tensor([1, 1])), "twice"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([1]), torch.tensor([301])), "exceed"),
    ("ensure_for_tokens", lambda o: o.ensure_for_tokens(torch.tensor([1]), torch.tensor([-1])), "counts"),
    ("commit_prefill", lambda o: o.commit_prefill(torch.tensor([1]), torch.tensor([10]), torch.tensor([5])), "sampled"),
    ("commit_prefill", lambda o: o.commit_prefill(torch.tensor([1]), torch.tensor([10]), torch.tensor([-2])), "sampled"),
    ("commit_prefill", lambda o: o.commit_prefill(torch.tensor([1]), torch.tensor([10]), torch.tensor([1, 2])), "same length"),
    ("allocate", lambda o: o.allocate(-1, torch.ones(3, dtype=torch.int32)), "sequence ids must be >= 0"),
    ("commit_prefill", lambda o: o.commit_prefill(torch.tensor([1]), torch.tensor([10]), torch.tensor([-1])),
     "provisioned 0"),
    ("can_append", lambda o: o.can_append(torch.tensor([2]), torch.tensor([3])), "num_new_tokens"),
    ("can_append", lambda o: o.can_append(torch.tensor([2]), torch.tensor([0])), "num_new_tokens"),
    ("can_append", lambda o: o.can_append(torch.tensor([2]), torch.tensor([1, 1])), "same length"),
    ("can_append", lambda o: o.can_append(torch.tensor([2]), torch.tensor([1], dtype=torch.int32)), "num_new_tokens"),
    ("can_append", lambda o: o.can_append(torch.tensor([2, 1]), torch.tensor([1, 1])), "not decoding"),
    ("can_append", lambda o: o.can_append(torch.tensor([[2]]), torch.tensor([1])), "seq_ids"),
    ("append", lambda o: o.append(torch.tensor([2]), 1), "num_new_tokens"),  # one count per sequence, a tensor
    ("append", lambda o: o.append(torch.tensor([2, 2]), torch.tensor([1, 1])), "twice"),
    ("append", lambda o: o.append(torch.tensor([2, 9]), torch.tensor([1, 1])), "unknown sequence"),
    ("commit_decode", lambda o: o.commit_decode(torch.tensor([2]), torch.tensor([1]), torch.tensor([1, 2])), r"sum\(counts\)"),
    ("commit_decode", lambda o: o.commit_decode(torch.tensor([1]), torch.tensor([1]), torch.tensor([1])), "not decoding"),
    ("deallocate", lambda o: o.deallocate(torch.tensor([2, 9])), "unknown sequence"),
    ("deallocate", lambda o: o.deallocate(torch.tensor([2, 2])), "twice"),
    ("stage", lambda o: o.stage(torch.tensor([2, 9])), "unknown sequence"),
    ("stage", lambda o: o.stage(torch.arange(9)), "max_num_seqs"),
    ("upload", lambda o: o.upload(9), "rows"),
    ("phys_table", lambda o: o.phys_table(2, 2), "compress type"),
]


@pytest.mark.parametrize("call", BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_inputs_raise_naming_the_problem_and_change_nothing(call):
    _, fn, words = call
    m = started()
    m.stage([1, 2])
    before, host = state(m), m.host_tables.clone()
    with pytest.raises((ValueError, RuntimeError), match=words):
        fn(m.torch_object)
    assert state(m) == before
    assert torch.equal(m.host_tables, host)
    m.check_invariants()


def test_counts_near_int64_max_are_refused_not_wrapped():
    """Regression: num_computed + a count near INT64_MAX wrapped, passed the
    check and corrupted the sequence; a sum of decode counts wrapped too."""
    m = started()
    m.ensure_for_tokens([1], [100])
    m.commit_prefill([1], [100])
    m.append([2], 2)
    before = state(m)
    for call in (lambda: m.ensure_for_tokens([1], [2**63 - 1]), lambda: m.commit_prefill([1], [2**63 - 1]),
                 lambda: m.commit_prefill([1], [2**63 - 1], [5])):
        with pytest.raises(ValueError, match="exceed"):
            call()
    with pytest.raises(ValueError, match=r"sum\(counts\)"):
        m.commit_decode([2, 2], [2**62, 2**62], [])
    assert state(m) == before
    m.check_invariants()


def test_wrapper_token_lists_out_of_int32_are_refused_naming_tokens():
    """Regression: the wrapper's int32 conversion failed first, with an overflow error naming nothing."""
    m = started()
    before = state(m)
    with pytest.raises(ValueError, match=r"tokens values must be in \[0, 2\^31 - 1\]"):
        m.allocate(5, [1, 2**40])
    with pytest.raises(ValueError, match="tokens values"):
        m.can_allocate([2**31])
    assert state(m) == before


def test_bad_constructor_options():
    with pytest.raises(TypeError, match="unknown option.*bogus"):
        KvManager(num_logical_blocks=4, num_swa_blocks=4, bogus=1)
    with pytest.raises(ValueError, match="ServeConfig state has 1 trailing values"):  # the torch class reads records
        torch.classes.ukv.KvManager(ukv_torch.ServeConfig().encode() + [0],
                                    ukv_torch.PoolSizes(num_logical_blocks=4, num_swa_blocks=4).encode())
    with pytest.raises(ValueError, match="window"):
        manager(window=0)
    with pytest.raises(ValueError, match="compress_ks"):
        manager(compress_ks=[48])


# ------------------------------------------------------ pickling, determinism --
def workload(m, seed, steps=60, first_id=100):
    """A deterministic mixed workload; returns everything observable after each call."""
    rng = random.Random(seed)
    trace, next_id, live = [], first_id, []
    system = tokens(2 * BS, 99)
    for _ in range(steps):
        toks = system + tokens(rng.randrange(1, 300), rng.randrange(1 << 30))
        cached = m.allocate(next_id, toks)
        trace.append(("allocate", cached))
        if cached >= 0:
            prefill(m, next_id, toks, chunk=rng.choice([None, 100, BS]))
            live.append(next_id)
            next_id += 1
        served = m.can_append(live)
        trace.append(("can_append", served))
        if served < len(live):
            m.deallocate(live[served:])
            live = live[:served]
        if live:
            m.append(live)
            m.commit_decode(live, [1] * len(live), [rng.randrange(1, 1000) for _ in live])
        if live and rng.random() < 0.3:
            m.deallocate([live.pop(0)])
        trace.append(("tables", [(m.logical_table(s).tolist(), m.swa_table(s).tolist(),
                                  m.phys_table(s, 0).tolist(), m.phys_table(s, 1).tolist()) for s in live]))
        trace.append(("events", m.take_events()))
        trace.append(("stats", m.stats()))
    return trace


@layouts
def test_determinism_same_calls_same_tables_and_events(unified):
    a = workload(manager(unified, num_logical_blocks=24), 5)
    b = workload(manager(unified, num_logical_blocks=24), 5)
    assert a == b
    assert any(kind == "allocate" and v > 0 for kind, v in a)  # prefix hits happened


@pytest.mark.parametrize("copy_with", ["pickle", "deepcopy"])
@layouts
def test_pickle_round_trip_continues_identically(unified, copy_with):
    import copy
    import pickle
    m = manager(unified, num_logical_blocks=24)
    workload(m, 3, steps=25)
    m2 = pickle.loads(pickle.dumps(m)) if copy_with == "pickle" else copy.deepcopy(m)
    assert state(m2) == state(m)
    m2.check_invariants()
    assert workload(m, 4, steps=25, first_id=1000) == workload(m2, 4, steps=25, first_id=1000)


# ------------------------------------------------------------- events, stats --
def test_kv_events_chain_parents_and_report_removal_and_clearing():
    from ukv_torch.testing.kv_manager_model import block_hash
    m = manager(True, num_logical_blocks=4, num_swa_blocks=8)
    t = tokens(3 * BS, 1)
    m.allocate(1, t + [5])
    prefill(m, 1, t + [5], chunk=BS)
    h = []
    for i in range(3):
        h.append(block_hash(t[i * BS:(i + 1) * BS], h[-1] if h else None))
    assert ukv_torch.block_hashes(t + [5], BS) == h  # what a router computes from the tokens
    events = m.take_events()
    assert [e.seq_no for e in events] == list(range(len(events)))
    compress = [e for e in events if e.role == KvRole.COMPRESS]
    assert [tuple(e) for e in compress] == [
        (KvEventKind.STORED, e.seq_no, KvRole.COMPRESS, h[i], h[i - 1] if i else None, tuple(t[i * BS:(i + 1) * BS]),
         BS, None) for i, e in enumerate(compress)]
    # An SWA page (one per block here) is keyed by its block's hash and names it as its parent.
    for e in events:
        if e.role == KvRole.SWA:
            i = h.index(e.parent_hash)
            assert (e.kind, e.block_hash, e.token_ids) == (KvEventKind.STORED, h[i], tuple(t[i * BS:(i + 1) * BS]))
    m.deallocate([1])  # blocks freed last-first: the free list is [3, 2, 1, 0]
    m.allocate(2, tokens(2 * BS, 2))  # a miss pops blocks 3 and 2: block 2's hash is evicted
    events = m.take_events()
    assert [(e.kind, e.block_hash) for e in events if e.role == KvRole.COMPRESS] == [(KvEventKind.REMOVED, h[2])]
    m.clear_cache()
    assert m.take_events() == [(KvEventKind.ALL_CLEARED, events[-1].seq_no + 1, None, None, None, None, None, None)]
    m.deallocate([2])
    assert m.can_allocate(t + [5]) == 0  # block 0 is cached no more


def test_stats_count_admissions_hits_and_refusals():
    m = manager(True, num_logical_blocks=8, num_swa_blocks=8)
    t = tokens(3 * BS + 10, 1)
    m.allocate(1, t)
    prefill(m, 1, t, chunk=BS)
    m.deallocate([1])
    assert m.allocate(2, t) == 3 * BS
    assert m.allocate(3, tokens(8 * BS, 3)) == KvManager.NOT_NOW  # 8 more blocks do not fit beside sequence 2
    st = m.stats()
    assert (st["admissions"], st["admission_refusals"]) == (2, 1)
    assert (st["prefix_query_blocks"], st["compressed_hit_blocks"], st["prefix_hit_blocks"]) == (8, 3, 3)
    assert st["free_logical_blocks"] == 4 and st["num_sequences"] == 1
    assert st["swa_reserved"] == 4 and st["held_swa_slots"] == 1  # the claimed window tail


# ----------------------------------------------------------------- threads --
def serve(m, worker, errors, requests=15):
    """One serving thread's run: admit, prefill in chunks, decode, finish; failures go to errors."""
    try:
        rng = random.Random(worker)
        for r in range(requests):
            sid = worker * 1000 + r
            toks = tokens(rng.randrange(50, 400), worker * 100 + r)
            assert m.allocate(sid, toks) >= 0  # 4 live sequences at most: always room
            prefill(m, sid, toks, chunk=100)
            for _ in range(rng.randrange(1, 20)):
                if m.can_append([sid]) == 1:
                    m.append([sid])
                    m.commit_decode([sid], [1], [3])
            if worker == 0:
                m.stage([sid])
            m.deallocate([sid])
    except Exception as exc:  # reported by the test, with the thread's failure
        errors.append(exc)


def run_threads(targets):
    import threading
    threads = [threading.Thread(target=target) for target in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_threads_on_one_manager_keep_it_consistent():
    m = manager(True, num_logical_blocks=64, num_swa_blocks=48, max_num_seqs=16)
    errors = []
    run_threads([lambda w=w: serve(m, w, errors) for w in range(4)])
    assert errors == []
    m.check_invariants()
    st = m.stats()
    assert (st["admissions"], st["num_sequences"], st["free_logical_blocks"], st["held_swa_slots"]) == (60, 0, 64, 0)


def test_observers_and_cache_clearing_beside_serving_threads_see_whole_states():
    """Three serving threads and one that reads, pickles, clears the cache and
    restages meanwhile: every snapshot it took is a consistent manager state
    (each call holds the manager's lock), and the run ends clean."""
    import pickle
    import sys
    m = manager(True, num_logical_blocks=64, num_swa_blocks=48, max_num_seqs=16)
    errors, snapshots, done = [], [], []

    def observe():
        rng = random.Random(9)
        try:
            while not done:
                m.stats(), m.take_events(), m.can_allocate(tokens(rng.randrange(1, 300), 5))
                m.check_invariants()
                snapshots.append(pickle.dumps(m))
                if rng.random() < 0.3:
                    m.clear_cache()
                m.torch_object.invalidate_staging()
        except Exception as exc:  # reported below
            errors.append(exc)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, inside the Python glue of every call
    try:
        workers = [lambda w=w: serve(m, w, errors) for w in range(3)]
        run_threads([lambda: (run_threads(workers), done.append(True)), observe])
    finally:
        sys.setswitchinterval(previous)
    assert errors == [] and len(snapshots) > 10
    for blob in snapshots:
        pickle.loads(blob).check_invariants()
    m.clear_cache()
    m.check_invariants()
    st = m.stats()
    assert (st["admissions"], st["num_sequences"], st["free_logical_blocks"], st["held_swa_slots"]) == (45, 0, 64, 0)


# ----------------------------------------------------------------- staging --
def expected_rows(m, ids, width):
    rows = []
    for sid in ids:
        logical, swa = m.logical_table(sid).tolist(), m.swa_table(sid).tolist()
        pad = [0] * (width - len(logical))
        rows.append([logical + pad, list(swa) + pad] +
                    [m.phys_table(sid, t).tolist() + pad for t in range(m.num_types)])
    return torch.tensor(rows, dtype=torch.int32)


@layouts
def test_staging_across_many_steps_with_changing_tables(unified):
    width = 16
    m = manager(unified, num_logical_blocks=40, num_swa_blocks=32, max_num_seqs=6, max_blocks_per_seq=width)
    rng = random.Random(3)
    live, next_id = [], 0
    for step in range(200):
        if len(live) < 5 and rng.random() < 0.5:
            toks = tokens(rng.randrange(1, 600), step)
            if m.allocate(next_id, toks) >= 0:
                prefill(m, next_id, toks, chunk=rng.choice([None, 100]))
                live.append(next_id)
            next_id += 1
        if live:
            served = m.can_append(live)
            m.deallocate(live[served:])
            live = live[:served]
            m.append(live)
            m.commit_decode(live, [1] * len(live), [1] * len(live))
            if rng.random() < 0.1 or any(m.num_computed(s) > 1800 for s in live):
                m.deallocate([live.pop(rng.randrange(len(live)))])
        rng.shuffle(live)  # rows change owner between steps
        batch = live[:rng.randrange(0, len(live) + 1)]
        if rng.random() < 0.05:
            m.torch_object.invalidate_staging()
        m.stage(batch)
        m.upload(len(batch))  # no device: the tables are the host buffer
        if batch:
            assert torch.equal(m.tables[:len(batch)], expected_rows(m, batch, width)), step
    assert next_id > 20


def test_sparse_checkpoints_pin_segment_ends_and_the_prompt_tail_not_every_decode_block():
    # retention every 4 blocks, window 128 (tail 1): checkpoints are blocks i % 4 == 3 and the
    # prompt's last full block; decode blocks are pinned only by the segment rule.
    m = KvManager(num_logical_blocks=64, num_swa_blocks=64, full_retain=True, retention_interval=4 * 128,
                  checkpoint_frac=0.5, max_num_seqs=2, max_blocks_per_seq=32)
    m.allocate(0, list(range(1, 257)))
    m.ensure_for_tokens([0], [256])
    m.commit_prefill([0], [256], [7])
    for _ in range(1280):
        m.append([0])
        m.commit_decode([0], [1], [9])
    m.deallocate([0])
    published = m.num_computed(0) if m.has_sequence(0) else (256 + 1280) // 128
    expected = {i for i in range(published) if i % 4 == 3 or i == 256 // 128 - 1}
    assert m.stats()["held_swa_slots"] == len(expected) == 4
    m.check_invariants()
