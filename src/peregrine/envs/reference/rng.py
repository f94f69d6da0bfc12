"""splitmix64 streams in NumPy, identical to pg_env.h's.

Reference implementations draw from these so that, for the same seed, they see
exactly the numbers the C core sees. One uint64 state per instance; every
method takes the instance indices to draw for and advances only those.
"""
from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_MINUS_24 = np.float32(2.0**-24)


def mix64(z: np.ndarray) -> np.ndarray:
    """Stafford's mix13 finaliser, on a uint64 array (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def seed_instances(seed: int, num_instances: int) -> np.ndarray:
    """Per-instance stream starts: mix64(mix64(seed) + (i + 1) * golden)."""
    seed_mixed = mix64(np.array([seed & (2**64 - 1)], dtype=np.uint64))[0]
    index = np.arange(1, num_instances + 1, dtype=np.uint64)
    return mix64(seed_mixed + index * GOLDEN)


class Streams:
    """One splitmix64 stream per instance."""

    def __init__(self, seed: int, num_instances: int):
        self.state = seed_instances(seed, num_instances)

    def next_u64(self, idx) -> np.ndarray:
        self.state[idx] += GOLDEN
        return mix64(self.state[idx])

    def uniform(self, idx) -> np.ndarray:
        """float32 in [0, 1) with 24 random bits."""
        return (self.next_u64(idx) >> np.uint64(40)).astype(np.float32) * _TWO_POW_MINUS_24

    def uniform_range(self, idx, low: float, high: float) -> np.ndarray:
        low, high = np.float32(low), np.float32(high)
        return low + self.uniform(idx) * (high - low)

    def randint(self, idx, n: int) -> np.ndarray:
        """Integers in [0, n) by multiply-shift on the top 32 bits."""
        top = self.next_u64(idx) >> np.uint64(32)
        return ((top * np.uint64(n)) >> np.uint64(32)).astype(np.int64)
