"""Java ``hashCode()`` semantics, vectorised: what Flink hashes a key with first."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from keyflow.hashing.keys import JvmType, KeyColumn
from keyflow.hashing.murmur3 import U32

_TRUE_HASH, _FALSE_HASH = np.uint32(1231), np.uint32(1237)
_JAVA_NAN_DOUBLE = np.uint64(0x7FF8000000000000)
_JAVA_NAN_FLOAT = np.uint32(0x7FC00000)


def java_hash_codes(column: KeyColumn) -> U32:
    """``hashCode()`` of each key as the JVM type it maps to, as uint32 bit patterns."""
    values = column.values
    match column.jvm_type:
        case JvmType.INT:
            return np.asarray(values.to_numpy(), dtype=np.int32).astype(np.uint32)
        case JvmType.LONG:
            return _long_hash(values.to_numpy().view(np.uint64))
        case JvmType.DOUBLE:
            doubles = values.to_numpy()
            bits = np.where(np.isnan(doubles), _JAVA_NAN_DOUBLE, doubles.view(np.uint64))
            return _long_hash(bits)
        case JvmType.FLOAT:
            floats = values.to_numpy()
            return np.where(np.isnan(floats), _JAVA_NAN_FLOAT, floats.view(np.uint32))
        case JvmType.BOOLEAN:
            return np.where(values.to_numpy(zero_copy_only=False), _TRUE_HASH, _FALSE_HASH)
        case JvmType.STRING:
            return string_hash_codes(values)
    raise AssertionError(column.jvm_type)


def _long_hash(bits: npt.NDArray[np.uint64]) -> U32:
    """``Long.hashCode``: ``(int) (value ^ (value >>> 32))``."""
    return ((bits ^ (bits >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def string_hash_codes(strings: pa.Array) -> U32:
    """``String.hashCode`` over UTF-16 code units, computed from Arrow's UTF-8 buffers.

    ``hashCode`` is the polynomial sum of ``unit[i] * 31**(n-1-i)`` modulo 2**32, so it
    is computed for all strings at once: decode code points, split non-BMP ones into
    surrogate pairs, weight each unit by its power of 31, and take per-string sums as
    differences of one wrapping cumulative sum.
    """
    offsets, data = utf8_buffers(strings)
    byte_rows = np.repeat(np.arange(len(strings)), np.diff(offsets))
    data = data[offsets[0] : offsets[-1]]
    code_points, lead_positions = _decode_utf8(data)
    rows = byte_rows[lead_positions]

    is_pair = code_points >= 0x10000
    unit_counts = 1 + is_pair.astype(np.int64)
    unit_starts = np.cumsum(unit_counts) - unit_counts
    units = np.empty(int(unit_counts.sum()), dtype=np.uint32)
    units[unit_starts] = np.where(is_pair, 0xD800 + ((code_points - 0x10000) >> 10), code_points)
    pair_starts = unit_starts[is_pair]
    units[pair_starts + 1] = 0xDC00 + ((code_points[is_pair] - 0x10000) & 0x3FF)
    unit_rows = np.repeat(rows, unit_counts)

    units_per_row = np.bincount(unit_rows, minlength=len(strings))
    row_ends = np.cumsum(units_per_row)
    exponents = row_ends[unit_rows] - 1 - np.arange(len(units))
    powers = _powers_of_31(int(units_per_row.max(initial=0)))
    running = np.cumsum(units * powers[exponents], dtype=np.uint32)
    totals: U32 = np.concatenate((np.zeros(1, np.uint32), running))
    hash_codes: U32 = totals[row_ends] - totals[row_ends - units_per_row]
    return hash_codes


def utf8_buffers(strings: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Offsets (absolute, ``len + 1`` of them) and the data bytes of a string array."""
    _, offset_buffer, data_buffer = strings.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int32)[strings.offset : strings.offset + len(strings) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _decode_utf8(data: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Code points of valid UTF-8 bytes, and the byte position each one starts at."""
    leads = np.flatnonzero((data & 0xC0) != 0x80)
    first = data[leads].astype(np.int64)
    width = 1 + (first >= 0xC0) + (first >= 0xE0) + (first >= 0xF0)
    lead_mask = np.array([0x7F, 0x1F, 0x0F, 0x07])[width - 1]
    code_points = first & lead_mask
    padded = np.concatenate((data, np.zeros(3, np.uint8))).astype(np.int64)
    for extra in (1, 2, 3):
        more = width > extra
        code_points = np.where(more, (code_points << 6) | (padded[leads + extra] & 0x3F), code_points)
    return code_points, leads


def _powers_of_31(count: int) -> U32:
    powers = np.full(max(count, 1), 31, dtype=np.uint32)
    powers[0] = 1
    return np.cumprod(powers, dtype=np.uint32)
