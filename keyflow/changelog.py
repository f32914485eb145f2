"""Changelogs: streams whose rows carry a row kind, as in Flink (``+I``, ``-U``, ``+U``, ``-D``).

A changelog stream has an ``op`` column. ``+I`` inserts a row, ``-U`` retracts the row a
key had before an update and ``+U`` adds its new row, ``-D`` retracts a deleted row. Every
retraction repeats, column for column, a row added earlier, so the current table is the
multiset sum of the rows: :func:`current` computes it, whatever order the rows come in.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.errors import PlanError

OP = "op"
INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = "+I", "-U", "+U", "-D"
ROW_KINDS = (INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE)
RETRACTIONS = (UPDATE_BEFORE, DELETE)
OFFSET = "__offset"  # a changelog source's rows carry their offset: the changes of a key are ordered by it
DELETED = "__deleted"  # whether a row of a changelog source deletes its key
MODES = ("insert", "upsert", "all")  # insert-only; upserts by primary key; rows with row kinds


def check_row_kinds(table: pa.Table, where: str) -> None:
    """Every row of ``table`` has a row kind in its ``op`` column, or a PlanError naming the first bad one."""
    if OP not in table.column_names:
        raise PlanError(f"{where}: a changelog needs an {OP!r} column of row kinds {', '.join(ROW_KINDS)}")
    column = table.column(OP).cast(pa.string())
    valid = pc.fill_null(pc.is_in(column, value_set=pa.array(ROW_KINDS)), False)
    if not pc.all(valid).as_py():
        position = int(np.flatnonzero(~valid.to_numpy(zero_copy_only=False))[0])
        raise PlanError(
            f"{where}: row {position} has {OP}={column[position].as_py()!r}; a row kind is one of "
            f"{', '.join(ROW_KINDS)} (+I insert, -U before update, +U after update, -D delete)"
        )


def current(changes: pa.Table) -> pa.Table:
    """The table a changelog describes: each row added (``+I``/``+U``) and not retracted
    (``-U``/``-D``), without the ``op`` column. Order does not matter."""
    check_row_kinds(changes, "current()")
    columns = [name for name in changes.column_names if name != OP]
    sign = pc.if_else(pc.is_in(changes.column(OP).cast(pa.string()), value_set=pa.array(RETRACTIONS)), -1, 1)
    counted = changes.select(columns).append_column("__count", sign).group_by(columns, use_threads=False)
    totals = counted.aggregate([("__count", "sum")])
    times = np.clip(totals.column("__count_sum").to_numpy(zero_copy_only=False), 0, None)
    return totals.select(columns).take(pa.array(np.repeat(np.arange(totals.num_rows), times)))
