"""A regular join in the workers (Flink's ``StreamingJoinOperator``), vectorised per call.

Each input's rows of a key live in a list state of row structs. A call's rows of the left
input arrive first: each is paired with the right rows stored for its key, then stored
itself; then the right input's rows do the same against the left rows (this call's
included). So every matching pair is emitted exactly once, in whatever order rows arrive.

Outer joins keep, beside each stored row of a preserved input, how many rows of the other
input it has matched. A preserved row that arrives without a match is emitted padded with
nulls (``+I``); when its first match arrives, the padded row is retracted (``-D``) before
the joined rows are emitted, as Flink does. The output is then a changelog whose current
table is the batch join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, INSERT, OP
from keyflow.plan.descriptors import ListState, StateDescriptor
from keyflow.runtime.connected import INPUT, PACKED
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.state.keyed import KeyedBatch, KeyedState

ROWS, MATCHES = ("__left_rows", "__right_rows"), ("__left_matches", "__right_matches")


@dataclass(frozen=True)
class JoinSides:
    """The join's shape: which inputs are preserved (outer), each input's row struct type and
    the columns of it the output keeps (its keys are the output's key columns)."""

    preserved: tuple[bool, bool]
    row_types: tuple[pa.StructType, pa.StructType]
    kept: tuple[tuple[str, ...], tuple[str, ...]]
    changelog: bool

    def state(self) -> dict[str, StateDescriptor]:
        state: dict[str, StateDescriptor] = {ROWS[side]: ListState(self.row_types[side]) for side in (0, 1)}
        state.update({MATCHES[side]: ListState(pa.int64()) for side in (0, 1) if self.preserved[side]})
        return state


class JoinRows(KeyedFunction):
    """Rows of both inputs of a call joined against the state, then stored (see the module)."""

    def __init__(self, sides: JoinSides, schema: pa.Schema) -> None:
        self.sides, self.schema = sides, schema

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        tags = batch.data.column(INPUT).to_numpy()
        out: list[pa.Table] = []
        for side in (0, 1):
            rows = np.flatnonzero(tags == side)
            if len(rows):
                packed = batch.data.column(PACKED[side]).take(pa.array(rows)).combine_chunks()
                arrived, positions = batch.of_rows(rows, pa.table({"row": packed}))
                out.extend(self._arrive(side, arrived, packed, state.of_keys(positions)))
        return pa.concat_tables(out) if out else None

    def _arrive(self, side: int, batch: KeyedBatch, rows: pa.StructArray, state: KeyedState) -> list[pa.Table]:
        other = 1 - side
        stored = _lists(state[ROWS[other]].get(), self.sides.row_types[other])
        lengths = np.asarray(pc.list_value_length(stored).to_numpy(zero_copy_only=False), dtype=np.int64)
        stored_rows = pc.list_flatten(stored)
        before = np.cumsum(lengths) - lengths  # where each key's stored rows start in stored_rows
        matches = lengths[batch.key_index]  # for each arriving row
        mine = np.repeat(np.arange(len(rows)), matches)
        theirs = np.repeat(before[batch.key_index], matches) + _within(matches)
        out = []
        if self.sides.preserved[other]:
            counts_view = state[MATCHES[other]]
            counts = np.asarray(pc.list_flatten(_lists(counts_view.get(), pa.int64())).to_numpy(), dtype=np.int64)
            hits = np.bincount(theirs, minlength=len(counts))
            first = np.flatnonzero((counts == 0) & (hits > 0))  # padded rows of the other input to retract
            if len(first):
                owners = np.repeat(np.arange(len(lengths)), lengths)[first]
                out.append(
                    self._rows(batch.keys.take(pa.array(owners)), side, None, stored_rows.take(pa.array(first)), DELETE)
                )
            counts_view.update(pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()),
                                                        pa.array(counts + hits, pa.int64())))  # fmt: skip
        if len(mine):
            keys = batch.keys.take(pa.array(batch.key_index[mine]))
            out.append(self._rows(keys, side, rows.take(pa.array(mine)), stored_rows.take(pa.array(theirs)), INSERT))
        if self.sides.preserved[side]:
            alone = np.flatnonzero(matches == 0)
            if len(alone):
                keys = batch.keys.take(pa.array(batch.key_index[alone]))
                out.append(self._rows(keys, side, rows.take(pa.array(alone)), None, INSERT))
            state[MATCHES[side]].add(pa.array(matches, pa.int64()), batch.key_index)
        state[ROWS[side]].add(rows, batch.key_index)
        return out

    def _rows(
        self, keys: pa.Table, side: int, mine: pa.StructArray | None, theirs: pa.StructArray | None, op: str
    ) -> pa.Table:
        """Output rows: the keys, then the left input's kept columns, then the right's."""
        by_side = {side: mine, 1 - side: theirs}
        columns = dict(zip(keys.column_names, keys.columns, strict=True))
        for position in (0, 1):
            found = by_side[position]
            for name in self.sides.kept[position]:
                kind = self.sides.row_types[position].field(name).type
                columns[name] = found.field(name) if found is not None else pa.nulls(keys.num_rows, kind)
        if self.sides.changelog:
            columns[OP] = pa.repeat(pa.scalar(op, pa.string()), keys.num_rows)
        return pa.table(columns)


def _lists(values: pa.Array, element: pa.DataType) -> pa.Array:
    """A list state's lists with no list null (a key with none stored has an empty list)."""
    return values.fill_null(pa.scalar([], pa.list_(element)))


def _within(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0, 1, ..., counts[i] - 1 for each i, concatenated."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
