"""Writes digest_vectors.txt: SHA-256 and BLAKE2b digests, computed by
Python's hashlib, of pseudo-random messages of every length 0..300, for
digest_test.cpp. The messages come from splitmix64 seeded with the length,
so the C++ test regenerates them; tests/manager/test_prefix_hash.py checks
that the file is what hashlib gives.

Each line: length, SHA-256 digest, BLAKE2b digest (hex). The BLAKE2b digest
is 1 + length % 64 bytes long, so every digest size is covered.

    python3 tests/cpp/data/digest_vectors.py > tests/cpp/data/digest_vectors.txt
"""
import hashlib

MAX_LENGTH = 300
_MASK = (1 << 64) - 1


def message(length: int) -> bytes:
    """splitmix64(seed = length), each output as 8 little-endian bytes, cut to length."""
    out, state = bytearray(), length
    while len(out) < length:
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        out += (z ^ (z >> 31)).to_bytes(8, "little")
    return bytes(out[:length])


def lines():
    for n in range(MAX_LENGTH + 1):
        m = message(n)
        yield f"{n} {hashlib.sha256(m).hexdigest()} {hashlib.blake2b(m, digest_size=1 + n % 64).hexdigest()}"


if __name__ == "__main__":
    print("\n".join(lines()))
