"""One process's Mooncake transfer engine: the memory it registered and the
writes it makes into a peer's registered memory.

Peers find each other by name ("hostname:port", the engine's own RPC port)
with Mooncake's P2P handshake, so no metadata server is needed. Over TCP the
engine moves a batch's requests on parallel lanes, so long writes are cut
into slices and a transfer is submitted in batches no larger than its
per-peer queue.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

#: bytes per write request: long runs cut this fine keep the engine's TCP
#: lanes busy in parallel (one 256 MiB write moves at half the rate of the
#: same bytes in 256 KiB requests on loopback)
SLICE_BYTES = 256 << 10
#: requests per submitted batch: the engine refuses a batch beyond its
#: per-peer queue (4,096 requests are refused, 1,024 are not)
BATCH_REQUESTS = 1024


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

    def write(self, peer: str, writes: np.ndarray) -> bool:
        """Write (local address, peer address, bytes) rows into ``peer``'s
        registered memory and wait until they landed. False if any failed
        (the peer died, or named memory it did not register)."""
        sliced = _sliced(writes)
        for first in range(0, len(sliced), BATCH_REQUESTS):
            batch = sliced[first: first + BATCH_REQUESTS]
            rc = self._engine.batch_transfer_sync_write(peer, batch[:, 0].tolist(), batch[:, 1].tolist(),
                                                        batch[:, 2].tolist())
            if rc != 0:
                return False
        return True

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
