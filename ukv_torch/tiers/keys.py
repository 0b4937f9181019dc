"""The keys of tier objects: a cryptographic chain over the prefix.

A shared store serves many tenants, processes and models, so a key must not
collide by accident or by design: it is 128 bits of SHA-256 (its first 16
bytes), chained over the prefix, block by block,

    root    = SHA-256-128("ukv-tier-root" ++ fingerprint ++ salt as 8 bytes LE)
    key_i   = SHA-256-128(key_{i-1} ++ block i's token ids as 8-byte LE ints)   (key_{-1} = root)
    tail_i  = SHA-256-128(key_i ++ "swa-tail")

so a key names the whole prefix up to its block's end, under one salt and
one model. The fingerprint covers what gives the bytes their meaning: the
block size, the window, every layer's compress ratio and each of its planes'
dtype and width (and the CSA indexer's), so two models sharing a store never
read each other's objects. The HBM prefix cache's keys are not used here:
they follow ServeConfig.prefix_hash (64-bit xxh64 by default, for routers),
and a store shared between tenants needs keys no one can make collide
whatever the engine's configuration. SHA-256 rather than BLAKE2b because
x86 and Arm server cores hash it in hardware (the SHA extensions, which
OpenSSL and so hashlib use): a block's 1,040 bytes took 1.1 us against
BLAKE2b's 2.6 (x86 VM), and a save or a load keys every block on the host.
"""
from __future__ import annotations

import functools
import hashlib
import struct
from collections import OrderedDict
from typing import List, Optional, Sequence

import numpy as np

from ..manager.kv_events import KvEvent, KvEventKind, KvRole
from ..manager.prefix_hashing import Key, cache_salt

__all__ = ["KEY_BYTES", "fingerprint", "root_key", "chain_keys", "tail_key", "key_name", "token_bytes", "KeyChain"]

KEY_BYTES = 16


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:KEY_BYTES]


def fingerprint(geometry: Sequence) -> bytes:
    """The model fingerprint of an object layout's geometry (``ObjectLayout.geometry``)."""
    return _digest(b"ukv-tier-fingerprint-v1" + repr(tuple(geometry)).encode())


def root_key(fp: bytes, salt) -> bytes:
    """The chain's seed for a request's salt (None, an int or bytes: ``ukv_torch.cache_salt``)."""
    return _digest(b"ukv-tier-root" + fp + cache_salt(salt).to_bytes(8, "little"))


@functools.lru_cache(maxsize=8)
def _int64s(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}q")


def token_bytes(tokens) -> bytes:
    """Token ids as the keys hash them: 8-byte little-endian ints. A tuple or list (an
    event's token_ids) is packed by ``struct``, 2-3x faster than through numpy."""
    if isinstance(tokens, (tuple, list)):
        return _int64s(len(tokens)).pack(*tokens)
    return np.asarray(tokens, dtype="<i8").tobytes()


def chain_keys(parent: bytes, tokens, block_size: int, count: int, start: int = 0) -> List[bytes]:
    """The keys of blocks [start, start + count) of ``tokens`` (full blocks), chained from
    ``parent``: the root key for start 0, else the key of block start - 1."""
    data = token_bytes(np.asarray(tokens)[start * block_size: (start + count) * block_size])
    step = 8 * block_size
    keys, key = [], parent
    for at in range(0, count * step, step):
        key = _digest(key + data[at: at + step])
        keys.append(key)
    return keys


def tail_key(block_key: bytes) -> bytes:
    """The key of the SWA tail object at the end of the block with this key."""
    return _digest(block_key + b"swa-tail")


def key_name(key: bytes) -> str:
    """A key as the backends' string key."""
    return "ukv/" + key.hex()


class KeyChain:
    """The tier keys of blocks the HBM prefix cache published, by their HBM
    block hash (an int or bytes: ServeConfig.prefix_hash), so a Stored event's key is its parent's key chained with its
    tokens. Entries go with the block's Removed event (or a cache clear); a
    block's parent is live or cached whenever the block is published, so its
    key is here then. ``limit`` bounds the map regardless (least recently
    used first): a parent not found means no save, never a wrong key."""

    def __init__(self, fp: bytes, limit: int):
        self.fp, self.limit = fp, limit
        self._keys: "OrderedDict[Key, bytes]" = OrderedDict()

    def key_of(self, event: KvEvent, data: bytes) -> Optional[bytes]:
        """The key of a Stored compress event's block, remembered for its children; None
        when its parent's key is unknown. ``data``: the event's token_ids as
        :func:`token_bytes` gives them (the caller keeps them for locating the block)."""
        if event.parent_hash is None:
            parent = root_key(self.fp, event.salt)
        else:
            parent = self._keys.get(event.parent_hash)
            if parent is None:
                return None
            self._keys.move_to_end(event.parent_hash)
        key = _digest(parent + data)
        self._keys[event.block_hash] = key
        if len(self._keys) > self.limit:
            self._keys.popitem(last=False)
        return key

    def forget(self, event: KvEvent) -> None:
        """A Removed or AllCleared event."""
        if event.kind == KvEventKind.ALL_CLEARED:
            self._keys.clear()
        elif event.role == KvRole.COMPRESS:
            self._keys.pop(event.block_hash, None)
