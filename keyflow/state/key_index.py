"""Keys → dense slots for keyed state, without a loop over records or a pandas MultiIndex.

Each key column's distinct values get dense codes (:class:`ColumnCodes`); a key of several
columns is its column codes packed pairwise into one int64 and coded again
(:class:`PairCodes`), so every lookup is a hash probe of a flat array, and the keys of any
slots come back as Arrow ``take`` of the values each column saw. (A pandas MultiIndex
factorises and sorts every level of the whole index whenever it grows: seconds per batch
at a million keys.)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

Slots = npt.NDArray[np.int64]
_LOW_BITS = np.int64(0xFFFFFFFF)


class KeyIndex:
    """Flat values → dense codes, as pandas hash indexes in chunks of doubling size.

    New values form a new chunk; chunks of similar size merge (a binary counter), so adding
    values costs amortised O(log n) per value and a lookup probes O(log n) hash tables instead
    of rebuilding one table over all values every batch.
    """

    def __init__(self) -> None:
        self._chunks: list[tuple[pd.Index, int]] = []  # (values, first code)
        self.size = 0

    def lookup(self, values: pd.Index) -> Slots:
        """Codes of ``values`` (repeats allowed); -1 for values not in the index."""
        codes = np.full(len(values), -1, dtype=np.int64)
        missing = np.arange(len(values))
        for chunk, first in self._chunks:
            if not len(missing):
                break
            found = chunk.get_indexer(values if len(missing) == len(values) else values.take(missing))
            hit = found >= 0
            codes[missing[hit]] = found[hit] + first
            missing = missing[~hit]
        return codes

    def add(self, values: pd.Index) -> Slots:
        """Codes for ``values``, which must be distinct and not in the index yet."""
        codes = np.arange(self.size, self.size + len(values), dtype=np.int64)
        self._chunks.append((values, self.size))
        self.size += len(values)
        while len(self._chunks) > 1 and len(self._chunks[-2][0]) <= 2 * len(self._chunks[-1][0]):
            (older, first), (newer, _) = self._chunks[-2], self._chunks.pop()
            self._chunks[-1] = (older.append(newer), first)
        return codes


class ColumnCodes:
    """The distinct values of one key column → dense codes, and codes → values."""

    def __init__(self, kind: pa.DataType) -> None:
        self.type = kind
        self._index = KeyIndex()
        self._chunks: list[pa.Array] = []  # the values, in code order
        self._values: pa.Array | None = None

    def lookup(self, values: pa.Array) -> Slots:
        return self._index.lookup(_hashable(values))

    def add(self, values: pa.Array) -> Slots:
        """Codes for distinct values never seen."""
        self._append(values)
        return self._index.add(_hashable(values))

    def intern(self, values: pa.Array) -> Slots:
        hashable = _hashable(values)
        codes = self._index.lookup(hashable)
        missing = np.flatnonzero(codes < 0)
        if len(missing):
            positions, _ = pd.factorize(hashable.take(missing), use_na_sentinel=False)
            firsts = np.unique(positions, return_index=True)[1]  # codes are numbered in order of first appearance
            new = missing[firsts]
            codes[missing] = self.add(values.take(pa.array(new)))[positions]
        return codes

    def values(self, codes: Slots) -> pa.Array:
        if self._values is None:
            self._values = pa.concat_arrays(self._chunks) if self._chunks else pa.array([], self.type)
            self._chunks = [self._values]
        return self._values.take(pa.array(codes, pa.int64()))

    def _append(self, values: pa.Array) -> None:
        self._chunks.append(values if values.type == self.type else values.cast(self.type))
        self._values = None


class PairCodes:
    """Pairs of codes (``left``, ``right``) → dense codes: each pair packed into one int64,
    coded as a column of int64 values."""

    def __init__(self) -> None:
        self._codes = ColumnCodes(pa.int64())

    def lookup(self, left: Slots, right: Slots) -> Slots:
        codes = np.full(len(left), -1, dtype=np.int64)
        known = np.flatnonzero((left >= 0) & (right >= 0))
        codes[known] = self._codes.lookup(_pack(left[known], right[known]))
        return codes

    def add(self, left: Slots, right: Slots) -> Slots:
        """Codes for distinct pairs never seen."""
        return self._codes.add(_pack(left, right))

    def intern(self, left: Slots, right: Slots) -> Slots:
        return self._codes.intern(_pack(left, right))

    def unpack(self, codes: Slots) -> tuple[Slots, Slots]:
        packed = np.asarray(self._codes.values(codes).to_numpy(), dtype=np.int64)
        return packed >> 32, packed & _LOW_BITS


class KeyTable:
    """Keys of one or more columns → dense slots (numbered in the order keys were added)."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None
        self._columns: list[ColumnCodes] = []
        self._pairs: list[PairCodes] = []  # the first two columns' codes, then that code with the third, ...
        self.size = 0

    def lookup(self, keys: pa.Table) -> Slots:
        """Slots of ``keys``; -1 for keys not in the table."""
        if self.schema is None:
            return np.full(keys.num_rows, -1, dtype=np.int64)
        codes = self._columns[0].lookup(_column(keys, 0))
        for number, pair in enumerate(self._pairs, start=1):
            codes = pair.lookup(codes, self._columns[number].lookup(_column(keys, number)))
        return codes

    def add(self, keys: pa.Table) -> Slots:
        """Slots for ``keys``, which must be distinct and not in the table yet."""
        if self.schema is None:
            self.schema = keys.schema
            self._columns = [ColumnCodes(field.type) for field in keys.schema]
            self._pairs = [PairCodes() for _ in keys.schema.names[1:]]
        if not self._pairs:
            codes = self._columns[0].add(_column(keys, 0))
        else:
            codes = self._columns[0].intern(_column(keys, 0))
            for number, pair in enumerate(self._pairs, start=1):
                right = self._columns[number].intern(_column(keys, number))
                codes = pair.add(codes, right) if number == len(self._pairs) else pair.intern(codes, right)
        self.size += keys.num_rows
        return codes

    def take(self, slots: Slots) -> pa.Table:
        """The keys of ``slots``, in that order, as the columns they came in."""
        if self.schema is None:
            return pa.table({})
        columns: list[pa.Array] = []
        codes = slots
        for number in range(len(self._pairs), 0, -1):
            codes, right = self._pairs[number - 1].unpack(codes)
            columns.append(self._columns[number].values(right))
        columns.append(self._columns[0].values(codes))
        return pa.Table.from_arrays(columns[::-1], schema=self.schema)


def _column(keys: pa.Table, number: int) -> pa.Array:
    column = keys.column(number)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _pack(left: Slots, right: Slots) -> pa.Array:
    if len(left) and (left.max() >= 2**31 or right.max() >= 2**32):
        raise OverflowError("more than 2**31 distinct values of a key column in one subtask; raise the parallelism")
    return pa.array((left.astype(np.int64) << 32) | right.astype(np.int64), pa.int64())


def _hashable(values: pa.Array) -> pd.Index:
    """A column's values as a flat pandas index: fixed-width types as their integers or floats
    (hashed in C), everything else as Python objects."""
    storage = fixed_width_storage(values.type)
    if storage is not None and not values.null_count:
        return pd.Index(values.view(storage).to_numpy(zero_copy_only=False))
    return pd.Index(values.to_numpy(zero_copy_only=False), dtype=object)


def fixed_width_storage(arrow_type: pa.DataType) -> pa.DataType | None:
    """The NumPy-friendly physical type of a fixed-width Arrow type, or None."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        return arrow_type
    if pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type) or pa.types.is_date64(arrow_type):
        return pa.int64()
    if pa.types.is_date32(arrow_type):
        return pa.int32()
    return None
