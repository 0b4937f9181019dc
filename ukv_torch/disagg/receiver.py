"""The decode side of a disaggregated transfer (docs/serving-loop.md,
"Prefill and decode on different engines").

The receiver listens for senders. For each offer it checks the model,
admits the sequence with `import_sequence` (a refusal is answered before any
byte moves), cuts the sequence's buffer into pieces of whole layers, and
sends back where its rows are as runs, with the pieces. The sender then
pings (answered at once: its proof that this process runs before it hands
the transfer engine a write), writes the pieces in order and says "written
k" as each landed, and "done" after the last: only then does the sequence
start (an `Arrival`). A sender that dies, says nothing for the timeout, or
aborts, costs the sequence its rows (an `Abort`), and the pool is as before
the offer.

The wait happens inside `poll`, between the engine's steps: a step may move
or reuse rows (row-space relocations, evictions), so none runs while bytes
land.

With ``staging_bytes`` the receiver names a registered buffer of that size
instead of its rows where they are short (`short`), the pieces placed in it
in turn, and scatters each piece from it once its "written" came, while the
next one lands. If a piece must go where an earlier one was (a buffer
smaller than the sequence), it answers "scattered k" as it empties each,
and its accept tells how many must be scattered before each piece is
written. A transport whose cost is per request (TCP moves ~17K requests a
second here, and a V4-Pro block is ~150 requests of a few KiB as rows)
needs that; one with cheap requests (RDMA) writes the rows directly. Each
side chooses for itself. KV on a GPU always goes through the staging, which
is then page-locked host memory with a mirror on the GPU (kv_regions.Staging).
"""
from __future__ import annotations

import collections
import select
import socket
import time
from typing import List, NamedTuple, Tuple, Union

import numpy as np
import torch

from .. import ops
from ..manager.kv_manager import KvManager
from ..plan.records import KvPlan, ServeConfig
from ..plan.unified_kv import UnifiedKv
from ..transfer import SequenceExport
from .channel import Channel, ChannelClosed, check_timeout
from .endpoint import TransferEndpoint
from .kv_regions import PIECE_BYTES, KvRegions, Staging, pieces, registered, short, staged

#: how many finished transfer ids are remembered, to answer a replayed "done"
REMEMBERED_TRANSFERS = 4096


class Arrival(NamedTuple):
    """A sequence whose rows landed: it decodes from here on."""
    seq_id: int
    cached: int          # positions that were already in this pool (not transferred)
    num_computed: int
    tokens: List[int]


class Abort(NamedTuple):
    """A sequence admitted for a transfer that did not complete; its rows are freed."""
    seq_id: int
    reason: str


class KvReceiver:
    """Receives sequences into ``mgr`` and its KV tensors ``kv`` of ``plan``
    (see the module docstring). ``timeout_s`` bounds each wait on a sender,
    for a message or to take one."""

    def __init__(self, mgr: KvManager, plan: KvPlan, kv: UnifiedKv, endpoint: TransferEndpoint, *,
                 host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0, staging_bytes: int = 0):
        check_timeout("KvReceiver", timeout_s)
        self.mgr, self.plan, self.kv, self.endpoint = mgr, plan, kv, endpoint
        self.timeout_s = timeout_s
        self.regions = KvRegions(plan, kv)
        self._staging = Staging(staging_bytes, "KvReceiver", self.regions.device)
        endpoint.register(self._memory())
        self._listener = socket.create_server((host, port))
        self.address: Tuple[str, int] = self._listener.getsockname()[:2]
        self._senders: List[Channel] = []
        self._finished = collections.OrderedDict()  # ids of the transfers that started or aborted
        self.host_seconds = 0.0  # time spent admitting, describing and scattering rows, for the benchmarks

    def poll(self, timeout_s: float = 0.0) -> List[Union[Arrival, Abort]]:
        """Accept senders and serve the messages waiting (at most ``timeout_s``
        for the first one); returns the sequences that arrived or aborted."""
        readable, _, _ = select.select([self._listener] + [c.sock for c in self._senders], [], [], timeout_s)
        events = []
        for sock in readable:
            if sock is self._listener:
                self._senders.append(Channel(self._listener.accept()[0], self.timeout_s))
                continue
            channel = next(c for c in self._senders if c.sock is sock)
            try:
                message = channel.receive(self.timeout_s)
            except (ChannelClosed, TimeoutError):
                self._drop(channel)
                continue
            try:
                event = self._serve(channel, message)
            except ChannelClosed:  # the sender went away while answered; _offer freed what it admitted
                self._drop(channel)
                continue
            if event is not None:
                events.append(event)
        return events

    def _serve(self, channel: Channel, message: dict):
        kind = message.get("type")
        if kind == "ping":
            channel.pong(message)
            return None
        if kind == "offer":
            return self._offer(channel, message)
        if kind == "done":  # not awaited: a replay, or for a transfer that ended; nothing starts
            channel.send(dict(type="ack", xfer=message.get("xfer"),
                              status="duplicate" if message.get("xfer") in self._finished else "unknown"))
            return None
        channel.send(dict(type="error", xfer=message.get("xfer"), reason=f"unexpected message {kind!r}"))
        return None

    def _offer(self, channel: Channel, offer: dict):
        started = time.perf_counter()
        xfer, seq_id = offer.get("xfer"), offer.get("seq_id")
        try:
            if xfer in self._finished:
                raise ValueError(f"transfer {xfer} already ended here: a replayed offer starts nothing")
            export, bounds, layers = self._export(offer)
            cached = self.mgr.import_sequence(seq_id, export)  # ValueError for what it refuses (a bad id, ...)
        except (ValueError, KeyError, TypeError) as e:  # KeyError, TypeError: a malformed offer
            channel.send(dict(type="error", xfer=xfer, reason=f"{type(e).__name__}: {e}"))
            return None
        if cached < 0:  # NOT_NOW / NEVER_FITS: nothing changed here, the sender keeps the sequence
            channel.send(dict(type="refused", xfer=xfer, answer=cached))
            return None
        mine = self._rows_now(seq_id)
        move = _Arriving(self, xfer, mine, cached, bounds[layers], layers)
        try:
            channel.send(dict(type="accept", xfer=xfer, cached=cached, runs=move.runs.tobytes(), pieces=layers,
                              after=move.after, engine=self.endpoint.name,
                              memory=[list(span) for span in self.endpoint.memory]))
        except ChannelClosed as e:
            self.mgr.deallocate(seq_id)
            self._remember(xfer)
            self._drop(channel)
            return Abort(seq_id, f"the sender went away: {e}")
        self.host_seconds += time.perf_counter() - started
        return self._await_pieces(channel, move)

    def _await_pieces(self, channel: Channel, move: "_Arriving"):
        """Each piece's "written" in order (scattering it from the staging
        buffer when staged), then "done": the sequence starts. A "ping" is
        answered (the sender's check that this process runs, before it hands
        its first write to the transfer engine), and the staged pieces' rows
        are taken after the pong, while the first piece is written (taken
        before, they held the pong back: a sender waited up to 0.7 ms for it
        on an H100 host). Anything else, or silence for timeout_s, aborts it."""
        seq_id, count = move.mine.seq_id, len(move.layers) - 1
        reason, k = "", 0
        try:
            while k <= count:
                message = channel.receive(self.timeout_s)
                if message.get("type") == "ping":
                    channel.pong(message)
                    started = time.perf_counter()
                    move.prepare()
                    self.host_seconds += time.perf_counter() - started
                    continue
                expected = dict(type="written", xfer=move.xfer, piece=k) if k < count else \
                    dict(type="done", xfer=move.xfer)
                if any(message.get(key) != value for key, value in expected.items()):
                    reason = f"the sender answered {message.get('type')!r} {message.get('reason', '')}, " \
                             f"expected {expected['type']!r} of piece {k}"
                    break
                if k < count and move.staged:
                    started = time.perf_counter()
                    move.scatter(k)
                    self.host_seconds += time.perf_counter() - started
                    if any(move.after):  # the sender waits for the room
                        channel.send(dict(type="scattered", xfer=move.xfer, piece=k))
                k += 1
        except (ChannelClosed, TimeoutError) as e:
            reason = f"the sender went away at piece {k} of {count}: {e}"
            self._drop(channel)
        self._remember(move.xfer)
        if reason:
            self.mgr.deallocate(seq_id)
            return Abort(seq_id, reason)
        try:
            channel.send(dict(type="ack", xfer=move.xfer, status="started"))
        except ChannelClosed:  # the bytes landed: the sequence starts; the sender learns nothing more
            self._drop(channel)
        return Arrival(seq_id, move.cached, move.mine.num_computed, move.mine.tokens.tolist())

    def _export(self, offer: dict) -> Tuple[SequenceExport, np.ndarray, List[int]]:
        """The offer as an export this pool can import, where each layer starts in
        its buffer (KvRegions.layer_bounds), and the layers where its pieces start
        (then the layer count); ValueError if the sender serves another model or
        its buffer would differ."""
        if list(offer["geometry"]) != self.regions.geometry():
            raise ValueError(f"other model geometry: the sender has {offer['geometry']}, "
                             f"this receiver {self.regions.geometry()}")
        config = ServeConfig.decode(offer["config"])
        num_computed = int(offer["num_computed"])
        tokens = torch.from_numpy(np.frombuffer(offer["tokens"], dtype=np.int32).copy())
        if not 0 < num_computed < len(tokens) + 1 or self.mgr.has_sequence(offer["seq_id"]):
            raise ValueError(f"sequence {offer['seq_id']}: {num_computed} computed of {len(tokens)} tokens, "
                             f"live here: {self.mgr.has_sequence(offer['seq_id'])}")
        empty = torch.zeros(0, dtype=torch.int32)
        export = SequenceExport(tokens, num_computed, max(0, num_computed - config.window + 1),
                                torch.zeros(0, dtype=torch.int64), empty, empty, empty.view(0, 0), config,
                                int(offer["salt"]))
        bounds = self.regions.layer_bounds(export)
        if int(bounds[-1]) != offer["nbytes"]:
            raise ValueError(f"size mismatch: the sender's buffer has {offer['nbytes']} bytes, "
                             f"this receiver's {int(bounds[-1])}")
        limit = offer["piece_bytes"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"piece_bytes must be an int > 0, got {limit!r}")
        limit = min(limit, PIECE_BYTES)
        largest = int(np.diff(bounds).max())
        if self._staging.holds(largest):  # then each piece fits twice here
            limit = min(limit, self._staging.capacity)
        elif self._staging.on_device:
            raise ValueError(f"a layer of {largest} bytes, more than half of this receiver's staging_bytes "
                             f"({2 * self._staging.capacity}), which its KV on {self.regions.device} goes through")
        return export, bounds, pieces(bounds, limit)

    def _rows_now(self, seq_id: int) -> SequenceExport:
        """The sequence's rows after the units its admission moved are applied."""
        self.mgr.stage([seq_id])
        self.mgr.upload(1)
        if self.kv.planes:
            ops.apply_row_copies(list(self.kv.planes), self.mgr.row_copies, self.mgr.row_copy_counts)
        return self.mgr.describe_sequence(seq_id)

    def _remember(self, xfer: str) -> None:
        self._finished[xfer] = True
        while len(self._finished) > REMEMBERED_TRANSFERS:
            self._finished.popitem(last=False)

    def _drop(self, channel: Channel) -> None:
        channel.close()
        if channel in self._senders:
            self._senders.remove(channel)

    def close(self) -> None:
        """Stop listening, close the channels and unregister this pool's KV from the endpoint."""
        for channel in list(self._senders):
            self._drop(channel)
        self._listener.close()
        self.endpoint.unregister(self._memory())

    def _memory(self):
        return registered(self.regions, self._staging)


class _Arriving:
    """An admitted sequence's rows as the receiver names them: straight, or
    its staging buffer (see KvReceiver)."""

    def __init__(self, receiver: KvReceiver, xfer: str, mine: SequenceExport, cached: int, starts: np.ndarray,
                 layers: List[int]):
        self.xfer, self.mine, self.cached, self.layers = xfer, mine, cached, layers
        self.staging, self._regions, self._mgr = receiver._staging, receiver.regions, receiver.mgr
        self.starts = starts  # where the pieces start in the buffer, then its end
        sizes = np.diff(self.starts)
        self.runs = receiver.regions.runs(mine, cached)
        self.rows, self.after = None, [0] * len(sizes)  # after[k]: pieces to scatter before piece k is written
        # (KV on a GPU is always staged: _export refused what its staging cannot hold)
        self.staged = self.staging.holds(int(sizes.max())) and (self.staging.on_device or short(self.runs))
        if self.staged:
            self.places, self.after = self.staging.place(sizes)
            self.runs = staged(self.runs, self.starts, self.places, self.staging)

    def prepare(self) -> None:
        """The rows the staged pieces are scattered into, checked: taken once, after the
        pong or else before the first scatter."""
        if self.staged and self.rows is None:
            self.rows = self._regions.sequence_rows(self.mine, self._mgr, self.cached)

    def scatter(self, k: int) -> None:
        """Piece k's bytes from the staging buffer into the rows."""
        self.prepare()
        place, nbytes = int(self.places[k]), int(self.starts[k + 1] - self.starts[k])
        self.staging.to_device(place, nbytes)
        self.rows.scatter(self.staging.at(place, nbytes), self.layers[k], self.layers[k + 1])
