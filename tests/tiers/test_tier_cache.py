"""TierCache over a HostTier: what the objects hold (against the rows read
directly), restoring across layouts and page sizes, fail-closed faults
(flipped bytes, truncated, another model's fingerprint, another salt), a load
found unsound after its admission given back, saves refused while row copies
are pending, and tails at every block boundary of a prompt prefilled under
memory pressure (whole chunks), saved before the next step reuses their rows."""
import gc
import re
from types import SimpleNamespace

import pytest
import torch

from ukv_torch.tiers import TierCache
from ukv_torch.tiers.fetch import ObjectFetch
from ukv_torch.tiers.keys import chain_keys, key_name, root_key, tail_key
from ukv_torch.tiers.objects import BLOCK, TAIL, ObjectLayout
from ukv_torch.tiers.staging import aligned

from support.devices import DEVICES
from support.tier_engine import BS, WINDOW, TierEngine, host, prompt

LAYOUTS = ["static", "elastic", "row_space"]
N = 5 * BS + 1  # a prompt whose last window after prefill still holds the tail at block 5


def saved_engine(layout, tier, seed=1):
    a = TierEngine(layout, [tier])
    p = prompt(seed, N)
    assert a.prefill(0, p) == 0
    return a, p


@pytest.mark.parametrize("saver", LAYOUTS)
@pytest.mark.parametrize("loader, page", [("static", 0), ("elastic", 0), ("row_space", 32), ("row_space", 64)])
def test_any_layout_restores_the_rows_another_saved(saver, loader, page):
    restores_across_layouts(saver, loader, page, "cpu")


@pytest.mark.parametrize("piece_blocks", [1, 2, 3, 32])
@pytest.mark.parametrize("device", DEVICES)
def test_a_load_read_in_pieces_restores_every_piece(piece_blocks, device, monkeypatch):
    """The 5 blocks read in pieces of at most piece_blocks (the first of up to 4): the same
    rows as a load in one piece."""
    monkeypatch.setattr("ukv_torch.tiers.cache._LOAD_PIECE_BLOCKS", piece_blocks)
    monkeypatch.setattr("ukv_torch.tiers.cache._FIRST_LOAD_PIECE_BLOCKS", min(4, piece_blocks))
    restores_across_layouts("row_space", "elastic", 0, device)


def doubling_pieces(first_piece: int, largest: int, blocks: int):
    """The reads a load of ``blocks`` blocks makes: first_piece, then each twice the one before, at most
    ``largest``, the last one what is left."""
    out, size = [], first_piece
    while sum(out) < blocks:
        out.append(min(size, blocks - sum(out)))
        size = min(2 * size, largest)
    return out


@pytest.mark.parametrize("first_piece, largest", [(1, 4), (4, 32), (2, 2)])
@pytest.mark.parametrize("step_tokens", [1024, 64])
def test_a_load_reads_pieces_that_double_and_none_past_the_manager_s_bound(first_piece, largest, step_tokens,
                                                                             monkeypatch):
    """A 15-block prefix is read first_piece blocks first, then in pieces twice as large
    as the one before up to the largest, each piece's blocks read in one call; with a
    64-token step the manager binds 14 blocks (see the test below), and no block past them
    is read."""
    monkeypatch.setattr("ukv_torch.tiers.cache._FIRST_LOAD_PIECE_BLOCKS", first_piece)
    monkeypatch.setattr("ukv_torch.tiers.cache._LOAD_PIECE_BLOCKS", largest)
    reads = []
    blocks = ObjectFetch.blocks
    monkeypatch.setattr(ObjectFetch, "blocks", lambda self, keys, names: reads.append(len(keys)) or
                        blocks(self, keys, names))
    tier = host()
    a = TierEngine("row_space", [tier])
    p = prompt(1, 15 * BS + 1)
    assert a.prefill(0, p) == 0
    reads.clear()
    b = TierEngine("row_space", [tier], seed=9, max_num_batched_tokens=step_tokens)
    bound = b.mgr.can_allocate(p, loaded_tokens=15 * BS) // BS
    assert b.tiers.admit(b.mgr, 3, p) == bound * BS
    assert reads == doubling_pieces(first_piece, largest, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("saver, loader", [("static", "row_space"), ("row_space", "elastic")])
def test_any_layout_restores_the_rows_another_saved_on_the_gpu(saver, loader):
    """The GPU path: rows gathered and scattered on the current stream, host copies on the side stream."""
    restores_across_layouts(saver, loader, 32, "cuda")


def restores_across_layouts(saver, loader, page, device):
    tier = host()
    a = TierEngine(saver, [tier], device=device)
    p = prompt(1, N)
    assert a.prefill(0, p) == 0
    b = TierEngine(loader, [tier], page=page or 32, seed=9, device=device)  # other bytes everywhere
    cached = b.tiers.admit(b.mgr, 3, p)
    assert cached == 5 * BS and b.mgr.num_computed(3) == 5 * BS
    b.mgr.ensure_for_tokens([3], [N - cached])
    b.step_rows([3])
    for block in range(5):
        assert b.block_bytes(3, block) == a.block_bytes(0, block), block
    for position in range(5 * BS - (WINDOW - 1), 5 * BS):
        assert b.position_bytes(3, position) == a.position_bytes(0, position), position
    assert b.tiers.stats()["loaded_blocks"] == 5
    b.tiers.flush()
    assert b.tiers.staging.free_bytes() == b.tiers.staging.size  # every staging range went back


def object_names(engine, p, salt=None):
    keys = chain_keys(root_key(engine.tiers.layout.fingerprint, salt), p, BS, 5)
    return [key_name(k) for k in keys], [key_name(tail_key(k)) for k in keys]


def damage(tier, name, how):
    """Damages the host tier's object in place: a flipped payload bit, its last byte cut off, its kind byte."""
    start, size = tier._objects[name]
    obj = tier._arena.buffer[start: start + size]
    if how == "flip":
        obj[size // 2] ^= 0x10
    elif how == "truncate":
        tier._objects[name] = (start, size - 1)
    elif how == "header":
        obj[5] ^= 1  # the kind byte


@pytest.mark.parametrize("how", ["flip", "truncate", "header"])
@pytest.mark.parametrize("which", ["block", "tail"])
@pytest.mark.parametrize("piece_blocks", [1, 2, 32])
def test_a_damaged_object_is_a_miss_and_the_rest_is_recomputed(how, which, piece_blocks, monkeypatch):
    """A load reads its first 4 blocks before admitting, then the rest piece_blocks at a
    time: a bad block 2 is found before the admission (truncated) or after it (flipped,
    found by the verify); a bad tail 5 after it."""
    monkeypatch.setattr("ukv_torch.tiers.cache._LOAD_PIECE_BLOCKS", piece_blocks)
    tier = host()
    a, p = saved_engine("row_space", tier)
    blocks, tails = object_names(a, p)
    damage(tier, blocks[2] if which == "block" else tails[4], how)
    b = TierEngine("static", [tier], seed=9)
    cached = b.prefill(3, p)
    # A bad block 2 ends the load at the last tail at or below it; a bad tail at 5 at the one before.
    assert cached == (2 * BS if which == "block" else 4 * BS)
    assert b.tiers.stats()["rejected_objects"] >= 1
    for block in range(cached // BS):
        assert b.block_bytes(3, block) == a.block_bytes(0, block)


@pytest.mark.parametrize("tail_batch", [1, 2, 8])
@pytest.mark.parametrize("missing", [0, 1, 3])
def test_a_load_ends_at_the_furthest_tail_a_backend_holds(tail_batch, missing, monkeypatch):
    """Tails are looked up tail_batch at a time from the furthest end down: with the last
    ``missing`` tails evicted, the load ends at the furthest one left, and no further."""
    monkeypatch.setattr("ukv_torch.tiers.cache._TAIL_BATCH", tail_batch)
    tier = host()
    a, p = saved_engine("row_space", tier)
    _, tails = object_names(a, p)
    for name in tails[len(tails) - missing:]:
        start, size = tier._objects.pop(name)
        tier._arena.free(start, size)
    b = TierEngine("elastic", [tier], seed=9)
    cached = b.prefill(3, p)
    assert cached == (5 - missing) * BS
    assert b.tiers.stats()["loaded_blocks"] == 5 - missing
    for block in range(cached // BS):
        assert b.block_bytes(3, block) == a.block_bytes(0, block)


def test_objects_of_another_model_or_salt_are_never_read():
    tier = host()
    a, p = saved_engine("row_space", tier)
    blocks, tails = object_names(a, p)
    # Another salt: other keys, nothing found.
    b = TierEngine("static", [tier], seed=9)
    assert b.tiers.admit(b.mgr, 3, p, salt=b"tenant") == 0
    # Another model (the RoPE plane read as another dtype) under keys of its own fingerprint ...
    other = TierCache(a.plan, a.kv._replace(rope=[None if r is None else r.view(torch.float16) for r in a.kv.rope]),
                      [tier])
    assert other.layout.fingerprint != a.tiers.layout.fingerprint
    c = TierEngine("static", [tier], seed=9)
    c.tiers = TierCache(c.plan, c.kv._replace(rope=[None if r is None else r.view(torch.float16) for r in c.kv.rope]),
                        [tier])
    assert c.tiers.admit(c.mgr, 3, p) == 0
    # ... and this model's objects planted under that model's keys: refused by their header.
    theirs, their_tails = object_names(c, p)
    for mine, name in zip(blocks + tails, theirs + their_tails):
        tier._objects[name] = tier._objects[mine]
    assert c.tiers.admit(c.mgr, 4, p) == 0
    assert c.tiers.stats()["rejected_objects"] > 0


@pytest.mark.parametrize("layout", ["row_space", "static"])
def test_a_load_found_unsound_after_its_admission_gives_its_rows_back_and_touches_no_other(layout):
    """The rows are written once the copies land, before the objects are verified: a bad
    block 3 makes admit free the sequence and admit it again with blocks 0-2 (the last
    tail at or below them). Another live sequence's rows stay as they were, the pools
    are consistent, and the rows loaded are the saved ones."""
    tier = host()
    a, p = saved_engine("row_space", tier)
    blocks, _ = object_names(a, p)
    damage(tier, blocks[3], "flip")
    b = TierEngine(layout, [tier], seed=9)
    other = prompt(4, 3 * BS + 1)
    assert b.prefill(1, other) == 0
    before = [b.block_bytes(1, block) for block in range(3)]
    claims = claims_of(b.mgr)
    cached = b.tiers.admit(b.mgr, 3, p)
    assert claims == [5 * BS, 3 * BS]  # the whole load, then at once the sound blocks' end
    assert cached == 3 * BS and b.mgr.num_computed(3) == 3 * BS
    b.mgr.check_invariants()
    assert [b.block_bytes(1, block) for block in range(3)] == before
    assert [b.block_bytes(3, block) for block in range(3)] == [a.block_bytes(0, block) for block in range(3)]
    assert b.tiers.stats()["loaded_requests"] == 1 and b.tiers.stats()["loaded_blocks"] == 3


def claims_of(mgr):
    """The loaded_tokens of each allocate call on ``mgr`` from now on."""
    allocate, claims = mgr.allocate, []
    mgr.allocate = lambda *args, loaded_tokens=0, **kw: claims.append(loaded_tokens) or \
        allocate(*args, loaded_tokens=loaded_tokens, **kw)
    return claims


@pytest.mark.parametrize("block, piece_blocks", [(2, 32), (4, 1), (4, 32)])
def test_a_block_not_whole_is_never_admitted_past(block, piece_blocks, monkeypatch):
    """Every block is read before the admission: a truncated one, among the first 4 (block 2)
    or after them (block 4, read alone or with the rest), ends the load before it with one
    admission, at its start (a tail there is held)."""
    monkeypatch.setattr("ukv_torch.tiers.cache._LOAD_PIECE_BLOCKS", piece_blocks)
    tier = host()
    a, p = saved_engine("row_space", tier)
    blocks, _ = object_names(a, p)
    damage(tier, blocks[block], "truncate")
    b = TierEngine("elastic", [tier], seed=9)
    made = claims_of(b.mgr)
    cached = b.tiers.admit(b.mgr, 3, p)
    assert made == [block * BS] and cached == block * BS
    assert [b.block_bytes(3, i) for i in range(block)] == [a.block_bytes(0, i) for i in range(block)]


def test_a_backend_that_raises_mid_load_leaves_no_admission_behind():
    """A backend error while the blocks are read (here block 4's, after the first 4) reaches
    the caller before any admission; an error after the admission (here in the rows' writes)
    reaches it with the admission undone. Either way the pools are as before."""
    tier = host()
    a, p = saved_engine("row_space", tier)
    for where in ("read", "write"):
        b = TierEngine("elastic", [tier], seed=9)
        before = b.mgr.stats()
        peek, calls = tier.peek, []

        def failing_peek(keys):
            calls.append(keys)
            if len(calls) > 1:  # the first 4 blocks read, then block 4's read fails
                raise RuntimeError("the store went away")
            return peek(keys)

        def failing_scatter(*args, **kwargs):
            raise RuntimeError("the store went away")

        if where == "read":
            tier.peek = failing_peek
        else:
            b.tiers.layout.scatter = failing_scatter
        made = claims_of(b.mgr)
        try:
            with pytest.raises(RuntimeError, match="the store went away"):
                b.tiers.admit(b.mgr, 3, p)
        finally:
            tier.peek = peek
        assert made == ([] if where == "read" else [5 * BS]) and not b.mgr.has_sequence(3), where
        b.mgr.check_invariants()
        after = b.mgr.stats()
        assert {k: after[k] for k in ("num_sequences", "free_logical_blocks", "free_swa_slots")} == \
            {k: before[k] for k in ("num_sequences", "free_logical_blocks", "free_swa_slots")}


def test_a_load_uploads_each_write_s_run_lists_before_it_waits_for_the_copies(monkeypatch):
    """Each write of a load: its run lists' upload, then the stream's wait for the copies it
    reads, then its copies; an upload queued behind the wait would start only once the
    copies landed."""
    tier = host()
    _, p = saved_engine("row_space", tier)
    b = TierEngine("elastic", [tier], seed=9)
    log = []
    upload, wait = ObjectLayout._upload_runs, ObjectFetch.wait
    monkeypatch.setattr(ObjectLayout, "_upload_runs", lambda self, runs: log.append("upload") or upload(self, runs))
    monkeypatch.setattr(ObjectFetch, "wait", lambda self, *args, **kw: log.append("wait") or wait(self, *args, **kw))
    monkeypatch.setattr("ukv_torch.tiers.objects.scatter_rows", lambda *args, **kw: log.append("copy"))
    assert b.tiers.admit(b.mgr, 3, p) > 0
    writes = "".join("U" if e == "upload" else "W" if e == "wait" else "c" for e in log)
    assert writes and re.fullmatch(r"(UWc+)+", writes), writes


def test_a_row_space_kv_without_its_planes_is_refused_by_name():
    """Admission applies the row copies it makes to the planes: KV tensors given
    without them would leave those copies unmade."""
    e = TierEngine("row_space", [host()])
    kv = SimpleNamespace(kv=e.kv.kv, rope=e.kv.rope, indexer=e.kv.indexer)
    with pytest.raises(ValueError, match="kv.planes"):
        TierCache(e.plan, kv, [host()])


def test_a_refused_admission_loads_nothing_and_changes_nothing():
    tier = host()
    a, p = saved_engine("static", tier)
    b = TierEngine("static", [tier], seed=9)
    for seq in range(8):  # max_num_seqs live
        assert b.mgr.allocate(100 + seq, [1]) == 0
    free = b.tiers.staging.free_bytes()
    assert b.tiers.admit(b.mgr, 3, p) == b.mgr.NOT_NOW
    assert not b.mgr.has_sequence(3) and b.tiers.staging.free_bytes() == free


def test_saving_while_row_copies_are_pending_is_refused():
    """The guard: a published block is read where the manager has it after the step's
    row copies; before they are taken (stage), the rows it names may not hold it yet."""
    e = TierEngine("row_space", [host()], budget_kib=24, max_num_batched_tokens=256)
    rng = torch.Generator().manual_seed(3)
    events, live = [], []
    for seq in range(200):
        p = torch.randint(0, 30000, (int(torch.randint(129, 700, (1,), generator=rng)),), generator=rng).tolist()
        moved = e.mgr.stats()["moved_rows"]
        cached = e.tiers.admit(e.mgr, seq, p)
        if cached < 0:
            e.mgr.deallocate(live[:2])
            live = live[2:]
            continue
        e.mgr.ensure_for_tokens([seq], [len(p) - cached])
        # The last step's events, saved late: after this step's allocations.
        if events and e.mgr.stats()["moved_rows"] > moved:  # units moved since the last stage: copies pending
            with pytest.raises(RuntimeError, match="row copies"):
                e.tiers.save(e.mgr, events)
            return
        e.tiers.save(e.mgr, events)  # nothing moved: the rows are where the manager says
        e.step_rows([seq])
        e.mgr.commit_prefill([seq], [len(p) - cached], [1])
        events = e.mgr.take_events()
        live.append(seq)
    pytest.fail("no step had row copies pending: the scenario does not exercise the guard")


def test_objects_found_in_a_later_tier_are_copied_into_the_earlier_ones():
    far = host()
    a, p = saved_engine("static", far)
    near = host()
    b = TierEngine("row_space", [near, far], seed=9)
    assert b.tiers.admit(b.mgr, 3, p) == 5 * BS  # before any save could have written them
    blocks, tails = object_names(a, p)
    assert near.contains(blocks) == [True] * 5 and near.contains(tails[-1:]) == [True]
    assert b.tiers.stats()["host_fetched_objects"] == 6  # both are HostTiers: the counter is by name


STEP = 512  # max_num_batched_tokens of the tight engine below
TAIL_3 = range(3 * BS - (WINDOW - 1), 3 * BS)  # the window before block boundary 3


def prefill_in_steps(e, seq_id, p, seed, save=True):
    """Admit through the tiers, compute the prompt in steps of at most STEP tokens
    (the model writes random bytes into every SWA row the manager gave), and
    save each step's events after its commit (save=False: return them instead).
    Returns the rows and bytes of TAIL_3 as the first step wrote them, and the
    events not saved."""
    assert e.tiers.admit(e.mgr, seq_id, p) == 0
    written, events = None, []
    for start in range(0, len(p), STEP):
        n = min(STEP, len(p) - start)
        e.mgr.ensure_for_tokens([seq_id], [n])
        e.step_rows([seq_id])
        e.write_swa(seq_id, range(start, start + n), seed + start)
        if start == 0:
            rows = [pr for position in TAIL_3 for pr in e.swa_planes(seq_id, position)]
            written = (rows, [plane[row].clone() for plane, row in rows])
        e.mgr.commit_prefill([seq_id], [n], [7 if start + n == len(p) else -1])
        if save:
            e.tiers.save(e.mgr, e.mgr.take_events())
        else:
            events += e.mgr.take_events()
    return written, events


def tight_engine_reusing_interior_rows(tier, save_first):
    """A prompt of 6 blocks prefilled in two steps on rows so tight that the next
    request's chunks take every row of its tail before block boundary 3 (the
    first chunk's pages below its window, freed at its commit). save_first:
    the prompt's steps save as the serving loop says; otherwise their events
    are saved only after the next request's step."""
    e = TierEngine("row_space", [tier], budget_kib=40, max_num_batched_tokens=STEP)
    p = prompt(1, 6 * BS + 1)
    (rows, tail_bytes), late = prefill_in_steps(e, 0, p, seed=1, save=save_first)
    blocks = [e.block_bytes(0, block) for block in range(3)]
    assert e.mgr.whole_chunks and e.mgr.stats()["whole_chunks"] == 2
    e.mgr.deallocate([0])
    prefill_in_steps(e, 1, prompt(2, 6 * BS + 1), seed=2)
    assert all(not torch.equal(plane[row], b) for (plane, row), b in zip(rows, tail_bytes))  # all reused
    if late:
        e.tiers.save(e.mgr, late)
    e.tiers.flush()
    return p, blocks, [b.view(torch.uint8).numpy().tobytes() for b in tail_bytes]


def test_under_pressure_every_block_boundary_gets_a_tail_saved_before_its_rows_are_reused():
    """Whole chunks: the first chunk writes and publishes the window before
    boundary 3 too (without them it writes only its last window, and no load
    could end there); the save reads it at the commit, so the tail object
    holds those bytes though the next step's chunks overwrote the rows."""
    tier = host()
    p, blocks, tail_bytes = tight_engine_reusing_interior_rows(tier, save_first=True)
    _, tails = object_names(TierEngine("row_space", [tier]), p)
    assert tier.contains(tails) == [True] * 5  # boundaries 1..5 (6 is not a full block boundary of the prompt)
    b = TierEngine("row_space", [tier], seed=9)  # another engine: nothing of p in its HBM
    q = p[:3 * BS] + prompt(5, 60)
    assert b.tiers.admit(b.mgr, 3, q) == 3 * BS
    b.mgr.ensure_for_tokens([3], [len(q) - 3 * BS])
    b.step_rows([3])
    assert [b.block_bytes(3, block) for block in range(3)] == blocks
    assert [x for position in TAIL_3 for x in b.position_bytes(3, position)] == tail_bytes


def test_a_late_save_stores_no_tail_whose_rows_were_reused():
    """Saved only after the next request's step: the pages of the tail before
    boundary 3 were evicted for that step's chunks, so the manager no longer
    locates them and no tail object of other bytes is stored there."""
    tier = host()
    p, _, _ = tight_engine_reusing_interior_rows(tier, save_first=False)
    _, tails = object_names(TierEngine("row_space", [tier]), p)
    assert tier.contains(tails[2:3]) == [False]
    b = TierEngine("row_space", [tier], seed=9)
    assert b.tiers.admit(b.mgr, 3, p[:3 * BS] + prompt(5, 60)) < 3 * BS


def test_a_small_staging_saves_a_step_in_pieces_and_loads_what_it_holds():
    """Staging for a tail and 8 blocks: a step of whole chunks publishes 4 blocks
    and their 4 tails, saved in pieces that fit (not dropped as one save too
    large), and a load of the 10-block prompt stops at the 8 blocks and the
    tail the staging holds (not nothing, for want of room for all 10)."""
    tier = host()
    a, b = TierEngine("row_space", [tier]), TierEngine("row_space", [tier], seed=9)
    layout = a.tiers.layout
    block, tail = aligned(layout.object_bytes(BLOCK)), aligned(layout.object_bytes(TAIL))
    assert 4 * (block + tail) > tail + 8 * block
    for e in (a, b):
        e.tiers = TierCache(e.plan, e.kv, [tier], staging_bytes=tail + 8 * block)
    p = prompt(1, 10 * BS + 1)
    prefill_in_steps(a, 0, p, seed=1)
    keys = chain_keys(root_key(layout.fingerprint, None), p, BS, 10)
    assert tier.contains([key_name(k) for k in keys] + [key_name(tail_key(k)) for k in keys]) == [True] * 20
    assert a.tiers.stats()["dropped_saves"] == 0
    assert b.tiers.admit(b.mgr, 3, p) == 8 * BS


def test_a_load_ends_where_the_row_space_copy_list_has_room_and_its_rows_are_right():
    """A step binds a prompt's loaded rows through its copy list's share for loads: with a
    64-token step budget that is 14 of 15 blocks. The load ends at the manager's own bound
    (its answer to can_allocate with the whole prefix loaded), its blocks' rows are the saved
    ones, and the rest is prompt."""
    tier = host()
    a = TierEngine("row_space", [tier])
    p = prompt(1, 15 * BS + 1)
    assert a.prefill(0, p) == 0
    b = TierEngine("row_space", [tier], seed=9, max_num_batched_tokens=64)
    bound = b.mgr.can_allocate(p, loaded_tokens=15 * BS)
    assert bound == 14 * BS  # the manager's formula (kv_manager_tiers.cpp, loadable) at this size
    cached = b.tiers.admit(b.mgr, 3, p)
    assert cached == bound and b.mgr.num_computed(3) == bound
    assert b.tiers.stats()["loaded_blocks"] == 14
    b.mgr.ensure_for_tokens([3], [64])
    b.step_rows([3])
    for block in range(14):  # (the saver's window has left the tail's positions: the tail is checked elsewhere)
        assert b.block_bytes(3, block) == a.block_bytes(0, block), block


def computed_for_a_save_buffer_of(pairs, tier, p, device):
    """A row-space engine whose TierCache saves into ``tier`` through a save buffer of ``pairs``
    block-and-tail objects (pieces of half of them), with prompt ``p`` computed in one chunk and
    its blocks published, not yet saved."""
    a = TierEngine("row_space", [tier], device=device, max_num_batched_tokens=2048)
    layout = a.tiers.layout
    pair = aligned(layout.object_bytes(BLOCK)) + aligned(layout.object_bytes(TAIL))
    a.tiers = TierCache(a.plan, a.kv, [tier], save_buffer_bytes=pairs * pair)
    assert a.tiers.admit(a.mgr, 0, p) == 0
    a.mgr.ensure_for_tokens([0], [len(p)])
    a.step_rows([0])
    a.mgr.commit_prefill([0], [len(p)], [7])
    return a


def saved_through_a_two_piece_save_buffer(device, delay_copies=False):
    """A 10-block prompt computed in one chunk and saved through a save buffer of two
    halves of one block and its tail (every piece after the second reuses a half),
    with the copies to host memory held back on the side stream by ``delay_copies``
    (then every piece after the second finds its half's copy still to run): the
    loaded rows must be the ones saved. Returns the saver's stats."""
    tier, p = host(), prompt(3, 10 * BS + 1)
    a = computed_for_a_save_buffer_of(2, tier, p, device)
    if delay_copies:
        gc.collect()  # page-locked buffers of earlier engines, unregistered mid-save, would wait for the sleep
        with torch.cuda.stream(a.tiers.side):
            torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU clock: the copies start after every gather was asked for
    a.tiers.save(a.mgr, a.mgr.take_events())
    a.tiers.flush()
    b = TierEngine("elastic", [tier], seed=9, device=device, max_num_batched_tokens=2048)
    assert b.tiers.admit(b.mgr, 3, p) == 10 * BS
    b.mgr.ensure_for_tokens([3], [1])
    b.step_rows([3])
    for block in range(10):
        assert b.block_bytes(3, block) == a.block_bytes(0, block), block
    for position in range(10 * BS - (WINDOW - 1), 10 * BS):
        assert b.position_bytes(3, position) == a.position_bytes(0, position), position
    return a.tiers.stats()


def expected_pieces(has_tail, block, tail, piece_bytes, first_group, max_group):
    """The reference: blocks keyed in groups, each group's objects (a block's, and its tail's
    where it has one) after those kept from the groups before, cut in order into pieces of at
    most ``piece_bytes`` (never empty). A piece is saved once the next object would not fit,
    once not even a block without tail fits, and at the first group's end and the last one's.
    The first group is ``first_group`` blocks; each next one as many as fill the piece under
    way at the bytes per block of the group before, at most ``max_group``. Per piece: (its
    blocks, blocks keyed by then)."""
    n, pieces, kept, at, group = len(has_tail), [], [], 0, first_group
    while at < n:
        end = min(n, at + group)
        sizes = [block + tail * has_tail[i] for i in range(at, end)]
        current = list(kept)
        for size in sizes:
            if current and sum(current) + size > piece_bytes:
                pieces.append((len(current), end))
                current = []
            current.append(size)
        if at == 0 or end == n or sum(current) + block > piece_bytes:
            pieces.append((len(current), end))
            current = []
        per_block = sum(sizes) // len(sizes)
        group = min(max_group, max(1, -(-(piece_bytes - sum(current)) // per_block)))
        kept, at = current, end
    return pieces


@pytest.mark.parametrize("tailless, cut", [(0, [(3, 3), (3, 6), (3, 9), (1, 10)]),
                                              (1, [(3, 3), (3, 8), (3, 9), (1, 10)]),  # 2 blocks kept
                                              (7, [(3, 3), (6, 10), (1, 10)])])
def test_a_save_keys_its_blocks_a_group_at_a_time_and_cuts_pieces_by_bytes(monkeypatch, tailless, cut):
    """A 10-block prompt saved through a save buffer of 6 blocks with their tails (pieces of
    at most 3 of them): the first piece is gathered once its own 3 blocks are keyed, before any
    later block is (the first copy waits for one piece's host work, not every block's); later
    blocks are keyed as many at once as fill a piece at the bytes per block seen, and cut into
    pieces by their objects' bytes, so blocks whose tails left the window (the first
    ``tailless``, as a long prompt's) go more to a piece. Every object located is saved once."""
    a = computed_for_a_save_buffer_of(6, host(), prompt(4, 10 * BS + 1), "cpu")
    block, tail = aligned(a.tiers.layout.object_bytes(BLOCK)), aligned(a.tiers.layout.object_bytes(TAIL))
    keyed, pieces = [], []
    key_of, save_objects, locate = a.tiers.chain.key_of, a.tiers._save_objects, a.tiers._locate

    def located_without_early_tails(mgr, blocks):
        located = locate(mgr, blocks)
        first = len(keyed) - len(blocks)  # the group's first block in the prompt
        located.has_tail[: max(0, tailless - first)] = False
        return located
    monkeypatch.setattr(a.tiers.chain, "key_of", lambda ev, data: keyed.append(ev) or key_of(ev, data))
    monkeypatch.setattr(a.tiers, "_locate", located_without_early_tails)
    monkeypatch.setattr(a.tiers, "_save_objects",
                        lambda piece: pieces.append((len(piece), len(keyed))) or save_objects(piece))
    a.tiers.save(a.mgr, a.mgr.take_events())
    a.tiers.flush()
    has_tail = [i >= tailless for i in range(10)]
    assert pieces == expected_pieces(has_tail, block, tail, 3 * (block + tail), 3, 3 * (block + tail) // block)
    assert pieces == cut
    assert a.tiers.stats()["saved_objects"] == 10 + sum(has_tail)


@pytest.mark.parametrize("device", DEVICES)
def test_saves_through_a_save_buffer_of_two_pieces_restore_every_row(device):
    stats = saved_through_a_two_piece_save_buffer(device)
    assert stats["saved_objects"] == 20 and stats["dropped_saves"] == 0


@pytest.mark.gpu
def test_a_save_buffer_half_is_reused_only_after_its_copy_to_host_memory():
    """The copies held back behind 0.5 s of GPU sleep: each piece after the second waits on
    the device for the copy of the piece that held its half (without that wait the
    later gathers overwrite objects before they are copied, and the load stops early).
    Once undelayed first, so the kernels are loaded before the sleep starts."""
    saved_through_a_two_piece_save_buffer("cuda")
    stats = saved_through_a_two_piece_save_buffer("cuda", delay_copies=True)
    assert stats["saved_objects"] == 20 and stats["save_buffer_waits"] == 8
