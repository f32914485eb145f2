"""Spark SQL's ``hash(col, ...)`` in NumPy: Murmur3_x86_32, seed 42, column after column.

Pipelines compute key groups inside the JVM with ``pmod(hash(keys), K)``; this module
gives the same numbers in Python so tools, tests and pre-keyed sources agree with Spark.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keyflow.hashing.java import utf8_buffers
from keyflow.hashing.keys import JvmType, KeyColumn
from keyflow.hashing.murmur3 import U32, fmix, hash_int, hash_long, mix_h1, mix_k1
from keyflow.hashing.ragged import RaggedRows

SPARK_SEED = 42
_8, _16, _24 = np.uint32(8), np.uint32(16), np.uint32(24)


def spark_hash(columns: list[KeyColumn]) -> U32:
    """Spark's ``hash(c1, c2, ...)``: each column's hash seeds the next one's."""
    hashes = np.full(len(columns[0].values), SPARK_SEED, dtype=np.uint32)
    for column in columns:
        hashes = _hash_column(column, hashes)
    return hashes


def _hash_column(column: KeyColumn, seed: U32) -> U32:
    values = column.values
    match column.jvm_type:
        case JvmType.INT:
            return hash_int(values.to_numpy().astype(np.int32).view(np.uint32), seed)
        case JvmType.LONG:
            return hash_long(values.to_numpy().view(np.uint64), seed)
        case JvmType.DOUBLE:
            doubles = values.to_numpy() + 0.0  # -0.0 + 0.0 == 0.0: Spark hashes both zeros alike
            bits = np.where(np.isnan(doubles), np.uint64(0x7FF8000000000000), doubles.view(np.uint64))
            return hash_long(bits, seed)
        case JvmType.FLOAT:
            floats = values.to_numpy() + np.float32(0.0)
            bits = np.where(np.isnan(floats), np.uint32(0x7FC00000), floats.view(np.uint32))
            return hash_int(bits, seed)
        case JvmType.BOOLEAN:
            return hash_int(values.to_numpy(zero_copy_only=False).astype(np.uint32), seed)
        case JvmType.STRING:
            return _hash_utf8(values, seed)
    raise AssertionError(column.jvm_type)


def _hash_utf8(strings: pa.Array, seed: U32) -> U32:
    """Spark's ``hashUnsafeBytes``: 4-byte little-endian words, then each tail byte
    sign-extended as its own block (Spark's documented deviation from Murmur3)."""
    offsets, data = utf8_buffers(strings)
    padded = np.concatenate((data, np.zeros(4, np.uint8))).astype(np.uint32)
    lengths = np.diff(offsets)
    words = lengths // 4
    rows = RaggedRows(words)
    starts = offsets[:-1][rows.order]
    hashes = seed[rows.order]
    for position, active in rows.positions():
        at = starts[:active] + 4 * position
        word: U32 = padded[at] | padded[at + 1] << _8 | padded[at + 2] << _16 | padded[at + 3] << _24
        hashes[:active] = mix_h1(hashes[:active], mix_k1(word))

    sorted_lengths = lengths[rows.order]
    tail_starts = starts + 4 * words[rows.order]
    for index in range(3):
        tail = np.flatnonzero(sorted_lengths % 4 > index)
        signed_byte = padded[tail_starts[tail] + index].astype(np.uint8).view(np.int8)
        hashes[tail] = mix_h1(hashes[tail], mix_k1(signed_byte.astype(np.int32).astype(np.uint32)))
    return rows.unsort(fmix(hashes, sorted_lengths))
