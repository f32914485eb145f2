"""Changes to keyed rows, vectorised: which stored rows a changelog's retractions remove,
a call's changes netted per row, lists of rows per key. Shared by the operators that keep a
changelog's rows (joins and Top-N of changelogs)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.changelog import DELETE, INSERT, OP
from keyflow.state.keyed import list_lengths, positions_within

Positions = npt.NDArray[np.int64]


def net_changes(changes: pa.Table) -> pa.Table:
    """A call's changes with each row's additions and retractions netted, the retractions
    first: a sink keyed by a column an update does not change (an upsert sink) must see the
    old row leave before the new one arrives, as Flink emits them."""
    columns = [name for name in changes.column_names if name != OP]
    sign = pc.if_else(pc.equal(changes.column(OP), DELETE), -1, 1)
    net = changes.select(columns).append_column("__net", sign).group_by(columns, use_threads=False)
    totals = net.aggregate([("__net", "sum")])
    count = totals.column("__net_sum").to_numpy()
    parts = []
    for op, times in ((DELETE, np.maximum(-count, 0)), (INSERT, np.maximum(count, 0))):
        rows = totals.select(columns).take(pa.array(np.repeat(np.arange(len(count)), times)))
        parts.append(rows.append_column(OP, pa.repeat(pa.scalar(op, pa.string()), rows.num_rows)))
    return pa.concat_tables(parts).cast(changes.schema)


def per_key(values: pa.Array, lengths: Positions) -> pa.ListArray:
    """``values`` cut into lists of ``lengths`` (a key with none: null, as one never written)."""
    offsets = pa.array(np.r_[0, np.cumsum(lengths)], pa.int32())
    return pa.ListArray.from_arrays(offsets, values, mask=pa.array(lengths == 0))


def equal_rows_to_remove(
    stored: pa.Array, owners: Positions, retracted: pa.Array, retracted_keys: Positions
) -> npt.NDArray[np.bool_]:
    """A mask of ``stored`` rows (of keys ``owners``): for each ``retracted`` row (of keys
    ``retracted_keys``), one stored row of its key equal to it, nulls equal to nulls; rows are
    grouped by key and value with Arrow's hash grouping."""
    count = len(stored)
    columns = {
        f"c{i}": pa.concat_arrays([a, b])
        for i, (a, b) in enumerate(zip(_leaves(stored), _leaves(retracted), strict=True))
    }
    rows = pa.table({"__key": np.r_[owners, retracted_keys], **columns, "__at": np.arange(count + len(retracted))})
    groups = rows.group_by(["__key", *columns], use_threads=False).aggregate([("__at", "list")])
    members = groups.column("__at_list").combine_chunks()
    sizes = list_lengths(members)
    at = np.asarray(pc.list_flatten(members).to_numpy(), dtype=np.int64)
    group = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    order = np.lexsort((at, group))  # by group, its stored rows (positions below count) first
    at, group = at[order], group[order]
    retractions = np.bincount(group[at >= count], minlength=len(sizes))
    chosen = at[(at < count) & (positions_within(sizes) < retractions[group])]
    removed = np.zeros(count, dtype=bool)
    removed[chosen] = True
    return removed


def _leaves(rows: pa.Array) -> list[pa.Array]:
    """The columns a row struct's equality reads: each struct's validity, then its fields'."""
    if not pa.types.is_struct(rows.type):
        return [rows]
    return [pc.is_valid(rows)] + [leaf for field in rows.flatten() for leaf in _leaves(field)]


def ungroupable_fields(row_type: pa.StructType, prefix: str = "") -> list[str]:
    """The fields (dotted) of a row type whose values Arrow cannot group by: lists, maps."""
    found = []
    for field in row_type:
        if pa.types.is_struct(field.type):
            found += ungroupable_fields(field.type, f"{prefix}{field.name}.")
        elif pa.types.is_nested(field.type):
            found.append(f"{prefix}{field.name}")
    return found
