"""In-memory keyed state of one operator subtask (batch runs; streaming persists it).

Keys map to dense slots through a pandas index (a C hash table), and each declared state
is one column over slots: fixed-width types in typed NumPy arrays with a validity mask,
everything else (strings, lists, maps) as Python objects. Reads and writes take whole
arrays of slots; nothing loops over records.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from keyflow.api.state import StateDescriptor

Slots = npt.NDArray[np.int64]


class StateColumn:
    """Values of one state over slots."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.type = arrow_type
        self._storage = _fixed_width_storage(arrow_type)
        dtype = self._storage.to_pandas_dtype() if self._storage is not None else object
        self._values: np.ndarray = np.empty(0, dtype=dtype)
        self._valid: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)

    def grow(self, size: int) -> None:
        if size <= len(self._valid):
            return
        capacity = max(size, 2 * len(self._valid), 1024)
        values = np.empty(capacity, dtype=self._values.dtype)
        values[: len(self._values)] = self._values
        valid = np.zeros(capacity, dtype=bool)
        valid[: len(self._valid)] = self._valid
        self._values, self._valid = values, valid

    def get(self, slots: Slots) -> pa.Array:
        valid = self._valid[slots]
        if self._storage is not None:
            return pa.array(self._values[slots], mask=~valid, type=self._storage).view(self.type)
        values = self._values[slots]
        values[~valid] = None
        return pa.array(values, type=self.type)

    def set(self, slots: Slots, values: pa.Array) -> None:
        if len(values) != len(slots):
            raise ValueError(f"state update has {len(values)} values for {len(slots)} keys; give one per key")
        if values.type != self.type:
            values = values.cast(self.type)
        valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if self._storage is not None:
            present = values.drop_null().view(self._storage) if values.null_count else values.view(self._storage)
            self._values[slots[valid]] = present.to_numpy(zero_copy_only=False)
        else:
            self._values[slots] = _object_array(values.to_pylist())
        self._valid[slots] = valid


def _fixed_width_storage(arrow_type: pa.DataType) -> pa.DataType | None:
    """The NumPy-friendly physical type of a fixed-width Arrow type, or None."""
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        return arrow_type
    if pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type) or pa.types.is_date64(arrow_type):
        return pa.int64()
    if pa.types.is_date32(arrow_type):
        return pa.int32()
    return None


def _object_array(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class KeyedStateStore:
    """All declared states of one operator subtask, addressed by key."""

    def __init__(self, descriptors: dict[str, StateDescriptor]) -> None:
        self.columns = {name: StateColumn(descriptor.arrow_type) for name, descriptor in descriptors.items()}
        self._index: pd.Index = pd.Index([])

    def __len__(self) -> int:
        return len(self._index)

    def slots(self, keys: pa.Table) -> Slots:
        """Slots of the given (unique) keys, creating slots for keys never seen."""
        index = _key_index(keys)
        slots = self._index.get_indexer(index).astype(np.int64)
        new = slots < 0
        if new.any():
            start = len(self._index)
            slots[new] = np.arange(start, start + int(new.sum()))
            self._index = self._index.append(index[new]) if len(self._index) else index[new]
            for column in self.columns.values():
                column.grow(len(self._index))
        return slots


def _key_index(keys: pa.Table) -> pd.Index:
    frame = keys.to_pandas()
    if keys.num_columns == 1:
        return pd.Index(frame.iloc[:, 0])
    return pd.MultiIndex.from_frame(frame)
