"""Murmur3 x86_32 building blocks over uint32 NumPy arrays.

Both hashes keyflow speaks are made of these: Spark's ``hash()`` is Murmur3_x86_32
with seed 42, and Flink's ``MathUtils.murmurHash`` is one Murmur3 block with seed 0.
All arithmetic is modulo 2**32, which NumPy's uint32 array operations give for free.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U32 = npt.NDArray[np.uint32]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_FIVE = np.uint32(5)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)


def _rotl(x: U32, r: int) -> U32:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def mix_k1(k1: U32) -> U32:
    """Scramble one 32-bit block."""
    return _rotl(k1 * _C1, 15) * _C2


def mix_h1(h1: U32, k1: U32) -> U32:
    """Fold a scrambled block into the running hash."""
    return _rotl(h1 ^ k1, 13) * _FIVE + _N


def fmix(h1: U32, length: npt.NDArray[np.integer] | int) -> U32:
    """Finalise: mix in the input length in bytes, then avalanche."""
    h = h1 ^ np.asarray(length).astype(np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * _F1
    h = h ^ (h >> np.uint32(13))
    h = h * _F2
    return h ^ (h >> np.uint32(16))


def hash_int(values: U32, seed: U32) -> U32:
    """Murmur3 of one 4-byte value per row (Spark's ``hashInt``)."""
    return fmix(mix_h1(seed, mix_k1(values)), 4)


def hash_long(values: npt.NDArray[np.uint64], seed: U32) -> U32:
    """Murmur3 of one 8-byte value per row, low word first (Spark's ``hashLong``)."""
    low = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (values >> np.uint64(32)).astype(np.uint32)
    h1 = mix_h1(mix_h1(seed, mix_k1(low)), mix_k1(high))
    return fmix(h1, 8)
