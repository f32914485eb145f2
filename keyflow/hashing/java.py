"""Java ``hashCode()`` semantics, vectorised: what Flink hashes a key with first."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from keyflow.hashing.keys import JvmType, KeyColumn
from keyflow.hashing.murmur3 import U32
from keyflow.hashing.ragged import RaggedRows

_TRUE_HASH, _FALSE_HASH = np.uint32(1231), np.uint32(1237)
_JAVA_NAN_DOUBLE = np.uint64(0x7FF8000000000000)
_JAVA_NAN_FLOAT = np.uint32(0x7FC00000)
_31 = np.uint32(31)


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
    """``String.hashCode``: ``h = 31 * h + unit`` over each string's UTF-16 code units.

    Computed from Arrow's UTF-8 buffers. ASCII bytes are their own code units; other
    text is decoded to code points first, non-BMP ones split into surrogate pairs.
    """
    offsets, data = utf8_buffers(strings)
    if np.any(data[offsets[0] : offsets[-1]] >= 0x80):
        units, starts, counts = _utf16_units(offsets, data)
    else:
        units, starts, counts = data.astype(np.uint32), offsets[:-1], np.diff(offsets)
    rows = RaggedRows(counts)
    sorted_starts = starts[rows.order]
    hashes = np.zeros(len(counts), dtype=np.uint32)
    for position, active in rows.positions():
        hashes[:active] = hashes[:active] * _31 + units[sorted_starts[:active] + position]
    return rows.unsort(hashes)


def _utf16_units(
    offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8]
) -> tuple[U32, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """All strings' UTF-16 code units in one array, with each string's start and count."""
    code_points, leads = _decode_utf8(data[offsets[0] : offsets[-1]])
    is_pair = code_points >= 0x10000
    unit_counts = 1 + is_pair
    unit_ends = np.cumsum(unit_counts)
    unit_starts = unit_ends - unit_counts
    units = np.empty(int(unit_ends[-1]) if len(unit_ends) else 0, dtype=np.uint32)
    units[unit_starts] = np.where(is_pair, 0xD800 + ((code_points - 0x10000) >> 10), code_points)
    units[unit_starts[is_pair] + 1] = 0xDC00 + ((code_points[is_pair] - 0x10000) & 0x3FF)

    row_of_code_point = np.searchsorted(offsets - offsets[0], leads, side="right") - 1
    counts = np.bincount(row_of_code_point, weights=unit_counts, minlength=len(offsets) - 1).astype(np.int64)
    starts = np.cumsum(counts) - counts
    return units, starts, counts


def utf8_buffers(strings: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Offsets (absolute, ``len + 1`` of them) and the data bytes of a string array."""
    _, offset_buffer, data_buffer = strings.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int32)[strings.offset : strings.offset + len(strings) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _decode_utf8(data: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Code points of valid UTF-8 bytes, and the byte position each one starts at.

    Only multi-byte sequences need decoding work, so ASCII text costs one pass.
    """
    leads = np.flatnonzero((data & 0xC0) != 0x80)
    code_points = data[leads].astype(np.int64)
    multi = np.flatnonzero(code_points >= 0xC0)
    if len(multi):
        first = code_points[multi]
        width = 2 + (first >= 0xE0) + (first >= 0xF0)
        value = first & np.array([0, 0, 0x1F, 0x0F, 0x07])[width]
        padded = np.concatenate((data, np.zeros(3, np.uint8)))
        starts = leads[multi]
        for extra in (1, 2, 3):
            continues = width > extra
            value = np.where(continues, (value << 6) | (padded[starts + extra] & 0x3F), value)
        code_points[multi] = value
    return code_points, leads
