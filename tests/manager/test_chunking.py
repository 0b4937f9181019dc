"""Prefix hits do not depend on how an engine cuts its prefill chunks, and a
"stored" event names only a block a later request can hit. On every layout,
against the pure-Python model and against what a hit must be."""
import pytest

from support.manager_steps import BS, LAYOUTS, pair, prefill, state, tokens
from ukv_torch import KvEventKind, KvRole
from ukv_torch.testing.kv_manager_model import block_hash

layouts = pytest.mark.parametrize("layout", sorted(LAYOUTS))
# Pools with room beyond every promise (and no page reused before the queries).
ROOMY = {"static": dict(num_logical_blocks=64, num_swa_blocks=64),
         "upstream": dict(num_logical_blocks=64, num_swa_blocks=64),
         "elastic": dict(num_logical_blocks=64, num_swa_blocks=64),
         "row_space": dict(total_rows=64 * 40 + 256 * 32)}
BUDGET = 300  # tokens per step, not a multiple of the block size


def prefill_packed(m, ids, prompts, budget):
    """Engine steps that pack the prefilling sequences' chunks into a token budget,
    in order: a sequence gets what is left of the budget, the next the rest."""
    while any(m.num_computed(sid) < len(p) for sid, p in zip(ids, prompts)):
        batch, counts, sampled, left = [], [], [], budget
        for sid, p in zip(ids, prompts):
            rest = len(p) - m.num_computed(sid)
            if rest == 0 or left == 0:
                continue
            n = min(rest, left)
            batch.append(sid), counts.append(n), sampled.append(7 if n == rest else -1)
            left -= n
        m.ensure_for_tokens(batch, counts)
        m.commit_prefill(batch, counts, sampled)


def serve(m, prompts, chunking):
    """Admit every prompt, prefill all of them the chunking's way, free them."""
    ids = list(range(len(prompts)))
    for sid, p in zip(ids, prompts):
        assert m.allocate(sid, p) >= 0
    if chunking == "packed":
        prefill_packed(m, ids, prompts, BUDGET)
    else:
        for sid, p in zip(ids, prompts):
            prefill(m, sid, p, chunk=2 * BS if chunking == "blocks" else None)
    m.deallocate(ids)


def probes(prompts):
    """Later requests: a prefix of each prompt (at, below and between block
    boundaries, and whole) and one more token."""
    out = []
    for p in prompts:
        for cut in sorted({BS, 2 * BS + 50, 3 * BS, len(p) // BS * BS, len(p)}):
            out.append(p[:cut] + [5])
    return out


@layouts
def test_three_chunkings_give_the_same_prefix_hits_when_the_pools_have_room(layout):
    system = tokens(2 * BS + 50, 1)
    prompts = [system + tokens(450, 2), system + tokens(200, 3), tokens(3 * BS + 70, 4), system + tokens(700, 5)]
    queries = probes(prompts)
    # With room every full block of a computed prompt is hit: a probe's
    # shared prefix, but never its last block.
    expected = [min(shared_blocks(q, prompts), (len(q) - 1) // BS) * BS for q in queries]
    seen = {}
    for chunking in ("blocks", "packed", "whole"):
        m, model = pair(layout, **ROOMY[layout])
        serve(m, prompts, chunking)
        serve(model, prompts, chunking)
        seen[chunking] = [m.can_allocate(q) for q in queries]
        assert seen[chunking] == [model.can_allocate(q) for q in queries], chunking
        if chunking != "blocks":
            assert m.stats()["whole_chunks"] > 0  # pages below a window were lent: that is the point
    assert seen["blocks"] == seen["packed"] == seen["whole"] == expected


def shared_blocks(query, prompts):
    """Full blocks of the longest prefix the query shares with a computed prompt."""
    best = 0
    for p in prompts:
        blocks = 0
        while (blocks + 1) * BS <= len(p) and query[:(blocks + 1) * BS] == p[:(blocks + 1) * BS]:
            blocks += 1
        best = max(best, blocks)
    return best


def stored_chain(events, t):
    """The compress blocks the stored events name, checked to be t's blocks 0.. in chain order."""
    stored = [e for e in events if (e.kind, e.role) == (KvEventKind.STORED, KvRole.COMPRESS)]
    parent = None
    for i, e in enumerate(stored):
        want = block_hash(t[i * BS:(i + 1) * BS], parent)
        assert (e.block_hash, e.parent_hash) == (want, parent)
        parent = want
    return len(stored)


def tightest(layout, request, whole_chunks=False, **overrides):
    """The layout's pools with room for `request` and its promise (and, with
    whole_chunks, the whole-chunk reserve) and nothing beyond it."""
    for units in range(1, 64):
        pools = dict(total_rows=5 * 40 + units * 32) if layout == "row_space" else dict(num_swa_blocks=units)
        m, model = pair(layout, **pools, **overrides)
        if whole_chunks:
            if m.quota_bounds()["whole_chunk_pages"] > units:
                continue
            m.set_whole_chunks(True)
            model.set_whole_chunks(True)
        if m.can_allocate(request) >= 0:
            return m, model
    raise AssertionError("no pool admits the request")


@layouts
@pytest.mark.parametrize("room", ["roomy", "tight", "tight-whole-chunks"])
def test_a_300_plus_300_prefill_stores_only_blocks_a_later_request_can_hit(layout, room):
    """A 600-token prompt in two 300-token chunks. Without room (tight), a
    chunk's SWA is written from its last window only, so some block
    boundaries have no trailing window: none of those may be announced. Every
    stored block is hit by the request that shares the stored prefix, no
    unstored block is hit by any, and the model publishes the same.

    Slot layouts, tight: the second chunk reaches back into page 2, which the
    first chunk's window holds, so it is written from its start and all 4
    blocks are stored. Row space (32-token pages, a hit needs the 4 pages
    before its boundary), tight: the first chunk writes [160, 300) and the
    second [448, 600), so no boundary of a full block has its trailing
    window: nothing is stored (announcing blocks 2 and 3, as a publisher of
    every full block would, names blocks no request can hit).

    With whole chunks on (a KV tier's mode; steps of at most 300 tokens) on
    the tightest pools that admit the prompt then, both chunks get the pages
    of all their positions from the reserve admission kept apart: every
    boundary has its trailing window, all 4 blocks are stored and hit."""
    t = tokens(600, 1)
    if room == "roomy":
        m, model = pair(layout, **ROOMY[layout])
    else:
        m, model = tightest(layout, t, whole_chunks=room == "tight-whole-chunks", max_num_batched_tokens=300)
    for mgr in (m, model):
        assert mgr.allocate(1, t) == 0
        prefill(mgr, 1, t, chunk=300)
        mgr.deallocate([1])
    events = m.take_events()
    assert events == model.take_events()
    stored = stored_chain(events, t)
    assert stored == (0 if (layout, room) == ("row_space", "tight") else 4)
    if stored:
        assert m.can_allocate(t[:stored * BS] + [5]) == stored * BS
    for blocks in range(1, 5):
        assert m.can_allocate(t[:blocks * BS] + [5]) <= min(blocks, stored) * BS
    if room == "tight-whole-chunks":
        assert m.stats()["whole_chunks"] == model.stat["whole_chunks"] == 2
        assert [m.can_allocate(t[:blocks * BS] + [5]) for blocks in range(1, 5)] == [BS, 2 * BS, 3 * BS, 4 * BS]


@layouts
def test_whole_chunks_keep_their_reserve_apart_and_refuse_what_leaves_no_room_for_it(layout):
    """Turning whole chunks on takes the reserve from what admission may
    promise: on the tightest pools of a request without the mode it is refused
    once the request is live (RuntimeError, nothing changed), and on a fresh
    manager of that size the request then never fits. A non-bool is a
    TypeError naming ``on``."""
    t = tokens(600, 1)
    m, model = tightest(layout, t, max_num_batched_tokens=300)
    before = state(m)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="on must be a bool"):
            m.set_whole_chunks(bad)
    assert m.allocate(1, t) == model.allocate(1, t) == 0
    live = state(m)
    with pytest.raises(RuntimeError, match="no room for the .* SWA pages whole chunks keep apart"):
        m.set_whole_chunks(True)
    assert state(m) == live and not m.whole_chunks
    m.deallocate([1])
    m.set_whole_chunks(True)
    model.deallocate([1])
    model.set_whole_chunks(True)
    assert m.whole_chunks and state(m) != before
    assert m.stats()["swa_reserved"] == model.stats()["swa_reserved"] == m.quota_bounds()["whole_chunk_pages"]
    assert m.can_allocate(t) == model.can_allocate(t) == m.NEVER_FITS
    m.set_whole_chunks(False)
    assert m.stats()["swa_reserved"] == 0 and m.can_allocate(t) == 0


@layouts
def test_a_pickled_manager_keeps_whole_chunks_and_the_pages_a_chunk_holds(layout):
    """Mid-chunk (ensured, not committed) the pages below the window are held:
    the state carries the mode and them, and the copy continues as the original."""
    import pickle

    t = tokens(600, 1)
    m, _ = tightest(layout, t, whole_chunks=True, max_num_batched_tokens=300)
    assert m.allocate(1, t) == 0
    m.ensure_for_tokens([1], [300])
    m2 = pickle.loads(pickle.dumps(m))
    m2.check_invariants()
    assert m2.whole_chunks and m2.stats() == m.stats()
    for mgr in (m, m2):
        mgr.commit_prefill([1], [300], [-1])
        prefill(mgr, 1, t, chunk=300)
    assert state(m2) == state(m)
