"""The prefill side of a disaggregated transfer (docs/serving-loop.md,
"Prefill and decode on different engines").

`KvSender.send` offers a decoding sequence to a receiver, and on its answer:
- refused (NOT_NOW / NEVER_FITS): nothing moved, the sequence stays here;
- accepted with the receiver's rows and pieces: checks them (inside the
  receiver's registered KV, the buffer's bytes once each, exactly what the
  sequence holds, pieces of whole layers) before any byte moves, pings the
  receiver as it starts checking and waits for the pong before the first
  write (its process must answer now: the accept may be from a process
  that froze since, and the transfer engine must never be the one to meet a
  frozen peer, see endpoint.py), then moves the pieces in order: a piece's
  writes go to the transfer engine, which
  moves them on its own threads while this one gathers the next piece and
  tells the receiver "written k" for each piece that landed. After the last
  one it says "done", and frees the sequence here once the receiver
  acknowledged that it started it.
With ``staging_bytes`` each piece is first gathered into a registered buffer
of that size, the pieces placed in it in turn, and written from there (see
KvReceiver for when that pays): gathered only once the pieces there before
it landed. The first layer, every transfer's first piece, is gathered while
the receiver admits the sequence, so the first write starts once the answer
is checked. Into a receiver's staging buffer smaller than the sequence a
piece is written only once the receiver said it scattered the pieces there
before it ("scattered k"). Between the offer and the acknowledgement the
caller runs no step, so no row of the sequence moves or is reused while it
is read.

A receiver that dies, does not answer the ping, or stays silent or stops
taking bytes for ``timeout_s``, makes the send fail
(`SendResult.status == "failed"`); the
sequence is then kept, or freed with ``free_on_failure``. Rows the receiver
names wrongly, another model geometry, or (KV on a GPU) a layer too large
for two of it to fit either side's staging, raise ValueError with nothing
written and the sequence kept.
"""
from __future__ import annotations

import collections
import time
import uuid
from typing import Deque, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..manager.kv_manager import KvManager
from ..plan.records import KvPlan
from ..plan.unified_kv import UnifiedKv
from ..transfer import SequenceExport, SequenceRows
from .channel import Channel, ChannelClosed, check_timeout
from .endpoint import POLL_S, TransferEndpoint, WriteFailed, Writes
from .kv_regions import (PIECE_BYTES, KvRegions, Staging, check_after, check_destination, check_pieces, cut, join,
                         registered)


class SendResult(NamedTuple):
    status: str                 # "sent", "refused" or "failed"
    answer: Optional[int]       # sent: the receiver's cached prefix; refused: NOT_NOW / NEVER_FITS
    reason: str = ""            # failed: what went wrong
    nbytes: int = 0             # bytes written
    write_seconds: float = 0.0  # from the first piece's gather to the last piece landed
    host_seconds: float = 0.0   # describing, checking, joining and gathering the rows here (no waiting)


def offer_message(regions: KvRegions, export: SequenceExport, bounds: np.ndarray, xfer: str, seq_id: int,
                  piece_bytes: int) -> dict:
    """The offer of transfer ``xfer``: what a receiver admits the sequence from (its tokens,
    computed count, salt and configuration, under ``seq_id`` there), what it checks
    (the geometry, the buffer's bytes from the layer ``bounds``), and the most bytes of a
    piece this side takes."""
    return dict(type="offer", xfer=xfer, seq_id=seq_id, tokens=export.tokens.numpy().astype(np.int32).tobytes(),
                num_computed=export.num_computed, salt=export.salt, config=export.config.encode(),
                geometry=regions.geometry(), nbytes=int(bounds[-1]), piece_bytes=piece_bytes)


class KvSender:
    """Sends sequences of ``mgr`` (KV tensors ``kv`` of ``plan``) to receivers
    (see the module docstring)."""

    def __init__(self, mgr: KvManager, plan: KvPlan, kv: UnifiedKv, endpoint: TransferEndpoint, *,
                 timeout_s: float = 30.0, free_on_failure: bool = False, staging_bytes: int = 0):
        check_timeout("KvSender", timeout_s)
        if not isinstance(free_on_failure, bool):
            raise ValueError(f"KvSender: free_on_failure must be a bool, got {free_on_failure!r}")
        self.mgr, self.plan, self.kv, self.endpoint = mgr, plan, kv, endpoint
        self.timeout_s, self.free_on_failure = timeout_s, free_on_failure
        self.regions = KvRegions(plan, kv)
        self._staging = Staging(staging_bytes, "KvSender", self.regions.device)
        endpoint.register(self._memory())
        self._channels: Dict[Tuple[str, int], Channel] = {}

    def send(self, seq_id: int, receiver: Tuple[str, int], receiver_seq_id: Optional[int] = None) -> SendResult:
        """Move decoding sequence ``seq_id`` to the receiver listening at
        ``receiver`` (its KvReceiver.address), under ``receiver_seq_id`` there
        (default: the same id)."""
        if not (isinstance(receiver, (tuple, list)) and len(receiver) == 2 and isinstance(receiver[0], str)
                and receiver[0] and isinstance(receiver[1], int) and not isinstance(receiver[1], bool)
                and 0 < receiver[1] < 65536):
            raise ValueError(f"KvSender.send: receiver must be a (host, port) pair such as KvReceiver.address, "
                             f"got {receiver!r}")
        if receiver_seq_id is not None and (isinstance(receiver_seq_id, bool) or not isinstance(receiver_seq_id, int)):
            raise ValueError(f"KvSender.send: receiver_seq_id must be an int or None, got {receiver_seq_id!r}")
        receiver = tuple(receiver)  # the key of its channel
        started = time.perf_counter()
        export = self.mgr.describe_sequence(seq_id)
        bounds = self.regions.layer_bounds(export)
        largest = int(np.diff(bounds).max())
        if self._staging.on_device and not self._staging.holds(largest):
            raise ValueError(f"KvSender.send: sequence {seq_id} has a layer of {largest} bytes, more than half of "
                             f"staging_bytes ({2 * self._staging.capacity}), which KV on {self.regions.device} "
                             f"goes through: make staging_bytes at least {2 * largest}")
        xfer = uuid.uuid4().hex
        # the receiver groups layers into pieces no larger, so that two fit here
        limit = PIECE_BYTES
        if self._staging.holds(largest):
            limit = min(limit, self._staging.capacity)
        offer = offer_message(self.regions, export, bounds, xfer,
                              seq_id if receiver_seq_id is None else receiver_seq_id, limit)
        host = time.perf_counter() - started
        try:
            channel = self._channel(receiver)
            channel.send(offer)
            preparing = time.perf_counter()
            prepared = self._prepare(export, bounds, channel)
            host += time.perf_counter() - preparing
            answer = channel.receive(self.timeout_s)
        except (ChannelClosed, TimeoutError) as e:
            return self._failed(seq_id, receiver, f"no answer to the offer: {e}")
        answered = time.perf_counter()
        if answer.get("type") == "refused":
            return SendResult("refused", int(answer["answer"]))
        if answer.get("type") != "accept":
            raise ValueError(f"the receiver refused sequence {seq_id}: {answer.get('reason', answer.get('type'))}")
        try:  # answered while the answer is checked: a process frozen since its accept fails the send before
            nonce = channel.send_ping()  # the first write (run), with no call of the engine made towards it
        except ChannelClosed as e:
            return self._failed(seq_id, receiver, f"the receiver went away after its accept: {e}")
        try:
            pipeline = _Pipeline(self, channel, xfer, export, answer, bounds, prepared, nonce)
        except Exception as e:  # whatever stops the write, the receiver's admission must be undone
            self._tell(receiver, dict(type="abort", xfer=xfer, reason=f"the sender gave up: {e}"))
            self._channels.pop(receiver).close()  # its pong may be on the way: a later send connects anew
            raise
        host += time.perf_counter() - answered
        try:
            write_seconds, gathering = pipeline.run()
            channel.send(dict(type="done", xfer=xfer))
            ack = pipeline.reply()
        except Exception as e:  # the receiver's admission is undone, and no write of it stays queued here
            pipeline.cancel()
            self._tell(receiver, dict(type="abort", xfer=xfer, reason=f"the sender gave up: {e}"))
            if not isinstance(e, (WriteFailed, TimeoutError, ChannelClosed)):
                raise
            return self._failed(seq_id, receiver, f"{type(e).__name__}: {e}")
        if ack.get("status") != "started":
            return self._failed(seq_id, receiver, f"the receiver did not start it: {ack}")
        self.mgr.deallocate(seq_id)  # the receiver holds every byte now
        return SendResult("sent", int(answer["cached"]), nbytes=pipeline.nbytes, write_seconds=write_seconds,
                          host_seconds=host + gathering)

    def _prepare(self, export: SequenceExport, bounds: np.ndarray, channel: Channel) -> Optional["_Prepared"]:
        """While the receiver admits the sequence: its rows, checked, and its first layer
        gathered at the staging buffer's start, where every transfer's first piece (the
        first layer alone, kv_regions.pieces) goes. None without staging; no gather
        once the receiver answered (a refusal comes quickly)."""
        if not self._staging.holds(int(np.diff(bounds).max())):
            return None
        rows = self.regions.sequence_rows(export, self.mgr)
        if channel.ready(0):
            return _Prepared(rows, False)
        rows.gather(self._staging.at(0, int(bounds[1])), 0, 1)
        self._staging.to_host(0, int(bounds[1]))
        return _Prepared(rows, True)

    def _channel(self, receiver: Tuple[str, int]) -> Channel:
        if receiver not in self._channels:
            self._channels[receiver] = Channel.connect(receiver, self.timeout_s)
        return self._channels[receiver]

    def _tell(self, receiver: Tuple[str, int], message: dict) -> None:
        """A message whose delivery does not matter (the receiver times out anyway)."""
        try:
            self._channels[receiver].send(message)
        except (ChannelClosed, KeyError):
            pass

    def _failed(self, seq_id: int, receiver: Tuple[str, int], reason: str) -> SendResult:
        channel = self._channels.pop(receiver, None)
        if channel is not None:  # out of step after a timeout: a later send connects anew
            channel.close()
        if self.free_on_failure:
            self.mgr.deallocate(seq_id)
        return SendResult("failed", None, reason)

    def close(self) -> None:
        """Close the channels and unregister this pool's KV from the endpoint."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self.endpoint.unregister(self._memory())

    def _memory(self):
        return registered(self.regions, self._staging)


class _Prepared(NamedTuple):
    """What a sender readies while the receiver admits the sequence (KvSender._prepare)."""
    rows: SequenceRows    # the sequence's rows, none skipped
    first_layer: bool     # whether layer 0 is gathered at the staging buffer's start


class _Pipeline:
    """One accepted transfer's pieces, checked before any byte moves, then
    written in order (see the module docstring)."""

    def __init__(self, sender: KvSender, channel: Channel, xfer: str, export: SequenceExport, answer: dict,
                 bounds: np.ndarray, prepared: Optional[_Prepared], nonce: str):
        self.channel, self.xfer, self.peer, self.nonce = channel, xfer, answer["engine"], nonce
        if not isinstance(self.peer, str) or not self.peer:
            raise ValueError(f"the receiver's engine name must be a non-empty string, got {self.peer!r}")
        self.endpoint, self.timeout_s, self.staging = sender.endpoint, sender.timeout_s, sender._staging
        destination = np.frombuffer(answer["runs"], dtype=np.int64).reshape(-1, 3)
        check_destination(destination, int(bounds[-1]), [tuple(span) for span in answer["memory"]])
        self.layers = check_pieces(answer["pieces"], len(bounds) - 1)
        self.after = check_after(answer["after"], len(self.layers) - 1)  # receiver: scatter these first
        self.starts = bounds[self.layers]
        sizes = np.diff(self.starts)
        cached = int(answer["cached"])
        self.rows = held = None
        self.gathered = 0  # pieces gathered before run (the first, by _prepare)
        if self.staging.holds(int(sizes.max())):  # every piece through the buffer: gathered, written from there
            self.places, self.room = self.staging.place(sizes)  # here: these pieces must have landed first
            self.rows = prepared.rows if prepared is not None and cached == 0 else \
                sender.regions.sequence_rows(export, sender.mgr, cached)
            # a first layer gathered whole serves any cached prefix: only the bytes beyond it are written
            if prepared is not None and prepared.first_layer and self.layers[1] == 1 and self.places[0] == 0:
                self.gathered = 1
            holds = self.rows.copied
        elif self.staging.on_device:
            raise ValueError(f"the receiver's pieces (up to {int(sizes.max())} bytes) do not fit this sender's "
                             f"staging ({self.staging.capacity} bytes a piece), which its KV on a GPU goes through")
        else:
            held = sender.regions.runs(export, cached)
            holds = int(held[:, 2].sum())
        self.nbytes = int(destination[:, 2].sum())
        if self.nbytes != holds:
            raise ValueError(f"size mismatch: the receiver's rows hold {self.nbytes} bytes, "
                             f"the sequence {holds} beyond its cached prefix")
        # straight from the rows, every destination byte is checked against them here, before any byte moves
        self.writes = cut(destination if held is None else join(held, destination), self.starts)
        self.first = np.searchsorted(self.writes[:, 0], self.starts)  # piece k: rows [first[k], first[k + 1])
        self.in_flight: Deque[Tuple[int, Writes]] = collections.deque()
        self.landed = 0     # pieces that landed, each told to the receiver
        self.scattered = 0  # pieces the receiver scattered: its room that is free again

    def run(self) -> Tuple[float, float]:
        """Write every piece; (seconds from the first gather to the last piece
        landed, seconds of them spent gathering)."""
        started, gathering = time.perf_counter(), 0.0
        self._pong()
        for k in range(len(self.layers) - 1):
            if self.rows is not None and self.first[k + 1] > self.first[k] and k >= self.gathered:
                # (a piece all cached moves nothing)
                self._until(lambda: self.landed >= self.room[k])
                gathered = time.perf_counter()
                place, nbytes = self._piece(k)
                self.rows.gather(self.staging.at(place, nbytes), self.layers[k], self.layers[k + 1])
                self.staging.to_host(place, nbytes)
                gathering += time.perf_counter() - gathered
            self._until(lambda: self.scattered >= self.after[k])
            writes = self._writes(k)
            self.in_flight.append((k, self.endpoint.submit(self.peer, writes)))
        self._until(lambda: not self.in_flight)
        return time.perf_counter() - started, gathering

    def _pong(self) -> None:
        """The receiver's process answered the ping, before the first write is handed to
        the transfer engine. Nothing else is in flight on the channel yet (a "scattered"
        only follows a "written")."""
        try:
            self.channel.await_pong(self.nonce, self.timeout_s)
        except TimeoutError as e:
            raise TimeoutError(f"{e}: no write was handed to the transfer engine") from None
        self.endpoint.mark_alive(self.peer)

    def reply(self) -> dict:
        """The receiver's next message but "scattered" ones, within the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self.channel.receive(max(deadline - time.monotonic(), 0.0))
            if message.get("type") != "scattered":
                return message

    def cancel(self) -> None:
        """Stop the writes still in flight (the transfer is given up)."""
        for _, writes in self.in_flight:
            writes.cancel()

    def _piece(self, k: int) -> Tuple[int, int]:
        """Piece k's place in the staging buffer, and its bytes."""
        return int(self.places[k]), int(self.starts[k + 1] - self.starts[k])

    def _writes(self, k: int) -> np.ndarray:
        mine = self.writes[self.first[k]: self.first[k + 1]]
        if self.rows is None:
            return mine[:, 1:]
        place, nbytes = self._piece(k)
        staged = np.array([[self.starts[k], self.staging.address(place), nbytes]])
        return join(staged, mine)[:, 1:]

    def _until(self, condition) -> None:
        """Tell the receiver of the pieces that landed, and note the ones it
        scattered, until ``condition()`` holds; TimeoutError after timeout_s
        with neither."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            while self.in_flight and self.in_flight[0][1].done():
                piece, _ = self.in_flight.popleft()
                self.channel.send(dict(type="written", xfer=self.xfer, piece=piece))
                self.landed = piece + 1
                deadline = time.monotonic() + self.timeout_s
            if condition():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no progress for {self.timeout_s:.1f} s: {self.landed} of "
                                   f"{len(self.layers) - 1} pieces landed, {self.scattered} scattered")
            if self.channel.ready(POLL_S):
                message = self.channel.receive(self.timeout_s)
                if message.get("type") != "scattered" or message.get("xfer") != self.xfer or \
                        not isinstance(message.get("piece"), int):
                    raise ChannelClosed(f"the receiver answered {message.get('type')!r} mid-transfer: "
                                        f"{message.get('reason', '')}")
                self.scattered = max(self.scattered, message["piece"] + 1)
                deadline = time.monotonic() + self.timeout_s
