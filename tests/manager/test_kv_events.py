"""Cache salts and KV events on every layout.

A salt isolates a request's prefix cache: the same prompt under two salts
never hits across, while it hits within one salt (and None and 0 are the same
no-salt). KV events are what a cache-aware router replays: an index rebuilt
only from them (support.kv_event_index), keying blocks with
ukv_torch.block_hashes / swa_page_hashes from tokens and salt, predicts every
admission's cached prefix exactly through a long randomized workload, a
pickle round trip included; the sequence numbers never restart.
"""
import collections
import pickle

import pytest

import ukv_torch
from support.manager_steps import BS, LAYOUTS, pair, prefill, state, tokens
from support.routed_serving import RoutedServing
from ukv_torch import KvEventKind, KvRole

layouts = pytest.mark.parametrize("layout", sorted(LAYOUTS))
ROOMY = {"static": dict(num_logical_blocks=64, num_swa_blocks=64),
         "upstream": dict(num_logical_blocks=64, num_swa_blocks=64),
         "elastic": dict(num_logical_blocks=64, num_swa_blocks=64),
         "row_space": dict(total_rows=64 * 40 + 256 * 32)}


def serve(m, sid, toks, salt):
    """Admit, prefill by blocks (every page written) and finish a request; its cached prefix."""
    cached = m.allocate(sid, toks, salt=salt)
    prefill(m, sid, toks, chunk=BS)
    m.deallocate([sid])
    return cached


@layouts
def test_a_prompt_hits_only_under_its_own_salt(layout):
    t = tokens(3 * BS + 5, 1)
    m, model = pair(layout, **ROOMY[layout])
    for mgr in (m, model):
        assert serve(mgr, 1, t, b"tenant-a") == 0
        assert serve(mgr, 2, t, 7) == 0                # another tenant: no block shared
        assert serve(mgr, 3, t, None) == 0             # unsalted requests are a tenant of their own
        assert serve(mgr, 4, t, b"tenant-a") == 3 * BS  # within a salt: the whole cached prefix
        assert serve(mgr, 5, t, 0) == 3 * BS            # 0 is no salt
        assert mgr.can_allocate(t, salt=ukv_torch.cache_salt(b"tenant-a")) == 3 * BS  # bytes stand for their value
        assert mgr.can_allocate(t, salt=8) == 0
    events = m.take_events()
    assert events == model.take_events()
    stored = collections.Counter(e.salt for e in events if e.kind == KvEventKind.STORED and e.role == KvRole.COMPRESS)
    assert stored == {ukv_torch.cache_salt(b"tenant-a"): 3, 7: 3, None: 3}


@layouts
def test_a_pickled_manager_keeps_salts_and_event_numbers(layout):
    """Pickled mid-prefill with events pending: the restored manager hands
    them over, its live salted sequence publishes its later blocks under its
    salt, the cache hits within each salt and not across, and the event
    numbers go on from where they were."""
    t = tokens(4 * BS + 5, 2)
    t2 = t[:BS] + tokens(3 * BS, 3)  # shares block 0 with t
    m, _ = pair(layout, **ROOMY[layout])
    serve(m, 1, t, 11)
    m.allocate(2, t2, salt=b"b")
    before = m.take_events()
    m.ensure_for_tokens([2], [2 * BS])
    m.commit_prefill([2], [2 * BS])
    m2 = pickle.loads(pickle.dumps(m))
    assert state(m2) == state(m)
    pending = m.take_events()
    assert pending and m2.take_events() == pending
    prefill(m2, 2, t2, chunk=BS)
    after = m2.take_events()
    assert {e.salt for e in pending + after if e.kind == KvEventKind.STORED} == {ukv_torch.cache_salt(b"b")}
    assert [e.seq_no for e in before + pending + after] == list(range(len(before + pending + after)))
    m2.deallocate([2])
    assert m2.can_allocate(t, salt=11) == 4 * BS
    assert m2.can_allocate(t, salt=None) == 0
    assert m2.can_allocate(t2 + [1], salt=b"b") == 4 * BS
    assert m2.can_allocate(t2 + [1], salt=11) == BS  # tenant 11 cached t's block 0 only


@pytest.mark.parametrize("salt,error", [("tenant", TypeError), (1.5, TypeError), (True, TypeError),
                                        (-1, ValueError), (2**64, ValueError)])
def test_a_bad_salt_is_refused_naming_it(salt, error):
    m, _ = pair("upstream")
    before = state(m)
    with pytest.raises(error, match="salt"):
        m.allocate(1, tokens(BS, 1), salt=salt)
    with pytest.raises(error, match="salt"):
        m.can_allocate(tokens(BS, 1), salt=salt)
    with pytest.raises(error, match="salt"):
        ukv_torch.block_hashes(tokens(BS, 1), BS, salt)
    assert state(m) == before and not m.has_sequence(1)


def test_block_hashes_refuse_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="block_size"):
        ukv_torch.block_hashes([1, 2], 0)
    with pytest.raises(ValueError, match="tokens"):
        ukv_torch.block_hashes([-1, 2], 2)
    with pytest.raises(ValueError, match="pages_per_block"):
        ukv_torch.swa_page_hashes([1], 0)
    assert ukv_torch.block_hashes([1, 2, 3], 2) == ukv_torch.block_hashes([1, 2], 2)  # a partial block has none
    assert ukv_torch.swa_page_hashes([5, 6], 1) == [5, 6]


@layouts
@pytest.mark.parametrize("seed", range(3))
def test_a_router_replaying_the_events_predicts_every_hit(layout, seed):
    m, _ = pair(layout)
    run = RoutedServing(m, seed)
    for step in range(400):
        run.step()
        if step == 200:  # a restored manager goes on with the same events and numbers
            run.m = pickle.loads(pickle.dumps(run.m))
    m = run.m
    m.check_invariants()
    assert run.hits["hit"] > 10 and run.hits["miss"] > 10, run.hits
    if layout == "row_space":
        st = m.stats()
        assert st["envelope_evictions"] + st["swa_unit_evictions"] > 0  # the row space evicted under pressure
