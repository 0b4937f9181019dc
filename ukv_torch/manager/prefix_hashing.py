"""The prefix cache's keys and request salts.

A block's hash chains a hash over its parent's key and its token ids
(csrc/core/manager/block_hash.h has the byte layout): XXH64 by default
(``ServeConfig.prefix_hash="xxh64"``, what upstream-compatible routers
compute), or 128 bits of SHA-256 or BLAKE2b ("sha256", "blake2b"). A
request's salt goes into block 0, so requests of different tenants or LoRA
adapters (different salts) never share a cached block, while requests with
the same salt, or none, do. A router replaying `KvManager.take_events()`
computes the same keys here from token ids, with the same C++ functions the
manager uses.

A key (`Key`) is an unsigned 64-bit int under xxh64 and 16 ``bytes`` (the
digest's first 16 bytes) under sha256 and blake2b. The C++ side carries a
key as its little-endian 64-bit words, one or two (lo, hi), as int64.
"""
from __future__ import annotations

import hashlib
import numbers
from typing import List, Sequence, Union

import torch

__all__ = ["Salt", "Key", "PREFIX_HASHES", "cache_salt", "salt_arg", "int_list", "block_hashes", "swa_page_hashes",
           "keys_from_words", "key_from_words", "key_words", "key_tensor"]

Salt = Union[None, int, bytes]
Key = Union[int, bytes]
PREFIX_HASHES = ("xxh64", "sha256", "blake2b")  # ServeConfig.prefix_hash's values
_MASK64 = (1 << 64) - 1
_STRONG_KEY_BYTES = 16


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
    # Plain ints in range, the common case, checked at C speed: a Python-level
    # test per value (an isinstance, or a generator step) cost a 32K-token
    # prompt 7-40 ms per call.
    if set(map(type, values)) <= {int} and (not values or lo <= min(values) and max(values) <= hi):
        return values
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must hold ints, got {type(v).__name__} {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"{name} values must be in [{lo}, {hi}], got {v}")
    return [int(v) for v in values]


def _check_prefix_hash(prefix_hash: str) -> None:
    if prefix_hash not in PREFIX_HASHES:
        raise ValueError(f"prefix_hash must be one of {', '.join(PREFIX_HASHES)}, got {prefix_hash!r}")


def keys_from_words(words: Sequence[int], prefix_hash: str) -> List[Key]:
    """Keys from the C++ side's int64 words (one per xxh64 key, two per sha256 / blake2b key)."""
    if prefix_hash == "xxh64":
        return [w & _MASK64 for w in words]
    return [(lo & _MASK64).to_bytes(8, "little") + (hi & _MASK64).to_bytes(8, "little")
            for lo, hi in zip(words[0::2], words[1::2])]


def key_from_words(lo: int, hi: int, prefix_hash: str) -> Key:
    """One key from its low and high int64 words (the high word unused under xxh64)."""
    return keys_from_words([lo] if prefix_hash == "xxh64" else [lo, hi], prefix_hash)[0]


def key_words(keys: Sequence[Key], prefix_hash: str, name: str = "block_hashes") -> List[int]:
    """The int64 words the C++ side takes for these keys (validated: a TypeError
    / ValueError naming the argument)."""
    _check_prefix_hash(prefix_hash)
    if prefix_hash == "xxh64":
        return [_signed(h) for h in int_list(keys, name, 0, _MASK64)]
    words = []
    for k in keys:
        if not isinstance(k, (bytes, bytearray)) or len(k) != _STRONG_KEY_BYTES:
            raise TypeError(f"{name} must hold {_STRONG_KEY_BYTES}-byte {prefix_hash} keys (bytes), got {k!r}")
        words += [_signed(int.from_bytes(k[:8], "little")), _signed(int.from_bytes(k[8:], "little"))]
    return words


def key_tensor(keys: Sequence[Key], prefix_hash: str) -> torch.Tensor:
    """Keys as KvManager.locate_blocks / locate_pages take them: int64 [n] under
    xxh64, [n, 2] (lo, hi words) under sha256 and blake2b."""
    return _words_tensor(key_words(keys, prefix_hash, "hashes"), prefix_hash)


def _words_tensor(words: List[int], prefix_hash: str) -> torch.Tensor:
    t = torch.tensor(words, dtype=torch.int64)
    return t if prefix_hash == "xxh64" else t.view(-1, 2)


def swa_page_key_tensor(block_keys: torch.Tensor, pages_per_block: int, prefix_hash: str = "xxh64") -> torch.Tensor:
    """``key_tensor(swa_page_hashes(blocks, ...))`` from ``key_tensor(blocks)``, without
    making every page key a Python int or bytes and back (a tier save locates the
    pages of every block it saves)."""
    words = torch.ops.ukv.swa_page_hashes(block_keys.reshape(-1).tolist(), pages_per_block, prefix_hash)
    return _words_tensor(words, prefix_hash)


def block_hashes(tokens: Union[torch.Tensor, Sequence[int]], block_size: int, salt: Salt = None,
                 prefix_hash: str = "xxh64") -> List[Key]:
    """The prefix-cache keys of the full blocks of `tokens` (token ids in
    [0, 2^31); a partial last block has none), as a manager whose
    ServeConfig has this ``prefix_hash`` computes them for a request with
    this salt: a Stored compress event's block_hash. Unsigned 64-bit ints
    under xxh64; 16 ``bytes`` under sha256 (the first 16 bytes of the
    SHA-256 digest) and blake2b (``hashlib.blake2b(data, digest_size=16)``)."""
    _check_prefix_hash(prefix_hash)
    toks = int_list(tokens, "tokens", 0, (1 << 31) - 1)
    return keys_from_words(torch.ops.ukv.block_hashes(toks, block_size, salt_arg(salt), prefix_hash), prefix_hash)


def swa_page_hashes(block_hashes: Sequence[Key], pages_per_block: int, prefix_hash: str = "xxh64") -> List[Key]:
    """The SWA page keys of the blocks with these keys (as block_hashes gives
    them under the same ``prefix_hash``), pages_per_block (= block_size //
    swa_page) per block, in position order: a Stored SWA event's block_hash.

    With one page per block a page's key is its block's key. Otherwise, under
    xxh64 page ``j`` of a block (``0 <= j < pages_per_block``) has the key
    ``fmix64(h ^ ((j + 1) * 0x9E3779B97F4A7C15))``, all arithmetic modulo
    2^64, where ``fmix64(x)`` is MurmurHash3's finaliser: ``x ^= x >> 33; x *=
    0xFF51AFD7ED558CCD; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53; x ^= x >> 33``;
    under sha256 and blake2b it is the key (first 16 bytes) of the block
    key's 16 bytes followed by ``j`` as 8 bytes little-endian."""
    words = key_words(block_hashes, prefix_hash)
    return keys_from_words(torch.ops.ukv.swa_page_hashes(words, pages_per_block, prefix_hash), prefix_hash)
