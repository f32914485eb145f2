"""Plain-Python, one-key-at-a-time Java/Flink hashing: an independent oracle for tests.

Written straight from the JDK and Flink sources (String.hashCode, Long.hashCode,
MathUtils.murmurHash), with Python ints masked to 32 bits; shares no code with keyflow.
"""

from __future__ import annotations

import struct

MASK = 0xFFFFFFFF


def to_int32(value: int) -> int:
    value &= MASK
    return value - (1 << 32) if value >= 1 << 31 else value


def string_hash_code(text: str) -> int:
    units = struct.unpack(f"<{len(text.encode('utf-16-le')) // 2}H", text.encode("utf-16-le"))
    h = 0
    for unit in units:
        h = (31 * h + unit) & MASK
    return to_int32(h)


def long_hash_code(value: int) -> int:
    bits = value & 0xFFFFFFFFFFFFFFFF
    return to_int32(bits ^ (bits >> 32))


def double_hash_code(value: float) -> int:
    bits = 0x7FF8000000000000 if value != value else struct.unpack("<q", struct.pack("<d", value))[0]
    return long_hash_code(bits)


def float_hash_code(value: float) -> int:
    """Float.hashCode: floatToIntBits, NaN canonical."""
    return to_int32(0x7FC00000 if value != value else struct.unpack("<I", struct.pack("<f", value))[0])


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK


def murmur_hash(code: int) -> int:
    """Flink's MathUtils.murmurHash(int)."""
    code = (code * 0xCC9E2D51) & MASK
    code = _rotl(code, 15)
    code = (code * 0x1B873593) & MASK
    code = _rotl(code, 13)
    code = (code * 5 + 0xE6546B64) & MASK
    code ^= 4
    code ^= code >> 16
    code = (code * 0x85EBCA6B) & MASK
    code ^= code >> 13
    code = (code * 0xC2B2AE35) & MASK
    code ^= code >> 16
    signed = to_int32(code)
    if signed >= 0:
        return signed
    return -signed if signed != -(2**31) else 0


def flink_key_group(hash_code: int, max_parallelism: int) -> int:
    return murmur_hash(hash_code) % max_parallelism
