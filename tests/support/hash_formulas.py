"""Reference formulas the tests compute independently of the C++ side."""

M64 = (1 << 64) - 1


def fmix64(x: int) -> int:
    """MurmurHash3's 64-bit finaliser, on Python ints."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)
