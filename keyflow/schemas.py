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


Type = str | None
"""A column's type as far as the plan's checks tell types apart: ``numeric``, ``string``,
``boolean``, ``date``, ``timestamp``, ``timestamp_ntz`` (declared without time zone),
``array``, ``struct``, ``map``; None where not known or none of these. Spark's own type is
decided when it reads the data."""

_ARROW_TYPES = (
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_date, "date"),
    (pa.types.is_timestamp, "timestamp"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t), "numeric"),
    (lambda t: pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t), "array"),
    (pa.types.is_struct, "struct"),
    (pa.types.is_map, "map"),
)
_T = exp.DataType.Type
_DDL_TYPES = {
    **dict.fromkeys(exp.DataType.NUMERIC_TYPES, "numeric"),
    **dict.fromkeys(exp.DataType.TEXT_TYPES, "string"),
    **dict.fromkeys((_T.TIMESTAMP, _T.TIMESTAMPTZ, _T.TIMESTAMPLTZ), "timestamp"),
    _T.TIMESTAMPNTZ: "timestamp_ntz",
    _T.BOOLEAN: "boolean",
    _T.DATE: "date",
    _T.ARRAY: "array",
    _T.STRUCT: "struct",
    _T.MAP: "map",
}


def arrow_type(type_: pa.DataType) -> Type:
    """The :data:`Type` of an Arrow type."""
    return next((name for test, name in _ARROW_TYPES if test(type_)), None)


def schema_columns(schema: object) -> dict[str, Type] | None:
    """The columns and types of a DDL string (``"user string, n bigint"``) or an Arrow schema."""
    if isinstance(schema, pa.Schema):
        return {field.name: arrow_type(field.type) for field in schema}
    if not isinstance(schema, str):
        return None
    try:
        created = sqlglot.parse_one(f"CREATE TABLE t ({schema})", read="spark")
    except sqlglot.errors.SqlglotError:
        return None  # Spark reports the bad DDL where the operator is built
    columns = created.this.expressions
    if not columns or not all(isinstance(column, exp.ColumnDef) for column in columns):
        return None  # a form sqlglot reads otherwise (``name: type``): Spark knows it
    return {column.name: _DDL_TYPES.get(column.kind.this) if column.kind else None for column in columns}
