"""Moving a decoding request between two engines of examples/engine_loop.py,
in the transfer order: engine A prefills it (and decodes a while) and
describes it; engine B of another layout or size, busy with its own requests,
admits it first (import_sequence, retried while B answers NOT_NOW, A keeping
the request meanwhile); only then A gathers its rows, B scatters them, and A
releases it; B decodes it to the end. Both engines serve every request
with every index reading the tag its position expects (tagged_model.py): B's
reads of the moved request's window and compressed entries, and later
requests' prefix hits on the blocks it published, all find the right KV."""
import copy
import sys
from pathlib import Path

import pytest

from ukv_torch import KvManager

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import engine_loop  # noqa: E402

MOVED_ID = 10_000  # the moved request's sequence id in B (B's own requests are numbered from 0)


def renamed(r):
    """The request as B knows it: the same tokens and tags under B's id for it."""
    moved = copy.copy(r)
    moved.rid, moved.tokens, moved.drafts = MOVED_ID, list(r.tokens), []
    return moved


def engine(layout, *extra):
    return engine_loop.Engine(engine_loop.parse_args(["--layout", layout, "--requests", "8", "--seed", "3",
                                                      *extra]))


def run_until(e, done, limit=3000):
    while not done() and e.steps < limit and not e.failed():
        e.step()
    assert not e.failed(), (e.problems + e.model.mismatches)[:5]
    assert done(), "the condition was not reached"


def ready_to_move(e, min_computed):
    """A decoding request with at least min_computed positions and room to decode further."""
    return next((r for r in e.running if r.decoding and r.computed >= min_computed
                 and len(r.tokens) + 50 < r.target), None)


def assert_passes(e):
    ok, report = e.outcome(0.0)
    assert ok, report


@pytest.mark.parametrize("a_layout, b_layout, b_args, b_busy", [
    ("static", "row_space", (), True),
    ("row_space", "elastic", (), True),
    ("row_space", "row_space", ("--swa-page-tokens", "64"), True),
    ("elastic", "upstream", (), True),
    ("upstream", "static", (), True),
    ("row_space", "static", (), False),
    ("elastic", "row_space", (), False),
])
def test_a_request_moves_between_layouts(a_layout, b_layout, b_args, b_busy):
    """b_busy: B serves its own requests first (they share the moved request's system
    prompt, so B already caches its first blocks); else B is idle and every row
    travels, and B's requests later hit the blocks the moved request published."""
    a, b = engine(a_layout), engine(b_layout, *b_args)
    if b_busy:
        run_until(b, lambda: b.steps >= 20)
    run_until(a, lambda: ready_to_move(a, 300) is not None)
    r = ready_to_move(a, 300)
    export = a.describe(r)
    assert export.num_computed == r.computed and export.tokens.tolist() == r.tokens
    moved = renamed(r)
    while (cached := b.admit_moved(moved, export)) == KvManager.NOT_NOW:  # B's requests hold the room
        assert a.mgr.has_sequence(r.rid) and r in a.running  # a refusal keeps it on the sender
        assert b.steps < 3000 and not b.failed()
        b.step()
    buffer = b.transfer_buffer(moved)
    a.send(r, buffer)
    b.receive(moved, buffer)
    a.release(r)
    assert not a.mgr.has_sequence(r.rid) and r not in a.running
    assert (cached > 0) == b_busy
    assert b.mgr.num_computed(MOVED_ID) == r.computed and b.mgr.num_tokens(MOVED_ID) == len(r.tokens)
    # It decodes on B from the KV that travelled (B may preempt it later: then it is recomputed there).
    run_until(b, lambda: moved.computed >= r.computed + 50)
    assert moved.decoding and moved in b.running
    run_until(a, a.done)
    run_until(b, b.done)
    assert len(moved.tokens) >= moved.target
    assert_passes(a)
    assert_passes(b)
    assert b.model.checked > 0 and not b.model.mismatches


def test_the_check_fails_if_the_rows_do_not_travel():
    """A buffer that does not hold the request's KV: B's first reads of it must fail the check."""
    a, b = engine("row_space"), engine("elastic")
    run_until(a, lambda: ready_to_move(a, 300) is not None)
    r = ready_to_move(a, 300)
    moved = renamed(r)
    assert b.admit_moved(moved, a.describe(r)) >= 0
    buffer = b.transfer_buffer(moved)
    a.send(r, buffer)
    buffer.zero_()
    b.receive(moved, buffer)
    a.release(r)
    b.step()
    assert b.model.mismatches
