"""Arrow tables against a declared schema: the one check behind every "returned the wrong
columns or types" error (a process function's result, records appended to a log)."""

from __future__ import annotations

import pyarrow as pa
import sqlglot
from sqlglot import exp


class ColumnsDifferError(ValueError):
    """The table's column names are not the schema's (in any order)."""


class TypesDifferError(ValueError):
    """The columns match, but a value cannot be cast to the schema's type (the message is Arrow's)."""


def conform_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in its order and types."""
    if sorted(table.column_names) != sorted(schema.names):
        raise ColumnsDifferError(f"columns {table.column_names} are not {schema.names}")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise TypesDifferError(str(error)) from None


def ddl_names(schema: object) -> tuple[str, ...] | None:
    """The column names of a DDL string (``"user string, n bigint"``) or an Arrow schema."""
    names = getattr(schema, "names", None)
    if names is not None:
        return tuple(names)
    if not isinstance(schema, str):
        return None
    try:
        created = sqlglot.parse_one(f"CREATE TABLE t ({schema})", read="spark")
    except sqlglot.errors.SqlglotError:
        return None  # Spark reports the bad DDL where the operator is built
    columns = created.this.expressions
    if not columns or not all(isinstance(column, exp.ColumnDef) for column in columns):
        return None  # a form sqlglot reads otherwise (``name: type``): Spark knows it
    return tuple(column.name for column in columns)
