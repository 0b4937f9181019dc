"""Prefix hits do not depend on how an engine cuts its prefill chunks, and a
"stored" event names only a block a later request can hit. On every layout,
against the pure-Python model and against what a hit must be."""
import pytest

from support.manager_steps import BS, LAYOUTS, pair, prefill, tokens
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


def tightest(layout, request):
    """The layout's pools with room for `request` and its promise and nothing beyond it."""
    for units in range(1, 64):
        pools = dict(total_rows=5 * 40 + units * 32) if layout == "row_space" else dict(num_swa_blocks=units)
        m, model = pair(layout, **pools)
        if m.can_allocate(request) >= 0:
            return m, model
    raise AssertionError("no pool admits the request")


@layouts
@pytest.mark.parametrize("room", ["roomy", "tight"])
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
    every full block would, names blocks no request can hit)."""
    t = tokens(600, 1)
    m, model = pair(layout, **ROOMY[layout]) if room == "roomy" else tightest(layout, t)
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
