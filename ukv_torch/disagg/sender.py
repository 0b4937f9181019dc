"""The prefill side of a disaggregated transfer (docs/serving-loop.md,
"Prefill and decode on different engines").

`KvSender.send` offers a decoding sequence to a receiver, and on its answer:
- refused (NOT_NOW / NEVER_FITS): nothing moved, the sequence stays here;
- accepted with the receiver's rows: checks them (inside the receiver's
  registered KV, the buffer's bytes once each, exactly what the sequence
  holds), writes every row straight from this pool's KV into the receiver's
  through the transfer engine, says "done", and frees the sequence here once
  the receiver acknowledged that it started it.
With ``staging_bytes`` the rows are first gathered into a registered buffer
of that size and written from there (see KvReceiver for when that pays).
Between the offer and the acknowledgement the caller runs no step, so no row
of the sequence moves or is reused while it is read.

A receiver that dies or stays silent past ``timeout_s`` makes the send fail
(`SendResult.status == "failed"`); the sequence is then kept, or freed with
``free_on_failure``. Rows the receiver names wrongly, or another model
geometry, raise ValueError with nothing written and the sequence kept.
"""
from __future__ import annotations

import time
import uuid
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..manager.kv_manager import KvManager
from ..plan.records import KvPlan
from ..plan.unified_kv import UnifiedKv
from ..transfer import gather_sequence, transfer_bytes
from .channel import Channel, ChannelClosed
from .endpoint import TransferEndpoint
from .kv_regions import KvRegions, check_destination, join, staged, staging_buffer


class SendResult(NamedTuple):
    status: str                 # "sent", "refused" or "failed"
    answer: Optional[int]       # sent: the receiver's cached prefix; refused: NOT_NOW / NEVER_FITS
    reason: str = ""            # failed: what went wrong
    nbytes: int = 0             # bytes written
    write_seconds: float = 0.0  # in the transfer engine
    host_seconds: float = 0.0   # describing, checking, gathering and joining the rows here (no waiting)


class KvSender:
    """Sends sequences of ``mgr`` (KV tensors ``kv`` of ``plan``) to receivers
    (see the module docstring)."""

    def __init__(self, mgr: KvManager, plan: KvPlan, kv: UnifiedKv, endpoint: TransferEndpoint, *,
                 timeout_s: float = 30.0, free_on_failure: bool = False, staging_bytes: int = 0):
        if not timeout_s > 0:
            raise ValueError(f"KvSender: timeout_s must be > 0, got {timeout_s!r}")
        self.mgr, self.plan, self.kv, self.endpoint = mgr, plan, kv, endpoint
        self.timeout_s, self.free_on_failure = timeout_s, free_on_failure
        self.regions = KvRegions(plan, kv)
        self._staging = staging_buffer(staging_bytes, "KvSender")
        endpoint.register(self._memory())
        self._channels: Dict[Tuple[str, int], Channel] = {}

    def send(self, seq_id: int, receiver: Tuple[str, int], receiver_seq_id: Optional[int] = None) -> SendResult:
        """Move decoding sequence ``seq_id`` to the receiver listening at
        ``receiver`` (its KvReceiver.address), under ``receiver_seq_id`` there
        (default: the same id)."""
        started = time.perf_counter()
        export = self.mgr.describe_sequence(seq_id)
        nbytes = transfer_bytes(self.plan, self.kv, export)
        xfer = uuid.uuid4().hex
        offer = dict(type="offer", xfer=xfer, seq_id=seq_id if receiver_seq_id is None else receiver_seq_id,
                     tokens=export.tokens.numpy().astype(np.int32).tobytes(), num_computed=export.num_computed,
                     salt=export.salt, config=export.config.encode(), geometry=self.regions.geometry(),
                     nbytes=nbytes)
        host = time.perf_counter() - started
        try:
            channel = self._channel(tuple(receiver))
            channel.send(offer)
            answer = channel.receive(self.timeout_s)
        except (ChannelClosed, TimeoutError) as e:
            return self._failed(seq_id, receiver, f"no answer to the offer: {e}")
        answered = time.perf_counter()
        if answer.get("type") == "refused":
            return SendResult("refused", int(answer["answer"]))
        if answer.get("type") != "accept":
            raise ValueError(f"the receiver refused sequence {seq_id}: {answer.get('reason', answer.get('type'))}")
        try:
            writes = self._writes(export, answer, nbytes)
        except Exception as e:  # whatever stops the write, the receiver's admission must be undone
            self._tell(receiver, dict(type="abort", xfer=xfer, reason=f"the sender gave up: {e}"))
            raise
        written = time.perf_counter()
        host += written - answered
        if not self.endpoint.write(answer["engine"], writes):
            self._tell(receiver, dict(type="abort", xfer=xfer, reason="the write failed"))
            return self._failed(seq_id, receiver, "the transfer engine's write failed")
        write_seconds = time.perf_counter() - written
        try:
            channel.send(dict(type="done", xfer=xfer))
            ack = channel.receive(self.timeout_s)
        except (ChannelClosed, TimeoutError) as e:
            return self._failed(seq_id, receiver, f"no acknowledgement: {e}")
        if ack.get("status") != "started":
            return self._failed(seq_id, receiver, f"the receiver did not start it: {ack}")
        self.mgr.deallocate(seq_id)  # the receiver holds every byte now
        return SendResult("sent", int(answer["cached"]), nbytes=int(writes[:, 2].sum()),
                          write_seconds=write_seconds, host_seconds=host)

    def _writes(self, export, answer: dict, nbytes: int) -> np.ndarray:
        destination = np.frombuffer(answer["runs"], dtype=np.int64).reshape(-1, 3)
        check_destination(destination, nbytes, [tuple(span) for span in answer["memory"]])
        held = self.regions.runs(export, int(answer["cached"]))
        if int(destination[:, 2].sum()) != int(held[:, 2].sum()):
            raise ValueError(f"size mismatch: the receiver's rows hold {int(destination[:, 2].sum())} bytes, "
                             f"the sequence {int(held[:, 2].sum())} beyond its cached prefix")
        if self._staging is not None and nbytes <= self._staging.numel():  # else straight from the rows
            gather_sequence(self.plan, self.kv, export, self._staging[:nbytes], manager=self.mgr)
            held = staged(held, self._staging)
        return join(held, destination)

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
        staging = [] if self._staging is None else [(self._staging.data_ptr(), self._staging.numel())]
        return self.regions.memory() + staging
