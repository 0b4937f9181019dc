"""Content tags: an int64 per position that identifies the token prefix it depends on.

tag(p) of a token list = a 62-bit hash of tokens[0..p], two polynomial hashes
modulo the primes 2^31-1 and 2^31-19. Equal prefixes give equal tags whatever
request they belong to, so a prefix-cache hit must read rows that carry exactly
the tags its own tokens give. Computed with numpy prefix sums:
    H(p) = B^p * sum_{i<=p} tok_i * B^-i  (mod P)
"""
from __future__ import annotations

import numpy as np

_PRIMES = (2147483647, 2147483629)
_BASES = (1000003, 998244353 % 2147483629)

# Distinct salts per role and layer, so a row of the wrong role or layer never matches.
SWA_SALT = 0
CSA_SALT = 0x1555_5555_5555_5555
HCA_SALT = 0x2AAA_AAAA_AAAA_AAAA
LAYER_SALT = 0x0123_4567_89AB_CDEF


def layer_salt(layer: int) -> int:
    return (LAYER_SALT * (layer + 1)) & ((1 << 62) - 1)


class _Powers:
    """B^i and B^-i modulo P, grown on demand."""

    def __init__(self, base: int, prime: int):
        self.base, self.prime = base, prime
        self.inv_base = pow(base, prime - 2, prime)
        self.pow = np.ones(1, dtype=np.int64)
        self.inv = np.ones(1, dtype=np.int64)

    def ensure(self, n: int) -> None:
        while len(self.pow) < n:
            m = len(self.pow)
            grow_pow = np.empty(m, dtype=np.int64)
            grow_inv = np.empty(m, dtype=np.int64)
            step_pow, step_inv = int(self.pow[-1]) * self.base % self.prime, int(self.inv[-1]) * self.inv_base % self.prime
            # The next m powers are the current ones times B^m (and B^-m).
            grow_pow[:] = self.pow * step_pow % self.prime
            grow_inv[:] = self.inv * step_inv % self.prime
            self.pow = np.concatenate([self.pow, grow_pow])
            self.inv = np.concatenate([self.inv, grow_inv])


_POWERS = [_Powers(b, p) for b, p in zip(_BASES, _PRIMES)]


class TokenTags:
    """The tokens of one request and the tag of every prefix; append() extends both."""

    def __init__(self, tokens) -> None:
        self.tokens = np.zeros(0, dtype=np.int64)
        self.tags = np.zeros(0, dtype=np.int64)
        self._sums = [0, 0]
        self.append(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, new_tokens) -> None:
        new = np.asarray(new_tokens, dtype=np.int64)
        if new.size == 0:
            return
        start, end = len(self.tokens), len(self.tokens) + len(new)
        halves = []
        for j, (pw, prime) in enumerate(zip(_POWERS, _PRIMES)):
            pw.ensure(end)
            terms = new % prime * pw.inv[start:end] % prime
            sums = (np.cumsum(terms) + self._sums[j]) % prime
            self._sums[j] = int(sums[-1])
            halves.append(pw.pow[start:end] * sums % prime)
        self.tokens = np.concatenate([self.tokens, new])
        self.tags = np.concatenate([self.tags, (halves[0] << 31) | halves[1]])
