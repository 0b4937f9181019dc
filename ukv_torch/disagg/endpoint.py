"""One process's Mooncake transfer engine: the memory it registered and the
writes it makes into a peer's registered memory.

Peers find each other by name ("hostname:port", the engine's own RPC port)
with Mooncake's P2P handshake, so no metadata server is needed. Over TCP the
engine moves requests on parallel lanes, so long writes are cut into slices,
and no more are handed over at once than its lanes queue. Writes are
submitted and then watched (`Writes.done`), so the caller works while they
move: the sender gathers the next piece, the receiver scatters the last.
"""
from __future__ import annotations

import collections
import time
from typing import Deque, List, Tuple

import numpy as np

#: bytes per write request: long runs cut this fine keep the engine's TCP
#: lanes busy in parallel (one 256 MiB write moves at half the rate of the
#: same bytes in 256 KiB requests on loopback). Larger requests move a
#: whole buffer about as fast, but a send that hands over one piece at a
#: time then keeps fewer in flight (its pieces moved at 1.8 GB/s in 1 MiB
#: requests, 2.2 GB/s in 256 KiB ones)
SLICE_BYTES = 256 << 10
#: requests handed to the engine and not yet seen landed: its TCP lanes
#: reject requests beyond their queues (4,096 in flight are refused, and never
#: complete; 1,024 are not)
IN_FLIGHT = 1024
#: how long a wait for writes sleeps between two looks at them
POLL_S = 0.0005


class WriteFailed(ConnectionError):
    """A write did not land: the peer died, or named memory it did not register."""


class Writes:
    """Writes to one peer, handed to the engine request by request as room
    frees (see TransferEndpoint.submit)."""

    def __init__(self, endpoint: "TransferEndpoint", peer: str, slices: np.ndarray):
        self._endpoint, self.peer = endpoint, peer
        self._slices = slices.tolist()
        self.submitted = self.landed = 0
        self.failure = ""  # why, once one failed

    def done(self) -> bool:
        """Whether every write landed (never blocks); WriteFailed if one failed."""
        self._endpoint.progress()
        if self.failure:
            raise WriteFailed(self.failure)
        return self.landed == len(self._slices)

    def wait(self, timeout_s: float) -> None:
        """Until every write landed; WriteFailed, or TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.done():
            if time.monotonic() > deadline:
                self.cancel()
                raise TimeoutError(f"writes to {self.peer} did not land within {timeout_s:.1f} s")
            time.sleep(POLL_S)

    def cancel(self) -> None:
        """Stop handing these writes to the engine and stop waiting for the ones
        it holds (given up on: a late one may still land in the peer's memory)."""
        self._endpoint._forget(self)

    def _next(self):
        self.submitted += 1
        return self._slices[self.submitted - 1]

    @property
    def _unsubmitted(self) -> bool:
        return self.submitted < len(self._slices)


class TransferEndpoint:
    """A Mooncake TransferEngine on ``hostname`` (see the module docstring).
    ``protocol``: "tcp", or "rdma" with ``device_names``."""

    def __init__(self, hostname: str = "127.0.0.1", protocol: str = "tcp", device_names: str = ""):
        for argument, value in (("hostname", hostname), ("protocol", protocol)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"TransferEndpoint: {argument} must be a non-empty string, got {value!r}")
        from mooncake.engine import TransferEngine  # the optional extra

        engine = TransferEngine()
        rc = engine.initialize(hostname, "P2PHANDSHAKE", protocol, device_names)
        if rc != 0:
            raise ConnectionError(f"TransferEndpoint: Mooncake's transfer engine did not start (code {rc}) on "
                                  f"hostname={hostname!r} with protocol={protocol!r}")
        self._engine = engine
        self.name = f"{hostname}:{engine.get_rpc_port()}"
        self._registered: List[Tuple[int, int]] = []
        self._in_flight: Deque[Tuple[int, Writes]] = collections.deque()  # (batch, owner), oldest first
        self._queued: Deque[Writes] = collections.deque()  # with requests not handed over yet

    @property
    def memory(self) -> List[Tuple[int, int]]:
        """The (address, bytes) spans registered here, sorted."""
        return sorted(self._registered)

    def register(self, memory: List[Tuple[int, int]]) -> None:
        """Register spans for peers to write into (or this side to write from); once each."""
        new = [span for span in memory if span not in self._registered]
        if not new:
            return
        rc = self._engine.batch_register_memory([a for a, _ in new], [n for _, n in new])
        if rc != 0:
            raise RuntimeError(f"TransferEndpoint.register: the transfer engine refused {len(new)} spans (code {rc})")
        self._registered += new

    def unregister(self, memory: List[Tuple[int, int]]) -> None:
        """Forget spans registered here (before their memory is freed)."""
        for span in memory:
            if span in self._registered:
                self._engine.unregister_memory(span[0])
                self._registered.remove(span)

    def submit(self, peer: str, writes: np.ndarray) -> Writes:
        """Start writing (local address, peer address, bytes) rows into
        ``peer``'s registered memory; returns at once. The engine moves them on
        its own threads while this one does other work; `Writes.done` and
        `Writes.wait` tell when they landed. The memory on both ends must hold
        still until then."""
        pending = Writes(self, peer, _sliced(writes))
        self._queued.append(pending)
        self.progress()
        return pending

    def write(self, peer: str, writes: np.ndarray, timeout_s: float = 60.0) -> bool:
        """`submit` and wait until the writes landed. False if any failed or
        they did not land within ``timeout_s``."""
        try:
            self.submit(peer, writes).wait(timeout_s)
        except (WriteFailed, TimeoutError):
            return False
        return True

    def progress(self) -> None:
        """Note the requests that landed, oldest first, and hand the engine
        queued ones while it has room. One request per engine batch: a
        batch's status is only known without blocking for its first request,
        and the engine's own wait spins a core."""
        while self._in_flight:
            batch, owner = self._in_flight[0]
            status = self._engine.transfer_check_status(batch)  # 1 landed, 0 moving, < 0 failed or timed out
            if status == 0:
                break
            self._in_flight.popleft()
            if status == 1:
                owner.landed += 1
            else:
                self._fail(owner, f"a write to {owner.peer} failed (engine status {status})")
        while self._queued and len(self._in_flight) < IN_FLIGHT:
            owner = self._queued[0]
            if not owner._unsubmitted:
                self._queued.popleft()
                continue
            src, dst, size = owner._next()
            batch = self._engine.batch_transfer_async_write(owner.peer, [src], [dst], [size])
            if not 0 < batch < 1 << 63:  # 0 (or -1): the peer cannot be reached
                self._fail(owner, f"the transfer engine cannot write to {owner.peer}")
                continue
            self._in_flight.append((batch, owner))

    def _fail(self, owner: Writes, failure: str) -> None:
        owner.failure = owner.failure or failure
        self._forget(owner)

    def _forget(self, owner: Writes) -> None:
        self._in_flight = collections.deque(entry for entry in self._in_flight if entry[1] is not owner)
        if owner in self._queued:
            self._queued.remove(owner)

    def close(self) -> None:
        self.unregister(list(self._registered))


def _sliced(writes: np.ndarray) -> np.ndarray:
    """Writes cut into pieces of at most SLICE_BYTES."""
    pieces = -(-writes[:, 2] // SLICE_BYTES)
    write = np.repeat(np.arange(len(writes)), pieces)
    step = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    start = step * SLICE_BYTES
    size = np.minimum(writes[write, 2] - start, SLICE_BYTES)
    return np.stack([writes[write, 0] + start, writes[write, 1] + start, size], axis=1)
