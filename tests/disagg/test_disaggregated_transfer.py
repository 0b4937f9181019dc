"""A sequence moves from a prefill pool to a decode pool over Mooncake's
transfer engine (loopback TCP): its bytes land in the receiver's own rows
exactly as the in-process gather_sequence reads them, across layouts and
prefix hits, from and into KV on a GPU through host staging; refusals, wrong rows, other models, replays and sides that die
are answered in bounded time with nothing written and nothing leaked."""
import os
import re
import signal
import socket
import time

import numpy as np
import pytest
import torch

from support.disagg import BOUND_S, Served, peer, stopped
from support.disagg_pools import MODEL, pool, prefill, prompt
from support.mooncake_master import require_mooncake

from ukv_torch import KvManager

SENT, RECEIVED = 1, 9  # the sequence's id on each side


@pytest.fixture
def endpoints():
    require_mooncake()
    from ukv_torch.disagg import TransferEndpoint
    pair = TransferEndpoint(), TransferEndpoint()
    yield pair
    for endpoint in pair:
        endpoint.close()


def sides(endpoints, sender_pool, receiver_pool, timeout_s=20.0, staging=(0, 0), **sender_options):
    """staging: each side's staging_bytes (0: rows straight from and into the pools)."""
    from ukv_torch.disagg import KvReceiver, KvSender
    return (KvSender(sender_pool.mgr, sender_pool.plan, sender_pool.kv, endpoints[0], timeout_s=timeout_s,
                     staging_bytes=staging[0], **sender_options),
            KvReceiver(receiver_pool.mgr, receiver_pool.plan, receiver_pool.kv, endpoints[1], timeout_s=timeout_s,
                       staging_bytes=staging[1]))


def counts(p):
    """The pool's gauges that a leaked or half-freed sequence would change."""
    stats = p.mgr.stats()
    return {k: v for k, v in stats.items() if k in ("num_sequences", "free_logical_blocks", "free_swa_slots",
                                                    "held_swa_slots", "live_envelopes", "live_swa_units")}


STAGED = 1 << 20  # a staging buffer that holds the sequence (4 KiB would not: rows go straight then)
#: pieces of at most 16 KiB: the test sequence's five layers (4-12 KiB each) go in four, the fourth over the
#: first two
SMALL = 32 << 10


@pytest.mark.parametrize("a_layout, b_layout, b_page, staging", [
    ("static", "row_space", 32, (0, 0)), ("row_space", "elastic", 0, (0, 0)), ("row_space", "row_space", 64, (0, 0)),
    ("elastic", "upstream", 0, (0, 0)), ("upstream", "static", 0, (0, 0)),
    ("row_space", "elastic", 0, (STAGED, STAGED)), ("static", "row_space", 32, (STAGED, 0)),
    ("row_space", "static", 0, (0, STAGED)), ("elastic", "row_space", 64, (4096, 4096)),
    ("row_space", "elastic", 0, (SMALL, SMALL)), ("static", "row_space", 32, (SMALL, 0)),
    ("elastic", "static", 0, (0, SMALL)), ("upstream", "row_space", 64, (STAGED, SMALL))])
def test_rows_land_in_the_receivers_rows_across_layouts(endpoints, a_layout, b_layout, b_page, staging):
    a, b = pool(a_layout, seed=1), pool(b_layout, page=b_page, seed=2)
    prefill(a, SENT, prompt(700))
    expected = a.sequence_bytes(SENT)
    sender, receiver = sides(endpoints, a, b, staging=staging)
    served = Served(receiver)
    result = sender.send(SENT, receiver.address, RECEIVED)
    event, = served.wait()
    assert result.status == "sent" and result.answer == 0 and result.nbytes == expected.numel()
    assert (event.seq_id, event.cached, event.num_computed) == (RECEIVED, 0, 700)
    assert b.mgr.num_computed(RECEIVED) == 700 and not a.mgr.has_sequence(SENT)
    assert np.array_equal(b.sequence_bytes(RECEIVED).numpy(), expected.numpy())
    receiver.close()
    sender.close()


def recorded(monkeypatch):
    """Every message sent on a Channel from now on, in order."""
    from ukv_torch.disagg import Channel
    sent = []
    original = Channel.send

    def recording(channel, message):
        sent.append(message)
        original(channel, message)

    monkeypatch.setattr(Channel, "send", recording)
    return sent


@pytest.mark.parametrize("staging, after", [((SMALL, SMALL), [0, 0, 0, 2]), ((STAGED, STAGED), [0, 0, 0]),
                                            ((0, 0), [0, 0, 0])])
def test_the_sequence_moves_in_pieces_of_whole_layers_through_the_buffers(endpoints, monkeypatch, staging, after):
    a, b = pool("row_space", seed=1), pool("elastic", seed=2)
    prefill(a, SENT, prompt(700))
    expected = a.sequence_bytes(SENT)
    sender, receiver = sides(endpoints, a, b, staging=staging)
    sent = recorded(monkeypatch)
    served = Served(receiver)
    assert sender.send(SENT, receiver.address, RECEIVED).status == "sent"
    assert len(served.wait()) == 1
    accept = next(m for m in sent if m["type"] == "accept")
    # the first and the last layer alone; SMALL: pieces of 4.0, 15.6, 11.5 and 4.2 KiB, the last over the first two
    assert accept["after"] == after and len(accept["pieces"]) == len(after) + 1
    order = [(m["type"], m.get("piece")) for m in sent if m["type"] not in ("offer", "accept")]
    # the receiver's process answers a ping before the first write is handed to the transfer engine
    assert order[:2] == [("ping", None), ("pong", None)] and order.count(("ping", None)) == 1
    # a piece is said written once it landed, in order; one that goes where another was waits for its "scattered"
    assert [m for m in order if m[0] == "written"] == [("written", k) for k in range(len(after))]
    assert [m for m in order if m[0] == "scattered"] == ([("scattered", k) for k in range(4)] if any(after) else [])
    for k, first in enumerate(after):
        if first:
            assert order.index(("scattered", first - 1)) < order.index(("written", k))
    assert order.index(("written", len(after) - 1)) < order.index(("done", None)) and order[-1] == ("ack", None)
    assert np.array_equal(b.sequence_bytes(RECEIVED).numpy(), expected.numpy())
    receiver.close()
    sender.close()


def test_a_staging_receiver_answers_the_ping_before_it_takes_its_rows(endpoints, monkeypatch):
    """The rows the staged pieces are scattered into are taken after the pong, while the
    first piece is written: the sender's first write waits for the pong only."""
    from ukv_torch.disagg.kv_regions import KvRegions
    a, b = pool("row_space", seed=1), pool("elastic", seed=2)
    prefill(a, SENT, prompt(700))
    expected = a.sequence_bytes(SENT)
    sender, receiver = sides(endpoints, a, b, staging=(STAGED, STAGED))
    sent = recorded(monkeypatch)
    rows_of = KvRegions.sequence_rows

    def taking_rows(regions, *args, **kwargs):
        if regions is receiver.regions:
            sent.append(dict(type="receiver's rows"))
        return rows_of(regions, *args, **kwargs)

    monkeypatch.setattr(KvRegions, "sequence_rows", taking_rows)
    served = Served(receiver)
    assert sender.send(SENT, receiver.address, RECEIVED).status == "sent"
    assert len(served.wait()) == 1
    order = [m["type"] for m in sent]
    assert order.count("receiver's rows") == 1
    assert order.index("accept") < order.index("pong") < order.index("receiver's rows") < order.index("done")
    assert np.array_equal(b.sequence_bytes(RECEIVED).numpy(), expected.numpy())
    receiver.close()
    sender.close()


@pytest.mark.parametrize("staging", [(0, 0), (STAGED, STAGED), (SMALL, SMALL)])
def test_a_prefix_the_receiver_holds_does_not_travel(endpoints, staging):
    a, b = pool("elastic", seed=1), pool("row_space", seed=2)
    tokens = prompt(700)
    prefill(b, 3, tokens[:600])  # b computed the first blocks itself and keeps them cached
    b.mgr.deallocate(3)
    prefill(a, SENT, tokens)
    expected = a.sequence_bytes(SENT)
    sender, receiver = sides(endpoints, a, b, staging=staging)
    served = Served(receiver)
    result = sender.send(SENT, receiver.address, RECEIVED)
    event, = served.wait()
    assert result.status == "sent" and result.answer == event.cached > 0
    # the bytes past the cached prefix are a's, and only they travelled
    got = b.sequence_bytes(RECEIVED)
    beyond = receiver.regions.runs(b.mgr.describe_sequence(RECEIVED), event.cached)
    assert result.nbytes == int(beyond[:, 2].sum()) < expected.numel()
    for offset, _, size in beyond.tolist():
        assert np.array_equal(got[offset: offset + size].numpy(), expected[offset: offset + size].numpy())
    receiver.close()
    sender.close()


@pytest.mark.parametrize("receiver_budget, answer", [(48 << 10, KvManager.NEVER_FITS),
                                                     (None, KvManager.NOT_NOW)])
def test_a_refusal_moves_nothing_and_the_sender_keeps_the_sequence(endpoints, receiver_budget, answer):
    a = pool("elastic", seed=1)
    b = pool("row_space", seed=2, budget=receiver_budget or (2 << 20))
    if answer == KvManager.NOT_NOW:  # b's room is held by its own sequences
        for i in range(4):
            prefill(b, 20 + i, prompt(900, seed=20 + i))
    prefill(a, SENT, prompt(700))
    before, gauges = b.snapshot(), counts(b)
    sender, receiver = sides(endpoints, a, b)
    served = Served(receiver)
    result = sender.send(SENT, receiver.address, RECEIVED)
    assert served.stop() == []
    receiver.close()
    assert (result.status, result.answer) == ("refused", answer)
    assert a.mgr.has_sequence(SENT) and not b.mgr.has_sequence(RECEIVED)
    assert b.unchanged_since(before) and counts(b) == gauges
    sender.close()


def assert_refused_by_name(endpoints, a, b, match, receiver_seq_id=RECEIVED, staging=(0, 0)):
    """The receiver answers the offer with an error: ValueError on the sender, nothing written,
    the sequence kept, the receiver's pool as it was."""
    prefill(a, SENT, prompt(700))
    before, gauges = b.snapshot(), counts(b)
    sender, receiver = sides(endpoints, a, b, staging=staging)
    served = Served(receiver)
    with pytest.raises(ValueError, match=match):
        sender.send(SENT, receiver.address, receiver_seq_id)
    assert served.stop() == []
    assert a.mgr.has_sequence(SENT) and b.unchanged_since(before) and counts(b) == gauges
    receiver.close()
    sender.close()


def test_another_model_geometry_is_refused_by_name(endpoints):
    b = pool("elastic", seed=2, budget=4 << 20, model=MODEL.replace(head_dim=32))
    assert_refused_by_name(endpoints, pool("elastic", seed=1), b, "other model geometry")


@pytest.mark.parametrize("receiver_seq_id, match", [(-5, "sequence ids must be >= 0"), (20, "live here: True")])
def test_an_id_the_receiver_cannot_take_is_refused_by_name(endpoints, receiver_seq_id, match):
    b = pool("elastic", seed=2)
    prefill(b, 20, prompt(300, seed=20))  # 20 is live on the receiver
    assert_refused_by_name(endpoints, pool("row_space", seed=1), b, "the receiver refused sequence 1: .*" + match,
                           receiver_seq_id)


def shifted_outside(runs, memory):
    runs = runs.copy()
    runs[-1, 1] = max(a + n for a, n in memory) + 64
    return runs


@pytest.mark.parametrize("tamper, match", [
    (lambda runs, memory: shifted_outside(runs, memory), "outside the KV memory it registered"),
    (lambda runs, memory: runs[:-1], "size mismatch"),
    (lambda runs, memory: np.concatenate([runs[:1], runs]), "overlap or are out of order"),
    (lambda runs, memory: runs + np.array([1 << 40, 0, 0]), "outside the sequence's"),
])
def test_rows_the_receiver_names_wrongly_are_refused_before_any_byte_moves(endpoints, tamper, match):
    a, b = pool("static", seed=1), pool("row_space", seed=2)
    prefill(a, SENT, prompt(700))
    sender, receiver = sides(endpoints, a, b)
    honest = receiver.regions.runs
    receiver.regions.runs = lambda export, skip: tamper(honest(export, skip), endpoints[1].memory)
    assert_answer_refused(sender, receiver, a, b, match, lambda: setattr(receiver.regions, "runs", honest))


def assert_answer_refused(sender, receiver, a, b, match, honest):
    """The sender refuses the receiver's accept with a ValueError naming why:
    nothing written, the sequence kept, the receiver's admission undone. Once
    the receiver answers ``honest()``ly again, the same sender's next send goes
    through (nothing of the refused one is left on its channel: the ping it
    sent as it began checking is answered on a channel it dropped)."""
    before, gauges = b.snapshot(), counts(b)
    served = Served(receiver)
    with pytest.raises(ValueError, match=match):
        sender.send(SENT, receiver.address, RECEIVED)
    event, = served.wait()
    assert event.seq_id == RECEIVED and "abort" in event.reason
    assert a.mgr.has_sequence(SENT) and b.unchanged_since(before) and counts(b) == gauges
    honest()
    expected = a.sequence_bytes(SENT)
    served = Served(receiver)
    assert sender.send(SENT, receiver.address, RECEIVED).status == "sent"
    event, = served.wait()
    assert event.seq_id == RECEIVED and np.array_equal(b.sequence_bytes(RECEIVED).numpy(), expected.numpy())
    receiver.close()
    sender.close()


@pytest.mark.parametrize("bad, match", [
    (dict(pieces=[0, 3]), "pieces must be growing layer indices from 0 to 5"),
    (dict(pieces=[0, 3, 2, 5]), "pieces must be growing"), (dict(pieces=[1, 5]), "pieces must be growing"),
    (dict(pieces=[0, 2.5, 5]), "pieces must be growing"), (dict(pieces="0,5"), "pieces must be growing"),
    (dict(after=[0, 0, 3, 1]), "waits must be 4 ints, each at most its piece's index"),
    (dict(after=[0, 0, 0]), "waits must be 4 ints"), (dict(after=[0, -1, 0, 2]), "waits must be 4 ints")])
def test_pieces_that_are_not_whole_layers_in_order_are_refused_before_any_byte_moves(endpoints, monkeypatch, bad,
                                                                                      match):
    a, b = pool("row_space", seed=1), pool("elastic", seed=2)
    prefill(a, SENT, prompt(700))  # five layers, four pieces
    sender, receiver = sides(endpoints, a, b, staging=(SMALL, SMALL))
    from ukv_torch.disagg import Channel
    send = Channel.send
    monkeypatch.setattr(Channel, "send", lambda channel, message: send(
        channel, dict(message, **bad) if message["type"] == "accept" else message))
    assert_answer_refused(sender, receiver, a, b, "the receiver's " + match,
                          lambda: monkeypatch.setattr(Channel, "send", send))


def answer_to(receiver, channel, message):
    """Send a message to the receiver and serve it; (events, the answer)."""
    channel.send(message)
    events = []
    for _ in range(int(BOUND_S / 0.1)):
        events += receiver.poll(0.1)
        if channel.ready(0):
            return events, channel.receive(BOUND_S)
    raise AssertionError("no answer")


def test_a_replayed_completion_or_offer_starts_nothing(endpoints, monkeypatch):
    from ukv_torch.disagg import Channel
    a, b = pool("row_space", seed=1), pool("elastic", seed=2)
    prefill(a, SENT, prompt(700))
    sender, receiver = sides(endpoints, a, b, staging=(SMALL, SMALL))
    original = Channel.send
    log = recorded(monkeypatch)
    served = Served(receiver)
    assert sender.send(SENT, receiver.address, RECEIVED).status == "sent"
    assert len(served.wait()) == 1
    monkeypatch.setattr(Channel, "send", original)
    sent = {message["type"]: message for message in log}
    gauges, kv = counts(b), b.snapshot()
    replay = Channel.connect(receiver.address, BOUND_S)
    for message, expected in ((sent["done"], "duplicate"), (sent["done"], "duplicate"),
                              (dict(sent["done"], xfer="never-offered"), "unknown")):
        events, answer = answer_to(receiver, replay, message)
        assert not events and answer == dict(type="ack", xfer=message["xfer"], status=expected)
    events, answer = answer_to(receiver, replay, sent["written"])  # a piece's word outside its transfer
    assert not events and answer["type"] == "error" and "unexpected message 'written'" in answer["reason"]
    events, answer = answer_to(receiver, replay, sent["offer"])
    assert not events and answer["type"] == "error" and "replayed offer" in answer["reason"]
    events, answer = answer_to(receiver, replay, dict(type="ping", nonce="n1"))  # answered outside a transfer too
    assert not events and answer == dict(type="pong", nonce="n1")
    assert counts(b) == gauges and b.unchanged_since(kv) and b.mgr.num_computed(RECEIVED) == 700
    replay.close()
    receiver.close()
    sender.close()


def test_a_silent_sender_times_out_and_its_rows_are_freed(endpoints):
    from ukv_torch.disagg import Channel, KvReceiver
    b = pool("row_space", seed=2)
    a = pool("elastic", seed=1)
    prefill(a, SENT, prompt(700))
    gauges = counts(b)
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=1.0)
    sender, _ = sides(endpoints, a, pool("elastic"))
    export = a.mgr.describe_sequence(SENT)
    offer = dict(type="offer", xfer="silent", seq_id=RECEIVED, tokens=export.tokens.numpy().astype(np.int32).tobytes(),
                 num_computed=export.num_computed, salt=0, config=export.config.encode(),
                 geometry=sender.regions.geometry(), nbytes=int(sender.regions.runs(export, 0)[:, 2].sum()),
                 piece_bytes=1 << 20)
    silent = Channel.connect(receiver.address, BOUND_S)
    silent.send(offer)
    started = time.monotonic()
    served = Served(receiver)
    event, = served.wait()
    assert event.seq_id == RECEIVED and "went away" in event.reason
    assert time.monotonic() - started < BOUND_S
    assert counts(b) == gauges and not b.mgr.has_sequence(RECEIVED)
    silent.close()
    receiver.close()
    sender.close()


def test_a_sender_that_dies_mid_transfer_leaves_nothing_behind(endpoints):
    from ukv_torch.disagg import KvReceiver
    b = pool("elastic", seed=2)
    gauges = counts(b)
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=BOUND_S)
    served = Served(receiver)
    dying = peer("sender-dies", *receiver.address)
    event, = served.wait()
    assert dying.wait(BOUND_S) == 3
    assert event.seq_id == 5 and "went away" in event.reason
    assert counts(b) == gauges and not b.mgr.has_sequence(5)
    receiver.close()


@pytest.mark.parametrize("free_on_failure", [False, True])
def test_a_receiver_that_dies_fails_the_send_in_bounded_time(endpoints, free_on_failure):
    a = pool("row_space", seed=1)
    prefill(a, SENT, prompt(700))
    dying = peer("receiver-dies")
    ready = dying.stdout.readline().split()
    assert ready[0] == "READY", ready
    sender, _ = sides(endpoints, a, pool("elastic"), free_on_failure=free_on_failure)
    started = time.monotonic()
    result = sender.send(SENT, (ready[1], int(ready[2])), RECEIVED)
    assert time.monotonic() - started < BOUND_S
    assert result.status == "failed" and result.reason
    assert a.mgr.has_sequence(SENT) != free_on_failure
    assert dying.wait(BOUND_S) == 3
    sender.close()


HUNG_TIMEOUT_S = 2.0  # the waiting side's timeout in the tests of a hung peer


def test_a_sender_that_hangs_mid_transfer_times_out_and_leaves_nothing_behind(endpoints):
    from ukv_torch.disagg import KvReceiver
    b = pool("elastic", seed=2)
    gauges, kv = counts(b), b.snapshot()
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=HUNG_TIMEOUT_S, staging_bytes=SMALL)
    accepted = []
    await_pieces = receiver._await_pieces
    receiver._await_pieces = lambda channel, move: accepted.append(time.monotonic()) or await_pieces(channel, move)
    served = Served(receiver)
    hung = peer("sender-hangs", *receiver.address)  # said piece 0 written, then stopped: alive, silent
    try:
        event, = served.wait()
        waited = time.monotonic() - accepted[0]
        assert hung.poll() is None  # still there: it hangs, it did not die
    finally:
        hung.kill()
        hung.wait(BOUND_S)
    assert event.seq_id == 5 and "went away at piece 1 of 4" in event.reason
    assert HUNG_TIMEOUT_S <= waited < HUNG_TIMEOUT_S + 5
    # the rows are freed; the piece that landed stays in rows that are free again
    assert counts(b) == gauges and not b.mgr.has_sequence(5)
    receiver.close()


@pytest.mark.parametrize("receiver_staging, free_on_failure", [(0, False), (SMALL, False), (SMALL, True)])
def test_a_receiver_that_hangs_fails_the_send_within_the_timeout(endpoints, receiver_staging, free_on_failure):
    """A receiver that accepted and then never answers: with a slot to fill
    twice the sender waits for its "scattered" mid-transfer, without one for
    its acknowledgement. Either wait ends after the timeout."""
    a = pool("row_space", seed=1)
    before_prefill = counts(a)
    prefill(a, SENT, prompt(700))
    before_send = counts(a)
    hung = peer("receiver-hangs", receiver_staging)
    try:
        ready = hung.stdout.readline().split()
        assert ready[0] == "READY", ready
        sender, _ = sides(endpoints, a, pool("elastic"), timeout_s=HUNG_TIMEOUT_S, free_on_failure=free_on_failure)
        started = time.monotonic()
        result = sender.send(SENT, (ready[1], int(ready[2])), RECEIVED)
        waited = time.monotonic() - started
        assert hung.poll() is None
    finally:
        hung.kill()
        hung.wait(BOUND_S)
    assert result.status == "failed" and "TimeoutError" in result.reason
    assert ("0 scattered" in result.reason) == bool(receiver_staging), result.reason
    assert HUNG_TIMEOUT_S <= waited < HUNG_TIMEOUT_S + 5
    assert a.mgr.has_sequence(SENT) != free_on_failure
    assert counts(a) == (before_prefill if free_on_failure else before_send)
    sender.close()


def test_a_sender_frozen_mid_transfer_times_out_and_the_receiver_serves_on(endpoints):
    """A sender stopped with SIGSTOP, its transfer engine holding writes into
    the receiver's staging buffer: the receiver gives up after its timeout,
    frees the rows and takes the next sequence while that sender is still
    frozen."""
    from ukv_torch.disagg import Arrival, KvReceiver, KvSender
    b = pool("elastic", seed=2)
    gauges = counts(b)
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=HUNG_TIMEOUT_S, staging_bytes=SMALL)
    accepted = []
    await_pieces = receiver._await_pieces
    receiver._await_pieces = lambda channel, move: accepted.append(time.monotonic()) or await_pieces(channel, move)
    served = Served(receiver)
    frozen = peer("sender-freezes", *receiver.address)
    try:
        event, = served.wait()
        waited = time.monotonic() - accepted[0]
        assert stopped(frozen)
        assert event.seq_id == 5 and re.search("went away at piece [01] of 4", event.reason), event
        assert HUNG_TIMEOUT_S <= waited < HUNG_TIMEOUT_S + 5
        assert counts(b) == gauges and not b.mgr.has_sequence(5)
        a = pool("row_space", seed=1)
        prefill(a, SENT, prompt(700))
        expected = a.sequence_bytes(SENT)
        sender = KvSender(a.mgr, a.plan, a.kv, endpoints[0], timeout_s=HUNG_TIMEOUT_S)
        served = Served(receiver)
        result = sender.send(SENT, receiver.address, RECEIVED)
        event, = served.wait()
        assert stopped(frozen)
    finally:
        frozen.kill()
        frozen.wait(BOUND_S)
    assert result.status == "sent" and isinstance(event, Arrival) and event.seq_id == RECEIVED
    assert np.array_equal(b.sequence_bytes(RECEIVED).numpy(), expected.numpy())
    receiver.close()
    sender.close()


class EngineCalls:
    """A transfer engine that notes the peer named by each of its calls that
    name one (writes, and the probe that none of ours makes)."""

    def __init__(self, engine):
        self._engine, self.peers = engine, []

    def batch_transfer_async_write(self, peer, *args):
        self.peers.append(peer)
        return self._engine.batch_transfer_async_write(peer, *args)

    def send_probe(self, peer):
        self.peers.append(peer)
        return self._engine.send_probe(peer)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def spied(endpoint) -> EngineCalls:
    endpoint._engine = EngineCalls(endpoint._engine)
    return endpoint._engine


def freeze(process) -> None:
    os.kill(process.pid, signal.SIGSTOP)
    while not stopped(process):
        time.sleep(0.001)


@pytest.mark.parametrize("served, free_on_failure", [(0, False), (0, True), (1, False)])
def test_a_frozen_receiver_fails_the_send_at_its_ping_and_the_sender_serves_on(endpoints, monkeypatch, served,
                                                                               free_on_failure):
    """A receiver stopped with SIGSTOP as its accept arrives, its transfer
    engine too; with served=1 this sender's engine reached it before. It
    cannot answer the ping that precedes the first write, so the send fails
    after the timeout with no call of the transfer engine made towards it
    (whose handshake would wait a minute for it, holding every other write
    and handshake), the sequence kept or freed as configured, and the next
    send, to a receiver that answers, goes through at once."""
    from ukv_torch.disagg import Channel, KvReceiver, KvSender
    a = pool("row_space", seed=1)
    frozen = peer("receiver-serves")
    receive, accepts = Channel.receive, []
    calls = spied(endpoints[0])

    def freeze_at_the_accept(channel, timeout_s):
        message = receive(channel, timeout_s)
        if message.get("type") == "accept":
            accepts.append(message)
            if len(accepts) == served + 1:
                freeze(frozen)
        return message

    monkeypatch.setattr(Channel, "receive", freeze_at_the_accept)
    try:
        ready = frozen.stdout.readline().split()
        assert ready[0] == "READY", ready
        address = (ready[1], int(ready[2]))
        sender = KvSender(a.mgr, a.plan, a.kv, endpoints[0], timeout_s=HUNG_TIMEOUT_S,
                          free_on_failure=free_on_failure)
        for i in range(served):
            prefill(a, 20 + i, prompt(700, seed=20 + i))
            assert sender.send(20 + i, address).status == "sent"
        assert len(calls.peers) > 0 if served else calls.peers == []
        called = len(calls.peers)
        before_prefill = counts(a)
        prefill(a, SENT, prompt(700))
        before_send = counts(a)
        started = time.monotonic()
        result = sender.send(SENT, address, RECEIVED)
        waited = time.monotonic() - started
        assert stopped(frozen)
        assert calls.peers[called:] == []  # the engine was never pointed at the frozen receiver
        b = pool("elastic", seed=2)
        receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=HUNG_TIMEOUT_S)
        prefill(a, 2, prompt(500, seed=2))
        expected = a.sequence_bytes(2)
        healthy = Served(receiver)
        started = time.monotonic()
        next_result = sender.send(2, receiver.address)
        next_took = time.monotonic() - started
        healthy.wait()
        assert stopped(frozen)
    finally:
        frozen.kill()
        frozen.wait(BOUND_S)
    assert result.status == "failed" and result.reason == (
        f"TimeoutError: the peer did not answer a ping within {HUNG_TIMEOUT_S:.1f} s: no write was handed to the "
        "transfer engine"), result
    assert HUNG_TIMEOUT_S <= waited < HUNG_TIMEOUT_S + 5
    assert a.mgr.has_sequence(SENT) != free_on_failure
    assert counts(a) == (before_prefill if free_on_failure else before_send)
    assert next_result.status == "sent" and next_took < HUNG_TIMEOUT_S, (next_result, next_took)
    assert set(calls.peers[called:]) == {endpoints[1].name}
    assert np.array_equal(b.sequence_bytes(2).numpy(), expected.numpy())
    receiver.close()
    sender.close()


def test_a_receiver_frozen_between_its_pong_and_the_handshake_holds_the_sends_only_for_their_timeouts(endpoints):
    """The window the ping leaves: a receiver that answered it and froze
    before the engine's handshake. That handshake waits about a minute on a
    thread of its own, and no other write is handed to the engine meanwhile
    (it would wait behind the handshake's lock): this send and the next one,
    to a receiver that answers, each fail after the timeout; once the frozen
    one is gone, sends go through."""
    from ukv_torch.disagg import KvReceiver, KvSender
    a = pool("row_space", seed=1)
    frozen = peer("receiver-serves")
    b = pool("elastic", seed=2)
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=BOUND_S)  # waits for the sender's word
    calls = spied(endpoints[0])
    mark_alive, marked = endpoints[0].mark_alive, []

    def freeze_after_the_pong(name):
        mark_alive(name)
        marked.append(name)
        if len(marked) == 1:
            freeze(frozen)

    endpoints[0].mark_alive = freeze_after_the_pong
    try:
        ready = frozen.stdout.readline().split()
        assert ready[0] == "READY", ready
        sender = KvSender(a.mgr, a.plan, a.kv, endpoints[0], timeout_s=HUNG_TIMEOUT_S)
        prefill(a, SENT, prompt(700))
        started = time.monotonic()
        result = sender.send(SENT, (ready[1], int(ready[2])), RECEIVED)
        waited = time.monotonic() - started
        assert stopped(frozen)
        healthy = Served(receiver)
        started = time.monotonic()
        held = sender.send(SENT, receiver.address, RECEIVED)
        held_for = time.monotonic() - started
        aborted, = healthy.wait()
        assert stopped(frozen)
        # the frozen receiver's handshake is the engine's only call; the healthy one answered, and waited
        assert marked == [marked[0], endpoints[1].name] and calls.peers == [marked[0]]
    finally:
        frozen.kill()
        frozen.wait(BOUND_S)
    for failed, took in ((result, waited), (held, held_for)):
        assert failed.status == "failed" and "TimeoutError: no progress for" in failed.reason, failed
        assert HUNG_TIMEOUT_S <= took < HUNG_TIMEOUT_S + 5
    assert aborted.seq_id == RECEIVED and "abort" in aborted.reason and a.mgr.has_sequence(SENT)
    served = Served(receiver)
    deadline = time.monotonic() + BOUND_S  # the killed peer's handshake ends, and the lock with it
    while (result := sender.send(SENT, receiver.address, RECEIVED)).status != "sent" and time.monotonic() < deadline:
        pass
    assert result.status == "sent" and served.wait()[-1].seq_id == RECEIVED
    receiver.close()
    sender.close()


def test_no_write_goes_to_a_peer_not_reached_without_a_fresh_answer_to_a_ping(endpoints, monkeypatch):
    """The endpoint's own rule, whoever calls it: the first write to a peer
    fails, with no call of the engine, unless the peer answered a ping
    within PING_FRESH_S; then it lands."""
    from ukv_torch.disagg import endpoint as endpoint_module
    from ukv_torch.disagg.endpoint import WriteFailed
    writer, target = endpoints
    src, dst = torch.arange(4096, dtype=torch.int64).to(torch.uint8), torch.zeros(4096, dtype=torch.uint8)
    writer.register([(src.data_ptr(), src.numel())])
    target.register([(dst.data_ptr(), dst.numel())])
    calls = spied(writer)
    writes = np.array([[src.data_ptr(), dst.data_ptr(), src.numel()]])
    with pytest.raises(WriteFailed, match=f"{target.name} was not reached yet and did not answer a ping in the last "
                                          r"1\.0 s: no handshake is started with it"):
        writer.submit(target.name, writes).wait(BOUND_S)
    monkeypatch.setattr(endpoint_module, "PING_FRESH_S", 0.01)
    writer.mark_alive(target.name)
    time.sleep(0.05)  # the answer is too old now
    assert not writer.write(target.name, writes, BOUND_S)
    assert calls.peers == [] and not dst.any()
    writer.mark_alive(target.name)
    assert writer.write(target.name, writes, BOUND_S)
    assert calls.peers == [target.name] and torch.equal(dst, src)


def test_a_send_to_a_peer_that_takes_no_bytes_fails_within_the_timeout():
    """A message larger than the sockets' buffers, to a peer that never reads:
    the channel's send ends after its timeout."""
    from ukv_torch.disagg import Channel, ChannelClosed
    listener = socket.create_server(("127.0.0.1", 0))
    channel = Channel.connect(listener.getsockname()[:2], 0.5)
    unread = listener.accept()[0]
    started = time.monotonic()
    with pytest.raises(ChannelClosed, match="did not take a .*-byte message within 0.5 s"):
        channel.send(dict(runs=bytes(64 << 20)))
    assert 0.5 <= time.monotonic() - started < 5
    for s in (channel, unread, listener):
        s.close()


@pytest.mark.parametrize("timeout_s", [0, -1.0, "5", True])
def test_a_channel_timeout_must_be_positive(timeout_s):
    from ukv_torch.disagg import Channel
    with socket.socket() as sock, pytest.raises(ValueError, match="Channel: timeout_s must be a number > 0 or None"):
        Channel(sock, timeout_s)


def test_a_ping_passes_only_with_the_peers_own_answer():
    """A peer whose socket takes the ping but that never answers (what a
    stopped process's kernel does) fails it after its timeout; an answer that
    is not this ping's pong is refused; the peer's pong passes."""
    import threading
    from ukv_torch.disagg import Channel, ChannelClosed
    listener = socket.create_server(("127.0.0.1", 0))

    def pair():
        channel = Channel.connect(listener.getsockname()[:2], 5)
        return channel, Channel(listener.accept()[0], 5)

    silent, silent_peer = pair()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="the peer did not answer a ping within 0.5 s"):
        silent.ping(0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert silent_peer.receive(5)["type"] == "ping"  # it arrived; nobody answered
    stale, stale_peer = pair()
    stale_peer.send(dict(type="pong", nonce="an older ping's"))
    with pytest.raises(ChannelClosed, match="answered a ping with 'pong', expected this ping's 'pong'"):
        stale.ping(5)
    answered, answering_peer = pair()
    answering = threading.Thread(target=lambda: answering_peer.pong(answering_peer.receive(5)))
    answering.start()
    answered.ping(5)
    answering.join()
    for channel in (silent, silent_peer, stale, stale_peer, answered, answering_peer):
        channel.close()
    listener.close()


@pytest.mark.parametrize("timeout_s", [0, -1.0, True, "1"])
def test_a_ping_timeout_must_be_a_positive_number(timeout_s):
    from ukv_torch.disagg import Channel
    with socket.socket() as sock, pytest.raises(ValueError, match="Channel.ping: timeout_s must be a number > 0"):
        Channel(sock).ping(timeout_s)


def test_closing_an_endpoint_frees_its_engine_at_once(endpoints):
    """Freeing an engine stalls every thread of the process for about a
    second, so close frees it then, not a later garbage collection; the
    endpoint takes nothing more."""
    import gc
    import weakref
    writer, target = endpoints
    src = torch.zeros(4096, dtype=torch.uint8)
    writer.register([(src.data_ptr(), src.numel())])
    engine = weakref.ref(spied(writer))
    gc.disable()
    try:
        writer.close()
        assert engine() is None  # freed by close itself, not left to the collector
    finally:
        gc.enable()
    assert writer.memory == []
    for call in (lambda: writer.submit(target.name, np.zeros((1, 3), dtype=np.int64)), lambda: writer.register([])):
        with pytest.raises(RuntimeError, match="the endpoint is closed"):
            call()
    writer.close()  # a second close does nothing


@pytest.mark.parametrize("call, match", [
    (lambda e: e.submit("", np.zeros((1, 3), dtype=np.int64)), "TransferEndpoint.submit: peer must be"),
    (lambda e: e.submit(7, np.zeros((1, 3), dtype=np.int64)), "TransferEndpoint.submit: peer must be"),
    (lambda e: e.submit("127.0.0.1:1", np.zeros((1, 2), dtype=np.int64)),
     r"writes must be an integer array .* shape \(n, 3\), got int64 array of shape \(1, 2\)"),
    (lambda e: e.submit("127.0.0.1:1", np.zeros((1, 3))), "writes must be an integer array .* got float64 array"),
    (lambda e: e.submit("127.0.0.1:1", [[0, 0, 0]]), "writes must be an integer array .* got list"),
    (lambda e: e.mark_alive(None), "TransferEndpoint.mark_alive: peer must be"),
    (lambda e: e.write("127.0.0.1:1", np.zeros((1, 3), dtype=np.int64), 0), "TransferEndpoint.write: timeout_s must"),
])
def test_an_endpoint_names_the_argument_it_cannot_take(endpoints, call, match):
    calls = spied(endpoints[0])
    with pytest.raises(ValueError, match=match):
        call(endpoints[0])
    assert calls.peers == []


@pytest.mark.parametrize("options, match", [(dict(timeout_s=0), "KvSender: timeout_s must be a number > 0"),
                                            (dict(timeout_s="30"), "KvSender: timeout_s must be a number > 0"),
                                            (dict(free_on_failure="no"), "KvSender: free_on_failure must be a bool")])
def test_a_sender_option_it_cannot_take_is_named(endpoints, options, match):
    from ukv_torch.disagg import KvSender
    a = pool("row_space", seed=1)
    with pytest.raises(ValueError, match=match):
        KvSender(a.mgr, a.plan, a.kv, endpoints[0], **options)
    assert endpoints[0].memory == []  # nothing registered


@pytest.mark.parametrize("timeout_s", [0, "30", None])
def test_a_receiver_timeout_it_cannot_take_is_named(endpoints, timeout_s):
    from ukv_torch.disagg import KvReceiver
    b = pool("elastic", seed=2)
    with pytest.raises(ValueError, match=f"KvReceiver: timeout_s must be a number > 0, got {timeout_s!r}"):
        KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=timeout_s)
    assert endpoints[1].memory == []


@pytest.mark.parametrize("side", ["sender", "receiver"])
def test_kv_tensors_not_the_plans_are_refused_at_construction_by_name(endpoints, side):
    """The tensors are checked once, when a side is made (its handshakes then use
    them unchecked): another budget's tensors of the same layout are refused there."""
    from ukv_torch.disagg import KvReceiver, KvSender
    p, other = pool("row_space", seed=1), pool("row_space", budget=3 << 20, seed=2)
    cls = KvSender if side == "sender" else KvReceiver
    with pytest.raises(ValueError, match=r"^kv\.planes\[0\] must be the plan's .* another model or plan"):
        cls(p.mgr, p.plan, other.kv, endpoints[0])
    assert endpoints[0].memory == []  # nothing registered


@pytest.mark.parametrize("receiver, receiver_seq_id, match", [
    ("127.0.0.1:5000", None, "KvSender.send: receiver must be a \\(host, port\\) pair"),
    (("127.0.0.1", "5000"), None, "receiver must be"), (("127.0.0.1", 0), None, "receiver must be"),
    (("", 5000), None, "receiver must be"), (("127.0.0.1", 5000, 1), None, "receiver must be"),
    (("127.0.0.1", 5000), "9", "KvSender.send: receiver_seq_id must be an int or None, got '9'")])
def test_a_send_argument_it_cannot_take_is_named_and_the_sequence_stays(endpoints, receiver, receiver_seq_id, match):
    from ukv_torch.disagg import KvSender
    a = pool("row_space", seed=1)
    prefill(a, SENT, prompt(700))
    gauges = counts(a)
    sender = KvSender(a.mgr, a.plan, a.kv, endpoints[0], timeout_s=HUNG_TIMEOUT_S, free_on_failure=True)
    with pytest.raises(ValueError, match=match):
        sender.send(SENT, receiver, receiver_seq_id)
    assert a.mgr.has_sequence(SENT) and counts(a) == gauges and sender._channels == {}
    sender.close()


def test_a_malformed_message_is_answered_and_changes_nothing(endpoints):
    from ukv_torch.disagg import Channel, KvReceiver
    b = pool("elastic", seed=2)
    gauges, kv = counts(b), b.snapshot()
    receiver = KvReceiver(b.mgr, b.plan, b.kv, endpoints[1], timeout_s=5)
    peer_channel = Channel.connect(receiver.address, BOUND_S)
    for message, reason in ((dict(type="offer", xfer="x", seq_id=3), "KeyError"),
                            (dict(type="offer", xfer="y", seq_id=3, geometry=7), "TypeError"),
                            (dict(type="hello"), "unexpected message 'hello'")):
        events, answer = answer_to(receiver, peer_channel, message)
        assert not events and answer["type"] == "error" and reason in answer["reason"]
    assert counts(b) == gauges and b.unchanged_since(kv)
    peer_channel.close()
    receiver.close()


# --- KV on a GPU: every piece through host staging -------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("a_device, b_device, staging", [
    ("cuda", "cuda", (STAGED, STAGED)), ("cuda", "cuda", (SMALL, SMALL)), ("cuda", "cpu", (SMALL, 0)),
    ("cpu", "cuda", (0, SMALL)), ("cuda", "cuda", (STAGED, SMALL))])
@pytest.mark.parametrize("a_layout, b_layout, b_page", [("row_space", "elastic", 0), ("static", "row_space", 64)])
def test_kv_on_a_gpu_moves_through_host_staging(endpoints, a_device, b_device, staging, a_layout, b_layout, b_page):
    a = pool(a_layout, seed=1, device=a_device)
    b = pool(b_layout, page=b_page, seed=2, device=b_device)
    tokens = prompt(700)
    prefill(b, 3, tokens[:600])  # b holds the first blocks: only the rest travels
    b.mgr.deallocate(3)
    prefill(a, SENT, tokens)
    expected = a.sequence_bytes(SENT)
    sender, receiver = sides(endpoints, a, b, staging=staging)
    # the transfer engine is given host memory only: the staging of a side whose KV is on the GPU
    for side, device, nbytes in ((sender, a_device, staging[0]), (receiver, b_device, staging[1])):
        if device == "cuda":
            assert side.endpoint.memory == [(side._staging.buffer.data_ptr(), nbytes)]
    served = Served(receiver)
    result = sender.send(SENT, receiver.address, RECEIVED)
    event, = served.wait()
    torch.cuda.synchronize()
    assert result.status == "sent" and result.answer == event.cached > 0 and not a.mgr.has_sequence(SENT)
    got = b.sequence_bytes(RECEIVED)
    beyond = receiver.regions.runs(b.mgr.describe_sequence(RECEIVED), event.cached)
    assert result.nbytes == int(beyond[:, 2].sum())
    for offset, _, size in beyond.tolist():
        assert np.array_equal(got[offset: offset + size].numpy(), expected[offset: offset + size].numpy())
    receiver.close()
    sender.close()


@pytest.mark.gpu
@pytest.mark.parametrize("side", ["sender", "receiver"])
def test_kv_on_a_gpu_without_staging_is_refused_by_name(endpoints, side):
    from ukv_torch.disagg import KvReceiver, KvSender
    p = pool("row_space", device="cuda")
    cls = KvSender if side == "sender" else KvReceiver
    with pytest.raises(ValueError, match=f"Kv{side.capitalize()}: KV on cuda:0 goes through host staging.*"
                                         f"staging_bytes must be > 0"):
        cls(p.mgr, p.plan, p.kv, endpoints[0], staging_bytes=0)
    assert endpoints[0].memory == []  # nothing registered


@pytest.mark.gpu
def test_a_layer_larger_than_the_senders_staging_is_refused_before_the_offer(endpoints):
    a, b = pool("row_space", seed=1, device="cuda"), pool("elastic", seed=2, device="cuda")
    prefill(a, SENT, prompt(700))
    before, gauges = b.snapshot(), counts(b)
    sender, receiver = sides(endpoints, a, b, staging=(4096, SMALL))  # 2 KiB a piece: no layer fits
    served = Served(receiver)
    with pytest.raises(ValueError, match=r"KvSender.send: sequence 1 has a layer of \d+ bytes.*make staging_bytes at "
                                         r"least \d+"):
        sender.send(SENT, receiver.address, RECEIVED)
    assert served.stop() == []
    assert a.mgr.has_sequence(SENT) and b.unchanged_since(before) and counts(b) == gauges
    receiver.close()
    sender.close()


@pytest.mark.gpu
def test_a_layer_larger_than_the_receivers_staging_is_refused_by_name(endpoints):
    assert_refused_by_name(endpoints, pool("row_space", seed=1, device="cuda"),
                           pool("elastic", seed=2, device="cuda"),
                           r"the receiver refused sequence 1: ValueError: a layer of \d+ bytes, more than half of this "
                           r"receiver's staging_bytes \(4096\)", staging=(SMALL, 4096))
