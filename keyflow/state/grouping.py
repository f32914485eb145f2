"""Group rows by key without sorting them: hash the key columns to dense codes, then order
rows by code with a stable radix sort (O(n)), so each key's rows keep their arrival order.

This is what lets ``process`` without ``order_by`` skip Spark's sort by key: a chunk of rows
in any order becomes a batch grouped by key in linear time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

Codes = npt.NDArray[np.int64]


def key_codes(data: pa.Table, key_names: tuple[str, ...]) -> tuple[Codes, int]:
    """Each row's key as a dense code ``0..n-1``, numbered in order of first appearance, and
    ``n``. Keys compare as Spark groups them: ``NaN`` equals ``NaN``, ``-0.0`` equals ``0.0``."""
    codes, distinct = _codes(data.column(key_names[0]))
    for name in key_names[1:]:
        column_codes, size = _codes(data.column(name))
        # Combined codes stay below rows**2; encoding them again makes them dense.
        codes, distinct = _codes(pa.chunked_array([pa.array(codes * size + column_codes)]))
    return codes, distinct


def _codes(column: pa.ChunkedArray) -> tuple[Codes, int]:
    if pa.types.is_floating(column.type):
        column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 is 0.0
    encoded = pc.dictionary_encode(column, null_encoding="encode").combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), len(encoded.dictionary)


def grouping_order(codes: Codes, distinct: int) -> npt.NDArray[np.int64]:
    """The row order that groups ``codes`` (values ``0..distinct-1``) ascending, stable: an LSD
    radix sort over 16-bit digits (NumPy's stable sort of uint16 is a counting sort)."""
    order = np.arange(len(codes), dtype=np.int64)
    shift = 0
    while True:
        digit = ((codes[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
        if distinct <= 1 << shift:
            return order
