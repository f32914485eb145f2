"""Each logical operator as DataFrame operations on Spark."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from pyspark import Broadcast
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from keyflow.changelog import DELETED, OFFSET, OP, RETRACTIONS, UPDATE_BEFORE
from keyflow.errors import PlanError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan import nodes
from keyflow.plan.descriptors import ValueState
from keyflow.plan.graph import Operator
from keyflow.runtime.aggregates import PartialMerge, RunningAggregate, mergeable_aggregates, retracting_aggregates
from keyflow.runtime.changelog import (
    ROWS,
    SIGN,
    Normalize,
    RetractingAggregate,
)
from keyflow.runtime.errors import first_line
from keyflow.runtime.exchange import keyed_exchange, null_key_condition
from keyflow.runtime.keygroups import key_group_column
from keyflow.runtime.workers import BatchMapper, ProcessRunner, conform
from keyflow.state.durable import CheckpointedState, MemoryState

NULL_KEY_MARKER = "[keyflow-null-keys]"
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
        raise PlanError(f"operator {node.name!r} ({node.kind}: {_described(node)}): {first_line(str(error))}") from None
    raise AssertionError(node.kind)


def require_key_columns(node: nodes.KeyedNode, frame: DataFrame) -> None:
    missing = [key for key in node.keys if key not in frame.columns]
    if missing and node.reinterpreted:
        raise PlanError(
            f"operator {node.name!r}: reinterpret_as_keyed column(s) {missing} are not in the rows of the operator "
            f"before it ({frame.columns}); keep the key columns in its output, or use key_by(...)"
        )
    if missing:
        raise PlanError(
            f"operator {node.name!r}: key_by column(s) {missing} not found; available columns: {frame.columns}"
        )


def apply_keyed(
    node: nodes.KeyedNode,
    frame: DataFrame,
    operator: Operator,
    max_parallelism: int,
    null_keys: str,
    keyed_state: CheckpointedState | None = None,
    verify: bool = True,
    pre_keyed: bool = False,
    report_keys: bool = False,
    adaptive: AdaptiveExchange | None = None,
    ranges: KeyGroupRanges | None = None,
    side: Broadcast[pa.Table] | None = None,
) -> DataFrame:
    """aggregate and process: exact exchange by key group, then the keyed operator.

    ``keyed_state`` is where keyed state lives: None for a batch run (an aggregate is then
    one Spark aggregation), a checkpoint in streaming (an aggregate's partials of each
    micro-batch are merged into state).

    ``null_keys`` is the policy for rows whose key has a null: ``fail`` (the exchange's
    routing expression raises, so the check cannot be moved or evaluated twice by Spark's
    optimizer), ``drop``, or ``keep`` (none are left: they went to a dead-letter sink).
    An aggregate applies it after Spark's aggregation, where all rows of a null key have
    become one row, so the check costs nothing per input row.

    ``pre_keyed``: the rows come from a pre-keyed source, each with its split's key group and
    in the partition of the subtask that owns it; ``report_keys`` has the subtasks report
    new keys for the driver's one-split-per-key check.

    ``adaptive`` (a batch job's auto-parallelism) replaces the exchange: it decides how many
    subtasks read the rows and which key groups each owns; ``ranges`` are those of the keyed
    operator a reinterpreted one follows. ``side``: a process function's broadcast side input.
    """
    parallelism = operator.parallelism
    fail_message = f"{NULL_KEY_MARKER} {node.id}" if null_keys == "fail" else None
    decided: list[KeyGroupRanges | None] = [ranges]

    def exchange(rows: DataFrame, keep_key_group: bool) -> DataFrame:
        if null_keys == "drop":
            rows = rows.filter(~null_key_condition(node.keys))
        if node.reinterpreted:  # already in the subtask of its key group: the worker checks that
            key_group = F.col(KEY_GROUP_COLUMN) if pre_keyed else key_group_column(list(node.keys), max_parallelism)
            if fail_message is not None:
                key_group = F.when(null_key_condition(node.keys), F.raise_error(F.lit(fail_message))).otherwise(
                    key_group
                )
            return rows.withColumn(KEY_GROUP_COLUMN, key_group)
        if adaptive is not None:
            exchanged, decided[0] = adaptive(rows, keep_key_group, fail_message)
            return exchanged
        return keyed_exchange(rows, node.keys, max_parallelism, parallelism, keep_key_group, fail_message)

    def run(
        exchanged: DataFrame,
        function: Any,
        schema: pa.Schema,
        state: Mapping[str, Any],
        order_by: tuple,
        unique_keys: bool = False,
    ) -> DataFrame:
        runner = ProcessRunner(
            function, schema, node.keys, order_by, state, max_parallelism, parallelism,
            f"{node.kind} {node.name!r}", keyed_state or MemoryState(), node.reinterpreted, verify, report_keys,
            decided[0], side, unique_keys,
        )  # fmt: skip
        return map_in_arrow(exchanged, runner, schema, node)

    try:
        if isinstance(node, nodes.NormalizeNode):
            values = tuple(column for column in frame.columns if column not in (*node.keys, OFFSET, DELETED, OP))
            exchanged = exchange(frame, keep_key_group=True).sortWithinPartitions(*node.keys)
            types = to_arrow_schema(frame.select(*node.keys, *values).schema, timezone=session_timezone(frame))
            output = pa.schema([*types, pa.field(OP, pa.string())])
            normalize = Normalize(node.keys, values)
            return run(exchanged, normalize, output, Normalize.state(types, node.keys), (OFFSET,))
        if isinstance(node, nodes.AggregateNode) and node.changelog:
            return _retracting_aggregate(node, frame, exchange, run)
        if isinstance(node, nodes.AggregateNode) and node.reinterpreted and not node.retracting:
            return _running_aggregate(node, frame, exchange, run)
        if isinstance(node, nodes.AggregateNode) and node.reinterpreted:
            # No exchange, so no Spark groupBy (it would shuffle): whole keys aggregated in the worker,
            # and, like key_by's aggregate, each changed key's new values without row kinds.
            changes = _retracting_aggregate(node, frame, exchange, run)
            return changes.filter(F.col(OP) != F.lit(UPDATE_BEFORE)).drop(OP)
        if isinstance(node, nodes.AggregateNode) and keyed_state is None:
            columns = [F.expr(expression).alias(name) for name, expression in node.aggregations.items()]
            grouped = frame.groupBy(*node.keys)
            aggregated = grouped.agg(*columns) if columns else frame.select(*node.keys).dropDuplicates()
            return exchange(aggregated, keep_key_group=False)
        if isinstance(node, nodes.AggregateNode):
            aggregates = mergeable_aggregates(frame.sparkSession, node.name, node.aggregations)
            partials = {column: expression for a in aggregates for column, (_, expression) in a.partials().items()}
            partial = frame.groupBy(*node.keys).agg(*[F.expr(e).alias(column) for column, e in partials.items()])
            types = to_arrow_schema(partial.schema, timezone=session_timezone(frame))
            output = [types.field(key) for key in node.keys]
            for aggregate in aggregates:
                if aggregate.function in ("avg", "mean"):
                    output.append(pa.field(aggregate.name, pa.float64()))
                else:
                    output.append(types.field(f"__{aggregate.name}").with_name(aggregate.name))
            state = {column: ValueState(types.field(column).type) for column in partials}
            merge = PartialMerge(aggregates, node.keys)
            return run(exchange(partial, keep_key_group=True), merge, pa.schema(output), state, (), unique_keys=True)
        if isinstance(node, nodes.ProcessNode):
            schema = _arrow_schema(node.schema, node, session_timezone(frame))
            for column in node.order_by:
                if column not in frame.columns:
                    raise PlanError(f"operator {node.name!r}: order_by column {column!r} not found in {frame.columns}")
            exchanged = exchange(frame, keep_key_group=True)
            if node.order_by:  # whole keys per call; without order_by the worker groups each batch by hashing
                exchanged = exchanged.sortWithinPartitions(*node.keys)
            return run(exchanged, node.function, schema, dict(node.state), node.order_by)
    except (AnalysisException, ParseException) as error:
        raise PlanError(f"operator {node.name!r} ({node.kind}: {_described(node)}): {first_line(str(error))}") from None
    raise AssertionError(node.kind)


def _running_aggregate(node: nodes.AggregateNode, frame: DataFrame, exchange: Any, run: Any) -> DataFrame:
    """An aggregate after reinterpret_as_keyed: no exchange, so no Spark groupBy (it would
    shuffle). Spark evaluates each argument; the worker groups rows by hashing (no sort),
    merges running partials and emits each touched key once, as key_by's aggregate does."""
    where = "after reinterpret_as_keyed (it runs in the worker; use key_by for others)"
    aggregates = retracting_aggregates(frame.sparkSession, node.name, dict(node.aggregations), where)
    arguments = [F.expr(a.argument).alias(f"__arg_{a.name}") for a in aggregates if a.argument is not None]
    carried = [F.col(KEY_GROUP_COLUMN)] if KEY_GROUP_COLUMN in frame.columns else []  # a pre-keyed source's
    prepared = frame.select(*[F.col(key) for key in node.keys], *arguments, *carried)
    types = to_arrow_schema(prepared.schema, timezone=session_timezone(frame))
    specs = tuple(
        dataclasses.replace(a, argument=None if a.argument is None else f"__arg_{a.name}") for a in aggregates
    )
    output = [types.field(key) for key in node.keys]
    for spec in specs:
        argument_type = None if spec.argument is None else types.field(spec.argument).type
        output.append(pa.field(spec.name, spec.output_type(argument_type)))
    function = RunningAggregate(node.keys, specs)
    return run(exchange(prepared, keep_key_group=True), function, pa.schema(output), function.state(specs, types), ())


def _retracting_aggregate(node: nodes.AggregateNode, frame: DataFrame, exchange: Any, run: Any) -> DataFrame:
    """An aggregate whose input may retract rows (``op`` -U/-D) and whose output is a changelog:
    Spark evaluates each argument and the row's sign, the state keeps what retraction needs."""
    where = "after reinterpret_as_keyed (it runs in the worker; use key_by for others)" if not node.changelog else (
        "over a changelog")  # fmt: skip
    aggregates = retracting_aggregates(frame.sparkSession, node.name, dict(node.aggregations), where)
    if node.changelog_input and OP not in frame.columns:
        raise PlanError(
            f"operator {node.name!r}: its input is a changelog, but the rows reaching it have no {OP!r} column (a "
            f"select or map_batches before it dropped it), so updates and deletes would count as inserts; keep "
            f"{OP!r} in the columns of the operators before it"
        )
    sign = (
        F.when(F.col(OP).isin(*RETRACTIONS), F.lit(-1)).otherwise(F.lit(1)) if node.changelog_input else F.lit(1)
    ).cast("byte")
    arguments = [F.expr(a.argument).alias(f"__arg_{a.name}") for a in aggregates if a.argument is not None]
    carried = [F.col(KEY_GROUP_COLUMN)] if KEY_GROUP_COLUMN in frame.columns else []  # a pre-keyed source's
    prepared = frame.select(*[F.col(key) for key in node.keys], sign.alias(SIGN), *arguments, *carried)
    types = to_arrow_schema(prepared.schema, timezone=session_timezone(frame))
    specs, state, output = [], {ROWS: ValueState(pa.int64())}, [types.field(key) for key in node.keys]
    for aggregate in aggregates:
        column = None if aggregate.argument is None else f"__arg_{aggregate.name}"
        argument_type = None if column is None else types.field(column).type
        spec = dataclasses.replace(aggregate, argument=column)
        specs.append(spec)
        state.update(spec.state(argument_type))
        output.append(pa.field(aggregate.name, spec.output_type(argument_type)))
    output.append(pa.field(OP, pa.string()))
    function = RetractingAggregate(node.keys, tuple(specs), every_key=not node.changelog)
    # Ordered by sign only to receive whole keys per call: one -U/+U pair per changed key and micro-batch.
    return run(exchange(prepared, keep_key_group=True).sortWithinPartitions(*node.keys), function, pa.schema(output),
               state, (SIGN,))  # fmt: skip


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
        return _arrow_schema(node.schema, node, session_timezone(frame))
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


def session_timezone(frame: DataFrame) -> str:
    return str(frame.sparkSession.conf.get("spark.sql.session.timeZone"))


def _arrow_schema(schema: pa.Schema | str | None, node: nodes.Node, timezone: str) -> pa.Schema:
    if isinstance(schema, pa.Schema):
        return schema
    try:
        struct = StructType.fromDDL(str(schema))
    except (ParseException, AnalysisException, ValueError) as error:
        raise PlanError(
            f"operator {node.name!r}: schema {schema!r} is not valid DDL ({first_line(str(error))})"
        ) from None
    return to_arrow_schema(struct, timezone=timezone)


def _described(node: nodes.Node) -> str:
    return ", ".join(f"{key}={value}" for key, value in node.describe().items())
