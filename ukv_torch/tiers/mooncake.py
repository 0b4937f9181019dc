"""The Mooncake Store tier: a distributed store that every engine process
reaching the same `mooncake_master` shares, so one process reuses a prefix
another one computed.

Each process contributes `capacity_bytes` of its own host memory to the store
(Mooncake's global segment); objects live in whichever contributor's segment
the master picks, and the master evicts the least recently used when the
store fills. Puts and gets are batched and go straight between the caller's
registered buffers and the store (`batch_put_from` / `batch_get_into`), with
no staging copy in the client.

Faults are answers, as backend.py requires: a master that died makes puts
False and gets -1 (Mooncake's RPC fails at once on a closed connection, and
gives up on an unresponsive master after its RPC timeout), and the client
remounts its segment by itself once a master answers again on that address.
The objects the old master knew are gone then; they are misses.

Mooncake is an optional extra (`pip install ukv_torch[mooncake]`); only
constructing a MooncakeTier imports it.
"""
from __future__ import annotations

import os
import socket
import threading
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .backend import TierBackend

#: Mooncake's answer codes that are not errors of the store: the key is not
#: stored (a miss), or there is no room for the object (a refused put).
OBJECT_NOT_FOUND = -704
NO_ROOM = -200
#: how long construction waits for the master and the metadata server to
#: answer before it calls the address wrong (Mooncake's own setup retries an
#: unreachable master for about 90 s)
CONNECT_TIMEOUT_S = 3.0
#: the master's counters that stats() reports for the whole store
STORE_METRICS = {"objects": "master_key_count", "bytes_used": "master_allocated_bytes",
                 "capacity_bytes": "master_total_capacity_bytes", "evictions": "master_evicted_key_count"}


def _host_port(address: str, argument: str) -> Tuple[str, int]:
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"MooncakeTier: {argument} must be 'host:port' with a port in 1..65535, got {address!r}")
    return host, int(port)


def _check_reachable(host: str, port: int, argument: str, value: str) -> None:
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConnectionError(f"MooncakeTier: nothing answers at {argument}={value!r} ({e}); "
                              "is mooncake_master running there?") from None


def _check_metadata(metadata_url: str) -> None:
    """An HTTP metadata server must answer (any status); etcd, redis and the
    P2P handshake are Mooncake's to reach."""
    if not isinstance(metadata_url, str) or not metadata_url:
        raise ValueError(f"MooncakeTier: metadata_url must be a non-empty string, got {metadata_url!r}")
    if not metadata_url.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(metadata_url, timeout=CONNECT_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as e:
        raise ConnectionError(f"MooncakeTier: nothing answers at metadata_url={metadata_url!r} ({e})") from None


class MooncakeTier(TierBackend):
    """A Mooncake Store client (see the module docstring).

    ``master_address``: the master's RPC 'host:port'. ``metadata_url``: its
    metadata server (``http://host:port/metadata`` for the master's own HTTP
    server, or etcd/redis as Mooncake accepts). ``capacity_bytes``: the host
    memory this process contributes to the store (> 0). ``local_hostname``:
    the address other clients reach this one at. ``protocol``: "tcp", or
    "rdma" with ``rdma_devices``. ``metrics_url``: the master's metrics
    endpoint (``MooncakeMaster.metrics_url``); without it stats() cannot know
    the store-wide counts and reports them as -1.
    """

    name = "mooncake"

    def __init__(self, master_address: str, metadata_url: str, capacity_bytes: int, *,
                 local_hostname: str = "127.0.0.1", protocol: str = "tcp", rdma_devices: str = "",
                 metrics_url: Optional[str] = None):
        master = _host_port(master_address, "master_address")
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ValueError(f"MooncakeTier: capacity_bytes must be a positive int (the host memory this "
                             f"process gives the store), got {capacity_bytes!r}")
        for argument, value in (("local_hostname", local_hostname), ("protocol", protocol)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"MooncakeTier: {argument} must be a non-empty string, got {value!r}")
        _check_metadata(metadata_url)
        _check_reachable(*master, "master_address", master_address)
        from mooncake.store import MooncakeDistributedStore  # the optional extra

        # The transfer engine otherwise binds its RPC to the first LAN address
        # it finds, not to the host it is told it is.
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", local_hostname)
        store = MooncakeDistributedStore()
        # local_buffer_size 0: every put and get goes through registered
        # caller buffers, so the client's own staging buffer is never used.
        rc = store.setup(local_hostname, metadata_url, capacity_bytes, 0, protocol, rdma_devices, master_address)
        if rc != 0:
            store.close()
            raise ConnectionError(f"MooncakeTier: Mooncake setup failed (code {rc}) with master_address="
                                  f"{master_address!r}, metadata_url={metadata_url!r}, protocol={protocol!r}")
        self._store = store
        self._segment_bytes = capacity_bytes
        self._metrics_url = metrics_url
        self._registered: Dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._counts = dict(puts=0, gets=0, hits=0, misses=0, errors=0)

    def _live(self):
        if self._store is None:
            raise RuntimeError("MooncakeTier: the tier is closed")
        return self._store

    # -- buffers ---------------------------------------------------------------
    def register_buffer(self, buffer: torch.Tensor) -> None:
        _check_host_bytes(buffer, "buffer")
        if self._registered_base(buffer) is not None:
            return
        rc = self._live().register_buffer(buffer.data_ptr(), buffer.numel())
        if rc != 0:
            raise RuntimeError(f"MooncakeTier.register_buffer: Mooncake refused the buffer (code {rc})")
        # Holding the tensor keeps its memory alive while the store may DMA into it.
        self._registered[buffer.data_ptr()] = buffer

    def _registered_base(self, view: torch.Tensor) -> Optional[torch.Tensor]:
        start, end = view.data_ptr(), view.data_ptr() + view.numel()
        for base_ptr, base in self._registered.items():
            if base_ptr <= start and end <= base_ptr + base.numel():
                return base
        return None

    def _addresses(self, method: str, keys: Sequence[str],
                   buffers: Sequence[torch.Tensor]) -> Tuple[List[str], List[int], List[int]]:
        """Checks a call's arguments (misuse raises) and returns Mooncake's
        keys, pointers and sizes."""
        keys, buffers = list(keys), list(buffers)
        if len(keys) != len(buffers):
            raise ValueError(f"MooncakeTier.{method}: keys and buffers must have one entry each, "
                             f"got {len(keys)} keys and {len(buffers)} buffers")
        for i, (key, buffer) in enumerate(zip(keys, buffers)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"MooncakeTier.{method}: keys[{i}] must be a non-empty string, got {key!r}")
            _check_host_bytes(buffer, f"buffers[{i}]")
            if self._registered_base(buffer) is None:
                raise ValueError(f"MooncakeTier.{method}: buffers[{i}] is not inside a buffer given to "
                                 "register_buffer")
        return keys, [b.data_ptr() for b in buffers], [b.numel() for b in buffers]

    # -- objects ---------------------------------------------------------------
    def put(self, keys: Sequence[str], buffers: Sequence[torch.Tensor]) -> List[bool]:
        keys, pointers, sizes = self._addresses("put", keys, buffers)
        if not keys:
            return []
        codes = self._live().batch_put_from(keys, pointers, sizes)
        stored = [code == 0 for code in codes]
        with self._lock:
            self._counts["puts"] += sum(stored)
            self._counts["errors"] += sum(code not in (0, NO_ROOM) for code in codes)
        return stored

    def get(self, keys: Sequence[str], buffers: Sequence[torch.Tensor]) -> List[int]:
        keys, pointers, sizes = self._addresses("get", keys, buffers)
        if not keys:
            return []
        codes = self._live().batch_get_into(keys, pointers, sizes)
        sizes_read = [code if code >= 0 else -1 for code in codes]
        with self._lock:
            hits = sum(size >= 0 for size in sizes_read)
            self._counts["gets"] += len(keys)
            self._counts["hits"] += hits
            self._counts["misses"] += len(keys) - hits
            self._counts["errors"] += sum(code < 0 and code != OBJECT_NOT_FOUND for code in codes)
        return sizes_read

    def contains(self, keys: Sequence[str]) -> List[bool]:
        keys = list(keys)
        for i, key in enumerate(keys):
            if not isinstance(key, str) or not key:
                raise ValueError(f"MooncakeTier.contains: keys[{i}] must be a non-empty string, got {key!r}")
        if not keys:
            return []
        return [code == 1 for code in self._live().batch_is_exist(keys)]

    # -- counters and shutdown ---------------------------------------------------
    def stats(self) -> Dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
        counts["segment_bytes"] = self._segment_bytes
        counts.update(self._store_metrics())
        return counts

    def _store_metrics(self) -> Dict[str, int]:
        """The whole store's counts from the master's metrics endpoint; -1 for
        each when it is not known or does not answer."""
        values = {field: -1 for field in STORE_METRICS}
        if self._metrics_url is None:
            return values
        try:
            with urllib.request.urlopen(self._metrics_url, timeout=CONNECT_TIMEOUT_S) as r:
                text = r.read().decode()
        except (OSError, ValueError):
            return values
        reported = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        for field, metric in STORE_METRICS.items():
            if metric in reported:
                values[field] = int(float(reported[metric]))
        return values

    def close(self) -> None:
        store, self._store = getattr(self, "_store", None), None
        if store is None:
            return
        for pointer in self._registered:
            store.unregister_buffer(pointer)
        self._registered.clear()
        store.close()


def _check_host_bytes(buffer, argument: str) -> None:
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.device.type != "cpu" \
            or not buffer.is_contiguous() or buffer.numel() == 0:
        described = (f"{buffer.dtype} {buffer.device.type} tensor of {buffer.numel()} elements, "
                     f"contiguous={buffer.is_contiguous()}" if isinstance(buffer, torch.Tensor)
                     else type(buffer).__name__)
        raise ValueError(f"MooncakeTier: {argument} must be a non-empty contiguous uint8 host tensor, "
                         f"got {described}")
