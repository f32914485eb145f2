"""In-memory keyed state of one operator subtask (batch runs; streaming persists it).

Keys map to dense slots through :class:`~keyflow.state.key_index.KeyTable` (C hash
tables), and each declared state is one column over slots: fixed-width types in typed
NumPy arrays with a validity mask, everything else (strings, lists, structs, maps) in
Arrow arrays. Reads and writes take whole arrays of slots; nothing loops over records.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import StateDescriptor
from keyflow.state.key_index import KeyTable, Slots, fixed_width_storage


class StateColumn:
    """Values of one state over slots (see :func:`state_column`)."""

    type: pa.DataType

    def grow(self, size: int) -> None:
        raise NotImplementedError

    def get(self, slots: Slots) -> pa.Array:
        raise NotImplementedError

    def set(self, slots: Slots, values: pa.Array) -> None:
        """Write ``values[i]`` for slot ``slots[i]`` (distinct slots; a null clears it)."""
        raise NotImplementedError

    def valid(self, size: int) -> npt.NDArray[np.bool_]:
        raise NotImplementedError

    def at_most(self, bound: int, size: int) -> Slots:
        """Slots below ``size`` holding a value ``<= bound`` (fixed-width columns only)."""
        raise TypeError(f"a {self.type} state has no order to compare with a bound")


def state_column(arrow_type: pa.DataType) -> StateColumn:
    """NumPy arrays for fixed-width types; Arrow chunks for strings, lists, structs and maps."""
    storage = fixed_width_storage(arrow_type)
    return NumpyColumn(arrow_type, storage) if storage is not None else ArrowColumn(arrow_type)


class NumpyColumn(StateColumn):
    """A fixed-width type's values in a typed NumPy array, with a validity mask."""

    def __init__(self, arrow_type: pa.DataType, storage: pa.DataType) -> None:
        self.type, self._storage = arrow_type, storage
        self._values: np.ndarray = np.empty(0, dtype=storage.to_pandas_dtype())
        self._valid: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)

    def grow(self, size: int) -> None:
        if size <= len(self._valid):
            return
        capacity = max(size, 2 * len(self._valid), 1024)
        self._values = _grown(self._values, capacity)
        self._valid = _grown(self._valid, capacity)

    def get(self, slots: Slots) -> pa.Array:
        valid = self._valid[slots]
        return pa.array(self._values[slots], mask=~valid, type=self._storage).view(self.type)

    def valid(self, size: int) -> npt.NDArray[np.bool_]:
        return self._valid[:size]

    def at_most(self, bound: int, size: int) -> Slots:
        values = self._values[:size]
        return np.flatnonzero(self._valid[:size] & (values <= bound)).astype(np.int64)

    def set(self, slots: Slots, values: pa.Array) -> None:
        values = _conformed(values, len(slots), self.type)
        valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        present = values.drop_null().view(self._storage) if values.null_count else values.view(self._storage)
        self._values[slots[valid]] = present.to_numpy(zero_copy_only=False)
        self._valid[slots] = valid


class ArrowColumn(StateColumn):
    """A variable-width type's values (strings, lists, structs, maps) as Arrow arrays, never
    as a Python object per value: a write appends its values as a new chunk and points its
    slots at them (chunk, row). Chunks merge as a binary counter (a new chunk with the one
    before while that is at most twice as long), keeping only the rows slots still point at,
    so a value is copied O(log writes) times and a read is one ``take`` per chunk; when most
    rows are overwritten, all chunks merge into one."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.type = arrow_type
        self._chunk_of = np.zeros(0, dtype=np.int64)  # each slot's chunk id; -1: null
        self._row_of = np.zeros(0, dtype=np.int64)  # its row in that chunk
        self._chunks: dict[int, tuple[pa.Array, Slots]] = {}  # id -> (values, the slot each row was written for)
        self._order: list[int] = []  # chunk ids, oldest first
        self._next = 0

    def grow(self, size: int) -> None:
        if size <= len(self._chunk_of):
            return
        capacity = max(size, 2 * len(self._chunk_of), 1024)
        self._chunk_of = np.concatenate([self._chunk_of, np.full(capacity - len(self._chunk_of), -1, np.int64)])
        self._row_of = _grown(self._row_of, capacity)

    def valid(self, size: int) -> npt.NDArray[np.bool_]:
        valid: npt.NDArray[np.bool_] = self._chunk_of[:size] >= 0
        return valid

    def get(self, slots: Slots) -> pa.Array:
        if not len(slots):
            return pa.array([], self.type)
        chunks, rows = self._chunk_of[slots], self._row_of[slots]
        order = np.argsort(chunks, kind="stable")
        ordered = chunks[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        pieces = []
        for start, end in zip(starts, np.r_[starts[1:], len(order)], strict=True):
            chunk = int(ordered[start])
            if chunk < 0:
                pieces.append(pa.nulls(int(end - start), self.type))
            else:
                pieces.append(self._chunks[chunk][0].take(pa.array(rows[order[start:end]])))
        if len(pieces) == 1 and np.all(order[1:] > order[:-1]):
            return pieces[0]
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        return pa.concat_arrays(pieces).take(pa.array(inverse))

    def set(self, slots: Slots, values: pa.Array) -> None:
        values = _conformed(values, len(slots), self.type)
        valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        self._chunk_of[slots[~valid]] = -1
        present, owners = (values, slots) if valid.all() else (values.filter(pa.array(valid)), slots[valid])
        if len(owners):
            self._add(present, owners)
        if self._order and sum(len(values) for values, _ in self._chunks.values()) > 2 * self._live() + 1024:
            self._merge(list(self._order))  # mostly overwritten or cleared rows: keep the live ones only

    def _live(self) -> int:
        return int(np.count_nonzero(self._chunk_of >= 0))

    def _add(self, values: pa.Array, owners: Slots) -> None:
        self._place(self._next, values, owners)
        self._order.append(self._next)
        self._next += 1
        while len(self._order) > 1 and self._length(-2) <= 2 * self._length(-1):
            self._merge(self._order[-2:])

    def _length(self, position: int) -> int:
        return len(self._chunks[self._order[position]][0])

    def _place(self, chunk: int, values: pa.Array, owners: Slots) -> None:
        self._chunks[chunk] = (values, owners)
        self._chunk_of[owners] = chunk
        self._row_of[owners] = np.arange(len(owners), dtype=np.int64)

    def _merge(self, chunks: list[int]) -> None:
        """The rows of ``chunks`` slots still point at, as one chunk in their place."""
        kept, owners = [], []
        for chunk in chunks:
            values, written_for = self._chunks.pop(chunk)
            live = np.flatnonzero(
                (self._chunk_of[written_for] == chunk) & (self._row_of[written_for] == np.arange(len(written_for)))
            )
            kept.append(values.take(pa.array(live)))
            owners.append(written_for[live])
        position = self._order.index(chunks[0])
        self._order[position : position + len(chunks)] = [chunks[-1]]
        self._place(chunks[-1], pa.concat_arrays(kept), np.concatenate(owners))


def _conformed(values: pa.Array, count: int, arrow_type: pa.DataType) -> pa.Array:
    if len(values) != count:
        raise ValueError(f"state update has {len(values)} values for {count} keys; give one per key")
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values if values.type == arrow_type else values.cast(arrow_type)


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.zeros(capacity, dtype=array.dtype) if array.dtype == bool else np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


class KeyedStateStore:
    """All declared states of one operator subtask, addressed by key.

    Each slot remembers its key group (state is stored and restored by key group) and
    whether it was touched since the last :meth:`take_touched` (what a checkpoint writes).
    """

    def __init__(self, descriptors: dict[str, StateDescriptor]) -> None:
        self.descriptors = dict(descriptors)
        self.columns = {name: state_column(descriptor.arrow_type) for name, descriptor in descriptors.items()}
        self._index = KeyTable()
        self._key_groups = np.zeros(0, dtype=np.int32)
        self._touched = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return self._index.size

    def slots(self, keys: pa.Table, key_groups: npt.NDArray[np.int32] | None = None) -> Slots:
        """Slots of the given (unique) keys, creating slots for keys never seen; marks them touched."""
        return self.slots_and_key_groups(keys, key_groups)[0]

    def slots_and_key_groups(
        self, keys: pa.Table, key_groups: npt.NDArray[np.int32] | None = None
    ) -> tuple[Slots, npt.NDArray[np.int32]]:
        """:meth:`slots`, and the key group each key had before (-1: a new key), which tells a
        pre-keyed operator the keys it must check (see ``keyflow.state.splits``)."""
        slots = self._index.lookup(keys)
        new = slots < 0
        previous = np.full(len(slots), -1, dtype=np.int32)
        previous[~new] = self._key_groups[slots[~new]]
        if new.any():
            slots[new] = self._index.add(keys.filter(pa.array(new)))
            size = self._index.size
            for column in self.columns.values():
                column.grow(size)
            if size > len(self._key_groups):
                capacity = max(size, 2 * len(self._key_groups), 1024)
                self._key_groups = _grown(self._key_groups, capacity)
                self._touched = _grown(self._touched, capacity)
            if key_groups is not None:
                self._key_groups[slots[new]] = key_groups[new]
        self._touched[slots] = True
        return slots, previous

    def key_groups(self, slots: Slots) -> npt.NDArray[np.int32]:
        """The key group of each of ``slots``."""
        key_groups: npt.NDArray[np.int32] = self._key_groups[slots]
        return key_groups

    def touch(self, slots: Slots) -> None:
        """Mark ``slots`` changed (a checkpoint writes them): state set outside :meth:`slots`."""
        self._touched[slots] = True

    def clear(self, slots: Slots) -> None:
        """Every state of ``slots`` cleared (written so: the checkpoint forgets them too)."""
        if len(slots):
            for column in self.columns.values():
                column.set(slots, pa.nulls(len(slots), column.type))
            self.touch(slots)

    def touched(self) -> Slots:
        """Slots touched since the last :meth:`take_touched` (kept for it)."""
        return np.flatnonzero(self._touched[: len(self)]).astype(np.int64)

    def take_touched(self) -> Slots:
        """Slots touched since the last call (and forget them)."""
        touched = self.touched()
        self._touched[:] = False
        return touched

    def all_slots(self) -> Slots:
        return np.arange(len(self), dtype=np.int64)

    def live_slots_in(self, first: int, last: int) -> Slots:
        """Live slots whose key group is in ``first..last``."""
        live = self.live_slots()
        key_groups = self._key_groups[live]
        return live[(key_groups >= first) & (key_groups <= last)]

    def live_slots(self) -> Slots:
        """Slots with at least one state set (a cleared key keeps its slot, with nulls)."""
        live = np.zeros(len(self), dtype=bool)
        for column in self.columns.values():
            live |= column.valid(len(self))
        return np.flatnonzero(live).astype(np.int64)

    def keys(self, slots: Slots) -> pa.Table:
        """The keys of ``slots``, as the key columns they came in."""
        return self._index.take(slots)

    def to_table(self, slots: Slots) -> pa.Table:
        """Keys, key group and every state of ``slots`` as one Arrow table (the state file format)."""
        table = self.keys(slots).append_column(KEY_GROUP_COLUMN, pa.array(self._key_groups[slots], pa.int32()))
        for name, column in self.columns.items():
            table = table.append_column(name, column.get(slots))
        return table

    def upsert(self, table: pa.Table) -> None:
        """Write rows of the state file format into this store (later rows of a key win)."""
        if table.num_rows == 0:
            return
        key_names = [name for name in table.column_names if name != KEY_GROUP_COLUMN and name not in self.columns]
        key_groups = table.column(KEY_GROUP_COLUMN).to_numpy().astype(np.int32)
        slots = self.slots(table.select(key_names), key_groups)
        for name, column in self.columns.items():  # a column added since the file was written reads as null
            values = table.column(name) if name in table.column_names else pa.nulls(len(slots), column.type)
            column.set(slots, values)
        self._touched[slots] = False
