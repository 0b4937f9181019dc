"""The prefix cache's keys and request salts.

A block's hash chains XXH64 over its parent's hash and its token ids
(csrc/core/manager/block_hash.h has the byte layout); a request's salt seeds block 0,
so requests of different tenants or LoRA adapters (different salts) never
share a cached block, while requests with the same salt, or none, do. A
router replaying `KvManager.take_events()` computes the same keys here from
token ids, with the same C++ functions the manager uses.
"""
from __future__ import annotations

import hashlib
import numbers
from typing import List, Sequence, Union

import torch

__all__ = ["Salt", "cache_salt", "salt_arg", "int_list", "block_hashes", "swa_page_hashes"]

Salt = Union[None, int, bytes]
_MASK64 = (1 << 64) - 1


def cache_salt(salt: Salt) -> int:
    """The 64-bit salt value a salt stands for (0: no salt).

    None is no salt; an int must lie in [0, 2^64) and is its own value (0 is
    no salt); bytes (or a bytearray) stand for the BLAKE2b hash of them with
    an 8-byte digest (``hashlib.blake2b(data, digest_size=8)``, no key, salt
    or person: BLAKE2b-64, which differs from the first 8 bytes of the
    default 64-byte digest) read as a little-endian unsigned integer, so the
    same bytes give the same value in every process and language (a str must
    be encoded first: its bytes are the caller's choice). The events report
    this value."""
    if salt is None:
        return 0
    if isinstance(salt, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(bytes(salt), digest_size=8).digest(), "little")
    if isinstance(salt, bool) or not isinstance(salt, int):
        raise TypeError(f"salt must be None, an int or bytes, got {type(salt).__name__}")
    if not 0 <= salt <= _MASK64:
        raise ValueError(f"salt must be in [0, 2^64), got {salt}")
    return salt


def _signed(u: int) -> int:
    """A uint64 as the int64 the C++ side takes."""
    return u - (1 << 64) if u >> 63 else u


def salt_arg(salt: Salt) -> int:
    """The salt's 64-bit value as the int64 the C++ side takes (validated)."""
    return _signed(cache_salt(salt))


def int_list(values, name: str, lo: int, hi: int) -> List[int]:
    """Python ints in [lo, hi], or a TypeError / ValueError naming the argument."""
    values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {type(v).__name__} {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"{name} values must be in [{lo}, {hi}], got {v}")
    return [int(v) for v in values]


def block_hashes(tokens: Union[torch.Tensor, Sequence[int]], block_size: int, salt: Salt = None) -> List[int]:
    """The prefix-cache hashes (unsigned 64-bit) of the full blocks of `tokens`
    (token ids in [0, 2^31); a partial last block has none), as the manager
    computes them for a request with this salt: a Stored compress event's
    block_hash."""
    toks = int_list(tokens, "tokens", 0, (1 << 31) - 1)
    hashes = torch.ops.ukv.block_hashes(toks, block_size, salt_arg(salt))
    return [h & _MASK64 for h in hashes]


def swa_page_hashes(block_hashes: Sequence[int], pages_per_block: int) -> List[int]:
    """The SWA page keys (unsigned 64-bit) of the blocks with these hashes
    (unsigned 64-bit ints), pages_per_block (= block_size // swa_page) per
    block, in position order: a Stored SWA event's block_hash.

    With one page per block a page's key is its block's hash. Otherwise page
    ``j`` of a block (``0 <= j < pages_per_block``) has the key
    ``fmix64(h ^ ((j + 1) * 0x9E3779B97F4A7C15))``, all arithmetic modulo
    2^64, where ``fmix64(x)`` is MurmurHash3's finaliser: ``x ^= x >> 33; x *=
    0xFF51AFD7ED558CCD; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53; x ^= x >> 33``."""
    hashes = int_list(block_hashes, "block_hashes", 0, _MASK64)
    keys = torch.ops.ukv.swa_page_hashes([_signed(h) for h in hashes], pages_per_block)
    return [h & _MASK64 for h in keys]
