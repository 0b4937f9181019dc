"""The counts of the per-step calls: append and can_append take one count per
sequence (1 + its draft tokens), and commit_prefill commits exactly what
ensure_for_tokens provisioned for the chunk (or 0); anything else is refused
with the manager unchanged. On every layout."""
import pytest
import torch

from support.manager_steps import BS, LAYOUTS, pair, prefill, state, tokens
from ukv_torch.testing.kv_manager_model import PLACEMENT_STATS

layouts = pytest.mark.parametrize("layout", sorted(LAYOUTS))


def snapshot(m):
    return state(m), m.stats(), m.host_tables.clone()


def unchanged(m, before):
    after = snapshot(m)
    return after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def same_as_model(m, model, ids):
    assert {k: v for k, v in m.stats().items() if k not in PLACEMENT_STATS} == model.stats()
    assert m.take_events() == model.take_events()
    for sid in ids:
        assert m.logical_table(sid).tolist() == model.logical_table(sid)
        assert m.swa_table(sid).tolist() == model.swa_table(sid)
        assert m.num_computed(sid) == model.num_computed(sid)


@layouts
def test_one_append_serves_different_draft_counts_per_sequence_like_the_model(layout):
    """Four decoding sequences near block and page boundaries; each step gives
    them four different widths (1 to 1 + mtp_k) in one append, through the
    wrapper and through the torch class with a count tensor. Each sequence
    gets room for its own positions: blocks up to its last one, and an SWA
    page for each of them."""
    m, model = pair(layout, mtp_k=3)
    ids = [1, 2, 3, 4]
    for sid, n in zip(ids, (BS - 1, BS - 3, 2 * BS + 30, 50)):
        t = tokens(n, sid)
        for mgr in (m, model):
            mgr.allocate(sid, t)
            prefill(mgr, sid, t)
    page = m.config.swa_page
    for step in range(60):
        widths = [1 + (step + i) % 4 for i in range(4)]
        assert m.can_append(ids, widths) == model.can_append(ids, widths) == 4
        if step % 2:
            m.torch_object.append(torch.tensor(ids), torch.tensor(widths))
        else:
            m.append(ids, widths)
        model.append(ids, widths)
        same_as_model(m, model, ids)
        for sid, w in zip(ids, widths):
            nc = m.num_computed(sid)
            assert len(m.logical_table(sid)) == -(-(nc + w) // BS)
            swa = m.swa_table(sid).tolist()
            assert all(swa[p // page] >= 0 for p in range(nc, nc + w))
        accepted = [1 + (step * sid) % w for sid, w in zip(ids, widths)]
        new = tokens(sum(accepted), step)
        m.commit_decode(ids, accepted, new)
        model.commit_decode(ids, accepted, new)
        same_as_model(m, model, ids)
    m.check_invariants()


@layouts
def test_commit_prefill_without_ensure_or_off_what_was_ensured_is_refused_changing_nothing(layout):
    m, _ = pair(layout)
    for sid in (1, 2):
        m.allocate(sid, tokens(500, sid))
    m.stage([1, 2])
    before = snapshot(m)
    with pytest.raises(ValueError, match="commits 100 tokens but ensure_for_tokens provisioned 0"):
        m.commit_prefill([1], [100])
    assert unchanged(m, before)
    m.ensure_for_tokens([1, 2], [200, 100])
    m.stage([1, 2])
    before = snapshot(m)
    for counts in ([199, 100], [201, 100], [200, 99], [200, 101]):  # fewer or more, in either entry
        with pytest.raises(ValueError, match="provisioned"):
            m.commit_prefill([1, 2], counts)
        assert unchanged(m, before), counts
    m.commit_prefill([1, 2], [0, 100])  # 0 commits nothing: sequence 1's chunk stays provisioned
    m.commit_prefill([1], [200])
    assert (m.num_computed(1), m.num_computed(2)) == (200, 100)
    m.stage([1, 2])
    before = snapshot(m)
    with pytest.raises(ValueError, match="provisioned 0"):  # committed: a new chunk needs a new ensure
        m.commit_prefill([2], [50])
    assert unchanged(m, before)
    m.check_invariants()


def test_row_space_chunks_that_could_overflow_the_copy_list_are_refused_changing_nothing():
    """One step's copy list has room for the moves of max_num_batched_tokens
    of chunks; chunks binding more units than that share could make room for
    are refused before anything changes, and a step within it goes through."""
    m, _ = pair("row_space", max_num_batched_tokens=256, max_num_seqs=2)
    m.allocate(1, tokens(16 * BS, 1))
    m.stage([1])
    before = snapshot(m)
    with pytest.raises(ValueError, match="copy list has room for"):
        m.ensure_for_tokens([1], [16 * BS])  # 16 envelopes and 5 pages; the share holds 14 units' moves
    assert unchanged(m, before)
    m.ensure_for_tokens([1], [2 * BS])
    m.commit_prefill([1], [2 * BS])
    m.check_invariants()
