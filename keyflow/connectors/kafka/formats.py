"""Records' bytes ⇄ columns. Reading decodes a whole batch of records with Arrow's JSON or CSV
reader (one call, not one per record); writing encodes in Spark (``to_json``/``to_csv``), so a
sink's Python only hands bytes to the producer.

A record that does not decode is malformed: the batch is decoded again record by record only
then, to name each malformed record (topic, partition, offset) and keep the others.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

if TYPE_CHECKING:
    from pyspark.sql import Column

# Flink's JSON format writes SQL timestamps as "yyyy-MM-dd HH:mm:ss.SSS..."; Spark's default is ISO
# 8601 with a zone offset. Arrow reads both.
_TIMESTAMP = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def decode(records: Sequence[bytes], format: str, schema: pa.Schema) -> tuple[pa.Table, np.ndarray]:
    """The columns of ``schema`` from ``records`` and the positions of those that did not decode
    (left out of the table). The batch decodes in one call when each record is one line and
    every one decodes to one row; else record by record."""
    try:
        # A blank record would be skipped by the batch reader and another record's second object
        # take its row: the count would match, the rows not. Blank ones go record by record.
        if format == "json" and not all(record.strip() for record in records):
            raise pa.ArrowInvalid("a blank record")
        table = _decode_all(records, format, schema, one_line_each=True)
        if table.num_rows == len(records):
            return table, np.array([], dtype=np.int64)
    except (pa.ArrowInvalid, UnicodeDecodeError):
        pass
    return _decode_each(records, format, schema)


def decode_aligned(
    records: Sequence[bytes | None], format: str, schema: pa.Schema
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """One row per record (null where the record is None or malformed), which are malformed,
    and which are present (not None)."""
    present = np.fromiter((record is not None for record in records), bool, len(records))
    where = np.flatnonzero(present)
    table, malformed = decode([records[i] for i in where], format, schema)  # type: ignore[misc]
    bad = np.zeros(len(records), bool)
    bad[where[malformed]] = True
    row = np.full(len(records), -1, np.int64)
    good = present & ~bad
    row[good] = np.arange(int(good.sum()))
    return table.take(pa.array(row, mask=row < 0)), bad, present


def _decode_each(records: Sequence[bytes], format: str, schema: pa.Schema) -> tuple[pa.Table, np.ndarray]:
    tables, malformed = [], []
    for position, record in enumerate(records):
        try:
            table = _decode_all([record], format, schema, one_line_each=False)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            table = None
        if table is None or table.num_rows != 1:
            malformed.append(position)
        else:
            tables.append(table)
    decoded = pa.concat_tables(tables) if tables else schema.empty_table()
    return decoded, np.array(malformed, dtype=np.int64)


def _decode_all(records: Sequence[bytes], format: str, schema: pa.Schema, one_line_each: bool) -> pa.Table:
    if not records:
        return schema.empty_table()
    if format == "raw":
        values = pa.array(records, pa.binary())
        kind = schema.field(0).type
        return pa.table({schema.names[0]: values if kind == pa.binary() else values.cast(kind)})
    data = b"\n".join(records)
    block = max(len(data) + 1, 1 << 20)
    newlines = data.count(b"\n") >= len(records)
    if newlines and one_line_each:
        raise pa.ArrowInvalid("a record spans lines")
    if format == "json":
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(block_size=block),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=newlines
            ),
        )
    else:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=pa_csv.ReadOptions(column_names=schema.names, block_size=block),
            parse_options=pa_csv.ParseOptions(newlines_in_values=newlines, ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(column_types=schema),
        )
    return table.select(schema.names).cast(schema)


def assemble(schema: pa.Schema, values: pa.Table, keys: pa.Table | None, value_missing: pa.Array | None) -> pa.Table:
    """The row of each record: key columns from the key where the value does not hold them
    (``EXCEPT_KEY``) or where there is no value (an upsert tombstone), else from the value."""
    columns = []
    for field in schema:
        if keys is not None and field.name in keys.column_names:
            key_column = keys.column(field.name)
            if field.name not in values.column_names:
                columns.append(key_column)
                continue
            columns.append(pc.if_else(value_missing, key_column, values.column(field.name)))
        else:
            columns.append(values.column(field.name))
    return pa.Table.from_arrays(columns, schema=schema)


def encode(columns: Sequence[str], format: str) -> Column:
    """A Spark expression: the bytes of ``columns`` in ``format`` (null stays null)."""
    from pyspark.sql import functions as F

    if format == "raw":
        return F.col(columns[0]).cast("binary")
    fields = F.struct(*[F.col(name) for name in columns])
    if format == "json":
        text = F.to_json(fields, {"ignoreNullFields": "false", "timestampFormat": _TIMESTAMP})
    else:
        text = F.to_csv(fields, {"timestampFormat": _TIMESTAMP})
    return text.cast("binary")
