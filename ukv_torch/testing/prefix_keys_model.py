"""The prefix-cache keys of the KV manager model (kv_manager_model), written
from the documented byte layout (csrc/core/manager/block_hash.h) with
Python's xxhash and hashlib, not with the C++ functions.

Keys are ints under xxh64 and 16-byte ``bytes`` under sha256 and blake2b,
as ``ukv_torch.KvEvent`` carries them.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Optional, Sequence, Union

__all__ = ["Key", "strong_key", "block_hash", "page_hash"]

Key = Union[int, bytes]
_MASK = (1 << 64) - 1


def strong_key(prefix_hash: str, data: bytes) -> bytes:
    """A sha256 or blake2b key of these bytes: the first 16 bytes of SHA-256, or BLAKE2b with a 16-byte digest."""
    if prefix_hash == "sha256":
        return hashlib.sha256(data).digest()[:16]
    assert prefix_hash == "blake2b", prefix_hash
    return hashlib.blake2b(data, digest_size=16).digest()


def block_hash(tokens: Sequence[int], parent: Optional[Key], salt: int = 0, prefix_hash: str = "xxh64") -> Key:
    """h_i = H(prefix + tokens as int64 LE). xxh64: prefix is the parent as
    8-byte LE (absent for block 0, whose xxh64 the salt seeds). sha256,
    blake2b: prefix is the parent's 16 bytes, or for block 0 the salt as
    8-byte LE (absent when 0)."""
    data = struct.pack(f"<{len(tokens)}q", *tokens)
    if prefix_hash == "xxh64":
        import xxhash

        prefix = b"" if parent is None else struct.pack("<Q", parent)
        return xxhash.xxh64_intdigest(prefix + data, seed=salt if parent is None else 0)
    prefix = parent if parent is not None else (struct.pack("<Q", salt) if salt else b"")
    return strong_key(prefix_hash, prefix + data)


def page_hash(block_hash: Key, page: int, pages_per_block: int, prefix_hash: str = "xxh64") -> Key:
    """The cache key of SWA page `page` of a prefix whose block hash is
    block_hash: the block hash itself with one page per block, else the
    block hash with the page's index inside the block mixed in (xxh64: the
    manager's finaliser; sha256, blake2b: the hash of the block key's 16
    bytes and the index as 8-byte LE), so the pages of one block are told apart."""
    if pages_per_block == 1:
        return block_hash
    j = page % pages_per_block
    if prefix_hash != "xxh64":
        return strong_key(prefix_hash, block_hash + struct.pack("<Q", j))
    h = block_hash ^ (((j + 1) * 0x9E3779B97F4A7C15) & _MASK)
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & _MASK
    h = ((h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53) & _MASK
    return h ^ (h >> 33)
