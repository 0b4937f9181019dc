"""One process's Mooncake transfer engine: the memory it registered and the
writes it makes into a peer's registered memory.

Peers find each other by name ("hostname:port", the engine's own RPC port)
with Mooncake's P2P handshake, so no metadata server is needed. The engine
makes that handshake inside the first write to a peer, and waits for the
answer for about a minute (a fixed read timeout, whatever
MC_HANDSHAKE_CONNECT_TIMEOUT says: a stopped process's socket still takes
the connection), holding a lock that every other write of the engine takes
(a write to a healthy peer meanwhile waits the same minute), and holding
the caller. Its own probe (`send_probe`) takes no such lock but waits as
long, and a thread of ours parked that long in the engine keeps the engine
alive past `close` (see there why that costs). So no call of the engine
ever decides whether a peer is alive:
- the caller proves it, with a ping answered over its own control channel
  (a frozen process cannot answer, so the ping fails within its deadline;
  a TCP connect alone would succeed, the kernel takes it), and says so with
  `mark_alive`; the first write to a peer not reached yet is handed to the
  engine only within PING_FRESH_S of that, once per answer, and fails
  (WriteFailed) without one;
- that first write goes out on a thread of its own, and no other write is
  handed over while it runs (it would wait for the lock): a peer that
  freezes between its answer and the handshake leaves the writes queued,
  the caller's own timeout ends its wait, and the handshake's minute ends
  by itself (or at once when the peer is killed or resumed).

Over TCP the engine moves requests on parallel lanes, so long writes are cut
into slices, and no more are handed over at once than its lanes queue.
Writes are submitted and then watched (`Writes.done`), so the caller works
while they move: the sender gathers the next piece, the receiver scatters
the last.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Deque, Dict, List, Optional, Set, Tuple

import numpy as np

from .channel import check_timeout

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
#: how old a peer's answer to a ping may be when the first write to it starts
#: the engine's handshake: the caller pings just before its first write, so
#: this only bounds how long an answer stays good for (its writes may wait
#: behind another peer's handshake), never a wait
PING_FRESH_S = 1.0


class WriteFailed(ConnectionError):
    """A write did not land: the peer died, or named memory it did not register."""


class _Handshake:
    """The first write to a peer, the engine's handshake inside it, on a
    thread of its own (the transfer engine releases the GIL while it
    waits). ``batch`` is None while it runs, then the write's batch (0 or
    less: the peer did not answer)."""

    def __init__(self, engine, owner: "Writes"):
        self.owner: Optional[Writes] = owner  # None once its writes are given up
        self.batch: Optional[int] = None
        threading.Thread(target=self._run, args=(engine, owner.peer, owner._next()), daemon=True,
                         name=f"handshake {owner.peer}").start()

    def _run(self, engine, peer: str, request) -> None:
        src, dst, size = request
        self.batch = engine.batch_transfer_async_write(peer, [src], [dst], [size])


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
        check_timeout("Writes.wait", timeout_s)
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
        self._reached: Set[str] = set()  # peers whose engine answered a handshake: written to directly
        self._handshakes: Dict[str, _Handshake] = {}  # the first writes to peers not reached yet
        self._answered: Dict[str, float] = {}  # peers that answered a ping: when (see mark_alive)

    @property
    def memory(self) -> List[Tuple[int, int]]:
        """The (address, bytes) spans registered here, sorted."""
        return sorted(self._registered)

    def register(self, memory: List[Tuple[int, int]]) -> None:
        """Register spans for peers to write into (or this side to write from); once each."""
        self._open("register")
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

    def mark_alive(self, peer: str) -> None:
        """Say that ``peer``'s process answered a ping just now (over the
        caller's own channel to it): the first write to it, if it was not
        reached yet, may then start the engine's handshake, within
        PING_FRESH_S (see the module docstring)."""
        _check_peer("mark_alive", peer)
        self._answered[peer] = time.monotonic()

    def submit(self, peer: str, writes: np.ndarray) -> Writes:
        """Start writing (local address, peer address, bytes) rows into
        ``peer``'s registered memory; returns at once. The engine moves them on
        its own threads while this one does other work; `Writes.done` and
        `Writes.wait` tell when they landed. The memory on both ends must hold
        still until then. To a peer not reached yet they fail unless it
        answered a ping just before (`mark_alive`)."""
        self._open("submit")
        _check_peer("submit", peer)
        if not isinstance(writes, np.ndarray) or writes.ndim != 2 or writes.shape[1] != 3 or \
                writes.dtype.kind not in "iu":
            raise ValueError(f"TransferEndpoint.submit: writes must be an integer array of (local address, peer "
                             f"address, bytes) rows, shape (n, 3), got {_described(writes)}")
        pending = Writes(self, peer, _sliced(writes))
        self._queued.append(pending)
        self.progress()
        return pending

    def write(self, peer: str, writes: np.ndarray, timeout_s: float = 60.0) -> bool:
        """`submit` and wait until the writes landed. False if any failed or
        they did not land within ``timeout_s``."""
        check_timeout("TransferEndpoint.write", timeout_s)
        try:
            self.submit(peer, writes).wait(timeout_s)
        except (WriteFailed, TimeoutError):
            return False
        return True

    def progress(self) -> None:
        """Note the requests that landed, oldest first, and hand the engine
        queued ones while it has room: to a peer not reached yet only the
        first one, on its own thread, and only if the peer answered a ping
        just before (see the module docstring). One request
        per engine batch: a batch's status is only known without blocking
        for its first request, and the engine's own wait spins a core."""
        if self._engine is None:  # closed: every write failed
            return
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
        for peer, handshake in list(self._handshakes.items()):
            if handshake.batch is not None:
                del self._handshakes[peer]
                self._handshake_returned(peer, handshake)
        for owner in list(self._queued):
            if self._handshakes:
                break  # a write now would wait for that one's lock
            if not owner._unsubmitted:
                self._queued.remove(owner)
                continue
            if owner.peer not in self._reached:
                if not self._fresh_answer(owner.peer):
                    self._fail(owner, f"{owner.peer} was not reached yet and did not answer a ping in the last "
                                      f"{PING_FRESH_S:.1f} s: no handshake is started with it")
                    continue
                self._handshakes[owner.peer] = _Handshake(self._engine, owner)
                if owner._unsubmitted:
                    continue
            if self._hand_over(owner):
                self._queued.remove(owner)
            if len(self._in_flight) >= IN_FLIGHT:
                break

    def _fresh_answer(self, peer: str) -> bool:
        """Whether ``peer`` answered a ping within PING_FRESH_S; the answer is used up."""
        answered = self._answered.pop(peer, None)
        return answered is not None and time.monotonic() - answered <= PING_FRESH_S

    def _handshake_returned(self, peer: str, handshake: _Handshake) -> None:
        """A first write returned: the peer is reached, or its writes fail."""
        if not _taken(handshake.batch):  # a later write tries again
            if handshake.owner is not None:
                self._fail(handshake.owner, f"the transfer engine cannot reach {peer}")
            return
        self._reached.add(peer)
        if handshake.owner is not None:
            self._in_flight.append((handshake.batch, handshake.owner))

    def _hand_over(self, owner: Writes) -> bool:
        """Hand the engine ``owner``'s next requests while it has room;
        whether they are all handed over now."""
        while owner._unsubmitted:
            if len(self._in_flight) >= IN_FLIGHT:
                return False
            src, dst, size = owner._next()
            batch = self._engine.batch_transfer_async_write(owner.peer, [src], [dst], [size])
            if not _taken(batch):
                self._reached.discard(owner.peer)
                self._fail(owner, f"the transfer engine cannot write to {owner.peer}")
                return False
            self._in_flight.append((batch, owner))
        return True

    def _fail(self, owner: Writes, failure: str) -> None:
        owner.failure = owner.failure or failure
        self._forget(owner)

    def _forget(self, owner: Writes) -> None:
        for handshake in self._handshakes.values():
            if handshake.owner is owner:
                handshake.owner = None
        self._in_flight = collections.deque(entry for entry in self._in_flight if entry[1] is not owner)
        if owner in self._queued:
            self._queued.remove(owner)

    def close(self) -> None:
        """Unregister every span and free the transfer engine now; writes not
        landed fail, and the endpoint takes no more. Freeing the engine stalls
        every Python thread of the process for about a second (its destructor
        holds the GIL while its threads stop): here, where the caller chose,
        rather than wherever the garbage collector would free it (a send
        elsewhere in the process would lose that second). A first write still
        inside the engine keeps it until it returns."""
        if self._engine is None:
            return
        self.unregister(list(self._registered))
        for owner in list(self._queued) + [owner for _, owner in self._in_flight]:
            self._fail(owner, "the endpoint was closed")
        self._handshakes.clear()
        self._engine = None

    def _open(self, method: str) -> None:
        if self._engine is None:
            raise RuntimeError(f"TransferEndpoint.{method}: the endpoint is closed")


def _sliced(writes: np.ndarray) -> np.ndarray:
    """Writes cut into pieces of at most SLICE_BYTES."""
    pieces = -(-writes[:, 2] // SLICE_BYTES)
    write = np.repeat(np.arange(len(writes)), pieces)
    step = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    start = step * SLICE_BYTES
    size = np.minimum(writes[write, 2] - start, SLICE_BYTES)
    return np.stack([writes[write, 0] + start, writes[write, 1] + start, size], axis=1)


def _taken(batch: int) -> bool:
    """Whether the engine took a write: a batch id, not 0 or -1 (it cannot reach the peer)."""
    return 0 < batch < 1 << 63


def _check_peer(method: str, peer) -> None:
    if not isinstance(peer, str) or not peer:
        raise ValueError(f"TransferEndpoint.{method}: peer must be a transfer engine's name, a non-empty "
                         f"\"host:port\" string, got {peer!r}")


def _described(value) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
