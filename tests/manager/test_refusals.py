"""Admission refusals say whether to wait: NOT_NOW (-1) while live sequences
hold what a request needs or max_num_seqs sequences are live, NEVER_FITS (-2)
when it would not fit with nothing live. Each case runs on every layout,
against the pure-Python model and the rule written out from the pool sizes,
and a refusal changes nothing but the refusal count."""
import pytest

from support.manager_steps import BS, ENVELOPE_ROWS, LAYOUTS, UNIT_ROWS, pair, prefill, state, tokens
from support.row_space_sync import follow_evictions
from ukv_torch import KvManager
from ukv_torch.testing.allocator_model import ceil_div
from ukv_torch.testing.kv_manager_model import PLACEMENT_STATS

layouts = pytest.mark.parametrize("layout", sorted(LAYOUTS))


def fits_empty_pools(m, n):
    """The never-fits rule from the pool sizes: the request's blocks, and its SWA
    quota in pages, within what the pools hold in all. (The unified slot
    layouts: SWA pages live in the shared slots only.)"""
    nb, pools, q = ceil_div(n, BS), m.pools, m.quota_bounds()
    pages = min(q["prefill_quota_bound"], nb * BS // m.config.swa_page)
    if nb > pools.num_logical_blocks:
        return False
    if m.config.layout == "row_space":
        return nb * pools.envelope_rows + pages * pools.swa_unit_rows <= pools.total_rows
    return pages <= pools.num_swa_blocks


def refused(m, model, n, seed, expected):
    """A request of n tokens gets `expected` from can_allocate and allocate, as
    the model says, and the refusal changes nothing but its count."""
    t = tokens(n, seed)
    before, refusals = state(m), m.stats()["admission_refusals"]
    assert m.can_allocate(t) == model.can_allocate(t) == expected
    assert state(m) == before
    assert m.allocate(99, t) == model.allocate(99, t) == expected
    assert not m.has_sequence(99) and m.stats()["admission_refusals"] == refusals + 1
    assert {k: v for k, v in m.stats().items() if k not in PLACEMENT_STATS} == model.stats()
    m.check_invariants()


def rows_for(blocks, pages):
    return blocks * ENVELOPE_ROWS + pages * UNIT_ROWS


@layouts
def test_more_blocks_than_the_pool_never_fits(layout):
    m, model = pair(layout, max_blocks_per_seq=128)
    n = (m.pools.num_logical_blocks + 1) * BS
    assert not fits_empty_pools(m, n)
    refused(m, model, n, 1, KvManager.NEVER_FITS)


# Pools that hold 3 blocks with their SWA quota but not 4: 3 SWA blocks in
# the slot layouts (a 4-block prompt's quota is 4 pages); in the row space of
# 32-token pages, 4 blocks need 10 pages (4 * 40 + 10 * 32 = 480 rows > 448).
SMALL_SWA = {"static": dict(num_swa_blocks=3), "upstream": dict(num_swa_blocks=3),
             "elastic": dict(num_swa_blocks=3), "row_space": dict(total_rows=rows_for(4, 9))}


@layouts
def test_a_request_too_big_for_the_empty_swa_pool_or_rows_never_fits(layout):
    m, model = pair(layout, **SMALL_SWA[layout])
    assert 4 <= m.pools.num_logical_blocks
    assert not fits_empty_pools(m, 4 * BS) and fits_empty_pools(m, 3 * BS)
    refused(m, model, 4 * BS, 1, KvManager.NEVER_FITS)
    t = tokens(3 * BS, 2)
    assert m.allocate(1, t) == model.allocate(1, t) == 0


# Room for one 16-block prompt with its SWA quota and half of another.
HALF_ROOM = {"static": dict(num_logical_blocks=24), "upstream": dict(num_logical_blocks=24),
             "elastic": dict(num_logical_blocks=24), "row_space": dict(total_rows=rows_for(24, 15))}


@layouts
def test_a_request_that_fits_once_others_finish_is_refused_not_now(layout):
    m, model = pair(layout, **HALF_ROOM[layout])
    a = tokens(16 * BS, 1)
    for mgr in (m, model):
        assert mgr.allocate(1, a) == 0
    prefill(m, 1, a, chunk=4 * BS)
    prefill(model, 1, a, chunk=4 * BS)
    follow_evictions(model, m)  # the chunks' envelopes evict cached SWA units the model does not place
    assert fits_empty_pools(m, 16 * BS)
    refused(m, model, 16 * BS, 2, KvManager.NOT_NOW)
    for mgr in (m, model):
        mgr.deallocate([1])
    t = tokens(16 * BS, 2)
    assert m.allocate(2, t) == model.allocate(2, t) == 0


@layouts
def test_max_num_seqs_bounds_live_sequences_with_not_now(layout):
    m, model = pair(layout, max_num_seqs=2)
    for sid in (1, 2):
        t = tokens(50, sid)
        assert m.allocate(sid, t) == model.allocate(sid, t) == 0
    assert m.stats()["free_logical_blocks"] >= 30  # the pools have room: only the live limit refuses
    refused(m, model, 50, 3, KvManager.NOT_NOW)
    for mgr in (m, model):
        mgr.deallocate([1])
    t = tokens(50, 3)
    assert m.allocate(3, t) == model.allocate(3, t) == 0


@layouts
@pytest.mark.parametrize("seq_id", [-1, -(2**63)])
def test_negative_sequence_ids_are_refused_naming_them(layout, seq_id):
    m, _ = pair(layout)
    m.allocate(1, tokens(50, 1))
    before = state(m)
    with pytest.raises(ValueError, match=f"sequence ids must be >= 0.*got {seq_id}"):
        m.allocate(seq_id, tokens(50, 2))
    assert state(m) == before
    m.check_invariants()
