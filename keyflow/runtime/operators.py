"""Stateless operators as DataFrame operations on Spark, and what keyed translators share."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from keyflow.errors import PlanError
from keyflow.plan import nodes
from keyflow.plan.columns import missing_key_message
from keyflow.runtime.errors import first_line
from keyflow.runtime.workers import BatchMapper, conform

KeyGroupRanges = tuple[tuple[int, int], ...]  # each subtask's inclusive key-group range
# (rows, keep the key-group column, null-key failure message) -> (exchanged rows, ranges)
AdaptiveExchange = Callable[[DataFrame, bool, str | None], tuple[DataFrame, KeyGroupRanges]]


def apply_stateless(node: nodes.Node, frame: DataFrame) -> DataFrame:
    """select, filter, with_columns and map_batches: no exchange of their own."""
    try:
        match node:
            case nodes.SelectNode():
                return frame.selectExpr(*node.expressions)
            case nodes.FilterNode():
                return frame.filter(F.expr(node.condition))
            case nodes.WithColumnsNode():
                return frame.withColumns({name: F.expr(expression) for name, expression in node.columns.items()})
            case nodes.MapBatchesNode():
                schema = _output_schema(node, frame)
                mapper = BatchMapper(node.function, schema, node.batch_format, f"map_batches {node.name!r}")  # type: ignore[arg-type]
                return map_in_arrow(frame, mapper, schema, node)
    except (AnalysisException, ParseException) as error:
        raise analysis_error(node, error) from None
    raise AssertionError(node.kind)


def analysis_error(node: nodes.Node, error: Exception) -> PlanError:
    """What Spark's analyser found in an operator, naming it and what it was asked to do."""
    return PlanError(f"operator {node.name!r} ({node.kind}: {described(node)}): {first_line(str(error))}")


def require_key_columns(node: nodes.KeyedNode, frame: DataFrame) -> None:
    missing = [key for key in node.keys if key not in frame.columns]
    if missing:
        raise PlanError(missing_key_message(node, missing, frame.columns))


def map_in_arrow(frame: DataFrame, runner: Any, schema: pa.Schema, node: nodes.Node) -> DataFrame:
    """``mapInArrow``, with a clear error when the user's function cannot be pickled."""
    try:
        return frame.mapInArrow(runner, from_arrow_schema(schema))
    except pickle.PicklingError as error:
        raise PlanError(
            f"operator {node.name!r}: its function cannot be sent to Spark's Python workers ({error}); "
            "do not capture locks, threads, sessions or open files in it"
        ) from None


def _output_schema(node: nodes.MapBatchesNode, frame: DataFrame) -> pa.Schema:
    """The declared schema, or the schema of the function's result on an empty batch."""
    if node.schema is not None:
        return arrow_schema(node.schema, node, session_timezone(frame))
    empty = pa.RecordBatch.from_pylist([], schema=to_arrow_schema(frame.schema, timezone=session_timezone(frame)))
    argument = empty.to_pandas() if node.batch_format == "pandas" else empty
    try:
        result = node.function(argument)  # type: ignore[misc]
        inferred = conform(result, _schema_of(result), node.name).schema
    except Exception as error:
        raise PlanError(
            f"map_batches {node.name!r}: could not infer the output schema by calling the function on an empty "
            f"batch ({type(error).__name__}: {error}); pass schema='col type, ...'"
        ) from None
    # An empty pandas column has no type; a column passed through keeps its input type.
    fields = []
    for field in inferred:
        if pa.types.is_null(field.type):
            if field.name not in empty.schema.names:
                raise PlanError(
                    f"map_batches {node.name!r}: the type of output column {field.name!r} cannot be inferred "
                    "from an empty batch; pass schema='col type, ...'"
                )
            field = empty.schema.field(field.name)
        fields.append(field)
    return pa.schema(fields)


def _schema_of(result: object) -> pa.Schema:
    if isinstance(result, (pa.Table, pa.RecordBatch)):
        return result.schema
    return pa.Schema.from_pandas(result, preserve_index=False)  # type: ignore[arg-type]


def packed_rows(frames: Sequence[DataFrame]) -> list[tuple[Column, Column]]:
    """Each frame's columns as one struct column, and a null of that struct's type: rows of
    several inputs in one frame, each input's in a column of its own."""
    packed = []
    for frame in frames:
        struct = F.struct(*[F.col(f"`{name}`") for name in frame.columns])
        packed.append((struct, F.lit(None).cast(frame.select(struct.alias("p")).schema["p"].dataType)))
    return packed


def session_timezone(frame: DataFrame) -> str:
    return str(frame.sparkSession.conf.get("spark.sql.session.timeZone"))


def arrow_schema(schema: pa.Schema | str | None, node: nodes.Node, timezone: str) -> pa.Schema:
    if isinstance(schema, pa.Schema):
        return schema
    try:
        struct = StructType.fromDDL(str(schema))
    except (ParseException, AnalysisException, ValueError) as error:
        raise PlanError(
            f"operator {node.name!r}: schema {schema!r} is not valid DDL ({first_line(str(error))})"
        ) from None
    return to_arrow_schema(struct, timezone=timezone)


def described(node: nodes.Node) -> str:
    return ", ".join(f"{key}={value}" for key, value in node.describe().items())
