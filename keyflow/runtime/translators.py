"""One translator per physical keyed kind (``keyflow.plan.physical``): DataFrame operations on Spark.

The plan decided the kind; a translator only builds it: the exchange by key group, then
the keyed function in the workers (``mapInArrow``), or for a batch aggregate Spark's own
``groupBy``. :class:`KeyedContext` is what every kind shares: routing and the worker protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import Accumulator, Broadcast
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame, GroupedData, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from keyflow.changelog import DELETED, INSERT, OFFSET, OP, RETRACTIONS, UPDATE_BEFORE
from keyflow.errors import NullKeysError, PlanError, encode
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan import physical
from keyflow.plan.aggregates import AggregateCall
from keyflow.plan.columns import join_clash_message, join_clashes, missing_order_by_message, window_clash_message
from keyflow.plan.descriptors import StateDescriptor, ValueState, with_ttl_columns
from keyflow.plan.event_time import NO_WATERMARK, PROCESSING_TIME, timer_state
from keyflow.plan.graph import Operator
from keyflow.plan.nodes import IS_UPDATE, WINDOW_END, WINDOW_START, JoinNode, KeyedNode, RankNode, Windowing
from keyflow.runtime.aggregates import PartialMerge, RunningAggregate, partials
from keyflow.runtime.changelog import ROWS, SIGN, Normalize, Retracting, RetractingAggregate
from keyflow.runtime.connected import PACKED, CoProcess, TimedCoProcess
from keyflow.runtime.exchange import keyed_exchange, null_key_condition
from keyflow.runtime.joins import (
    ROW_KIND,
    TIME_FIELD,
    ChangelogJoinRows,
    IdleChangelogJoinRows,
    IdleJoinRows,
    Interval,
    IntervalJoinRows,
    JoinRows,
    JoinSides,
    WindowJoinRows,
    expiry_state,
    window_state,
)
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.keygroups import key_group_column
from keyflow.runtime.operators import (
    AdaptiveExchange,
    KeyGroupRanges,
    analysis_error,
    arrow_schema,
    map_in_arrow,
    session_timezone,
)
from keyflow.runtime.over import TIME as OVER_TIME
from keyflow.runtime.over import OverRows, argument_column, over_batch, partial_fields, result_type
from keyflow.runtime.ranks import RankShape, RetractableTopNRows, TopNRows, WindowTopNRows
from keyflow.runtime.row_changes import ungroupable_fields
from keyflow.runtime.window_assign import EVENT_MICROS, event_micros, field_micros, split_late, with_windows
from keyflow.runtime.windows import (
    END_MICROS,
    ROW_COUNT,
    ROW_PREFIX,
    START_MICROS,
    SessionMerge,
    WindowMerge,
    WindowRows,
)
from keyflow.runtime.workers import BOUNDED, KeyedRunner, KeyedTask, TimedUserProcess, UserProcess
from keyflow.state.durable import CheckpointedState, MemoryState
from keyflow.state.timers import TIMESTAMP, TaskTime


@dataclass
class KeyedContext:
    """How a keyed operator's rows are routed and its function run, whatever its kind.

    ``keyed_state``: durable state by key group (streaming), or None (one batch run).
    ``null_keys``: ``fail`` (the routing expression raises, so Spark's optimizer cannot move
    or repeat the check), ``drop``, or ``keep`` (none are left: a dead-letter sink has them).
    ``pre_keyed``: rows come from a pre-keyed source with their split's key group, in the
    partition of the subtask owning it; ``report_keys``: subtasks report new keys for the
    driver's one-split-per-key check. ``adaptive`` (batch auto-parallelism) replaces the
    exchange and decides the key groups; ``ranges`` are those of the keyed operator a
    reinterpreted one follows; ``side``: a process function's broadcast side input.
    """

    node: KeyedNode
    operator: Operator
    max_parallelism: int
    null_keys: str
    keyed_state: CheckpointedState | None = None
    verify: bool = True
    pre_keyed: bool = False
    report_keys: bool = False
    adaptive: AdaptiveExchange | None = None
    ranges: KeyGroupRanges | None = None
    side: Broadcast[pa.Table] | None = None
    time: TaskTime = BOUNDED
    rejected: Callable[[KeyedNode, DataFrame | None], Observation | None] | None = None
    persist: Callable[[DataFrame], DataFrame] | None = None  # a frame read twice, computed once
    late_accumulator: Callable[[KeyedNode], Accumulator[int]] | None = None
    state_ttl: int = 0  # table.exec.state.ttl in microseconds (0: off)

    def reject(self, rows: DataFrame | None) -> Observation | None:
        """Hand rows without a place (late ones) to the dead letters; None: they are dropped,
        counted by the returned observation."""
        assert self.rejected is not None  # the frame builder gives one
        return self.rejected(self.node, rows)

    @property
    def label(self) -> str:
        """The operator as errors name it."""
        return f"{self.node.kind} {self.node.name!r}"

    def exchange(self, rows: DataFrame, keep_key_group: bool) -> DataFrame:
        """Rows routed to the subtask owning their key group (a reinterpreted operator's are
        there already: they only get their key group, which the worker checks)."""
        node = self.node
        fail_message = encode(NullKeysError(node.id)) if self.null_keys == "fail" else None
        if self.null_keys == "drop":
            rows = rows.filter(~null_key_condition(node.keys))
        if node.reinterpreted:
            key_group = (
                F.col(KEY_GROUP_COLUMN) if self.pre_keyed else key_group_column(list(node.keys), self.max_parallelism)
            )
            if fail_message is not None:
                key_group = F.when(null_key_condition(node.keys), F.raise_error(F.lit(fail_message))).otherwise(
                    key_group
                )
            return rows.withColumn(KEY_GROUP_COLUMN, key_group)
        if self.adaptive is not None:
            exchanged, self.ranges = self.adaptive(rows, keep_key_group, fail_message)
            return exchanged
        return keyed_exchange(
            rows, node.keys, self.max_parallelism, self.operator.parallelism, keep_key_group, fail_message
        )

    def run(
        self,
        exchanged: DataFrame,
        function: KeyedFunction,
        schema: pa.Schema,
        state: Mapping[str, StateDescriptor],
        order_by: tuple[str, ...],
        unique_keys: bool = False,
        keys: tuple[str, ...] | None = None,
    ) -> DataFrame:
        """The keyed function over each subtask's rows, in the workers; ``keys``: what state is
        kept by, when more than the routing keys (a key and its window)."""
        node = self.node
        task = KeyedTask(
            self.label, schema, keys or node.keys, dict(state), self.max_parallelism,
            self.operator.parallelism, self.keyed_state or MemoryState(), order_by, node.reinterpreted, self.verify,
            self.report_keys, self.ranges, unique_keys, self.time,
        )  # fmt: skip
        return map_in_arrow(exchanged, KeyedRunner(function, task), schema, node)


def translate_keyed(operator: physical.KeyedOperator, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """``operator`` on ``frame`` (its input) by the translator of its kind."""
    try:
        return TRANSLATORS[type(operator)](operator, frame, context)
    except (AnalysisException, ParseException) as error:
        raise analysis_error(operator.node, error) from None


def _normalize(operator: physical.ChangelogNormalize, frame: DataFrame, context: KeyedContext) -> DataFrame:
    node = operator.node
    values = tuple(column for column in frame.columns if column not in (*node.keys, OFFSET, DELETED, OP))
    exchanged = context.exchange(frame, keep_key_group=True).sortWithinPartitions(*node.keys)
    types = to_arrow_schema(frame.select(*node.keys, *values).schema, timezone=session_timezone(frame))
    output = pa.schema([*types, pa.field(OP, pa.string())])
    state = Normalize.state(types, node.keys)
    return context.run(exchanged, Normalize(node.keys, values), output, state, (OFFSET,))


def _process(operator: physical.KeyedProcess, frame: DataFrame, context: KeyedContext) -> DataFrame:
    node = operator.node
    assert node.function is not None  # the builder requires one
    return _user_function(operator, frame, context, UserProcess(node.function, context.label, context.side), {})


def _timed_process(operator: physical.TimedProcess, frame: DataFrame, context: KeyedContext) -> DataFrame:
    node = operator.node
    assert node.function is not None  # the builder requires both
    assert node.on_timer is not None
    function = TimedUserProcess(node.function, node.on_timer, context.label)
    return _user_function(operator, frame, context, function, timer_state())


def _user_function(
    operator: physical.KeyedProcess,
    frame: DataFrame,
    context: KeyedContext,
    function: KeyedFunction,
    hidden: Mapping[str, StateDescriptor],
) -> DataFrame:
    """A user's process function with its declared state (and keyflow's ``hidden`` state)."""
    node = operator.node
    schema = arrow_schema(node.schema, node, session_timezone(frame))
    for column in node.order_by:
        if column not in frame.columns:
            raise PlanError(missing_order_by_message(node, column, frame.columns))
    exchanged = context.exchange(frame, keep_key_group=True)
    if node.order_by:  # whole keys per call; without order_by the worker groups each batch by hashing
        exchanged = exchanged.sortWithinPartitions(*node.keys)
    return context.run(exchanged, function, schema, {**with_ttl_columns(node.state), **hidden}, node.order_by)


def _co_process(operator: physical.KeyedCoProcess, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """``frame``: both inputs' rows (``keyflow.runtime.connected``), routed like one input's."""
    node = operator.node
    assert node.function is not None  # the builder requires both
    assert node.other_function is not None
    schema = arrow_schema(node.schema, node, session_timezone(frame))
    functions = (node.function, node.other_function)
    function = (
        CoProcess(functions, context.label, schema)
        if node.on_timer is None
        else TimedCoProcess(functions, context.label, schema, node.on_timer)
    )
    hidden = timer_state() if node.on_timer is not None else {}
    exchanged = context.exchange(frame, keep_key_group=True)
    return context.run(exchanged, function, schema, {**with_ttl_columns(node.state), **hidden}, ())


def _join(operator: physical.RegularJoin, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """``frame``: both inputs' rows (``keyflow.runtime.connected``); each kept in list state."""
    return _rows_joined(operator.node, frame, context, JoinRows, IdleJoinRows)


def _changelog_join(operator: physical.ChangelogJoin, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """A regular join's, each row's kind first taken out of its packed row (an input of
    inserts: ``+I``), so that a retraction's row equals the row it retracts."""
    node = operator.node
    kinds = {i: F.col(f"`{PACKED[i]}`.`{OP}`") for i in (0, 1) if OP in frame.schema[PACKED[i]].dataType.fieldNames()}
    unkinded = frame.withColumns(
        {
            ROW_KIND: F.coalesce(*kinds.values(), F.lit(INSERT)),
            **{PACKED[i]: F.col(PACKED[i]).dropFields(OP) for i in kinds},
        }
    )
    types = to_arrow_schema(unkinded.schema, timezone=session_timezone(unkinded))
    for position in (0, 1):
        nested = ungroupable_fields(types.field(PACKED[position]).type)
        if nested:
            raise PlanError(
                f"operator {node.name!r}: the {('left', 'right')[position]} input's columns {nested} are lists or "
                "maps, which a join of changelogs cannot match a retraction against; drop them or cast them to "
                "strings before the join"
            )
    return _rows_joined(node, unkinded, context, ChangelogJoinRows, IdleChangelogJoinRows)


def _rows_joined(
    node: JoinNode, frame: DataFrame, context: KeyedContext, kind: type[JoinRows], idle: type[IdleJoinRows]
) -> DataFrame:
    sides, output = _join_shape(node, frame)
    function = kind(sides, output) if not context.state_ttl else idle(sides, output, context.state_ttl)
    exchanged = context.exchange(frame, keep_key_group=True)
    return context.run(exchanged, function, output, JoinRows.state_of(sides), ())


def _interval_join(operator: physical.IntervalJoin, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """A regular join's rows and state, the pairs limited by event time, rows dropped by the
    watermark. Spark reads each row's event time as the watermark does (any type a watermark
    column may have), into a field of its packed row."""
    node = operator.node
    for position in (0, 1):
        _require_time_field(node, frame, position, node.time_columns[position])
    timed = frame.withColumns(
        {
            packed: F.col(packed).withField(TIME_FIELD, field_micros(packed, node.time_columns[i]))
            for i, packed in enumerate(PACKED)
        }
    )
    sides, output = _join_shape(node, timed)
    function = IntervalJoinRows(sides, output, Interval(node.lower, node.upper))
    exchanged = context.exchange(timed, keep_key_group=True)
    return context.run(exchanged, function, output, {**sides.state(), **expiry_state()}, ())


def _require_time_field(node: JoinNode, frame: DataFrame, position: int, column: str) -> None:
    """A time-bounded join's input has its event-time column, or a PlanError naming it."""
    fields = frame.schema[PACKED[position]].dataType.fieldNames()
    if column not in fields:
        raise PlanError(
            f"operator {node.name!r}: the event-time column {column!r} (the source's watermark column) is not among "
            f"the {('left', 'right')[position]} input's columns {fields}; keep it in the operators before the join"
        )


def _window_join(operator: physical.WindowJoin, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Each row's window(s) from its input's event time (late rows dropped, counted), then a
    regular join's rows and state kept by key and window, a window's rows dropped at its end."""
    node = operator.node
    assert node.assigner is not None  # the builder requires one
    for position in (0, 1):
        _require_time_field(node, frame, position, node.time_columns[position])
        clashes = sorted({WINDOW_START, WINDOW_END} & set(frame.schema[PACKED[position]].dataType.fieldNames()))
        if clashes:
            raise PlanError(window_clash_message(node.name, clashes))
    times = [F.col(f"`{PACKED[i]}`.`{node.time_columns[i]}`") for i in (0, 1)]
    windowing = Windowing(node.assigner, WINDOW_TIME)
    timed = frame.withColumn(WINDOW_TIME, F.coalesce(*times))
    windowed = with_windows(windowing, _assigned(node, windowing, timed, context), context.time.watermark_before)
    keys = (*node.keys, WINDOW_START, WINDOW_END)
    windowed = windowed.select(*keys, *[c for c in frame.columns if c not in node.keys])
    sides, output = _join_shape(node, windowed, keys)
    exchanged = context.exchange(windowed, keep_key_group=True)
    state = {**sides.state(), **window_state()}
    return context.run(exchanged, WindowJoinRows(sides, output), output, state, (), keys=keys)


WINDOW_TIME = "__window_time"  # a window join's rows: the event time of whichever input each is from


def _join_shape(node: JoinNode, frame: DataFrame, keys: tuple[str, ...] = ()) -> tuple[JoinSides, pa.Schema]:
    """A join's sides (from the packed rows' types) and its output schema: ``keys`` (the
    join's keys by default), the left input's other columns, the right's; nullable, as a
    padded row has nulls where a non-null column has none."""
    types = to_arrow_schema(frame.schema, timezone=session_timezone(frame))
    row_types = (types.field(PACKED[0]).type, types.field(PACKED[1]).type)
    kept = tuple(tuple(f.name for f in row_types[i] if f.name not in node.input_keys(i) and f.name != TIME_FIELD)
                 for i in (0, 1))  # fmt: skip
    clashes = join_clashes(node.other_keys, [f.name for f in row_types[0]], kept[1])
    if clashes:
        raise PlanError(join_clash_message(node.name, clashes))
    sides = JoinSides((node.how in ("left", "full"), node.how in ("right", "full")), row_types, kept, node.changelog)
    fields = [types.field(key) for key in keys or node.keys]
    fields += [row_types[i].field(name).with_nullable(True) for i in (0, 1) for name in kept[i]]
    return sides, pa.schema([*fields, *([pa.field(OP, pa.string())] if sides.changelog else [])])


def _group_by(operator: physical.GroupByAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    node = operator.node
    columns = [F.expr(call.expression).alias(call.name) for call in operator.calls]
    aggregated = frame.groupBy(*node.keys).agg(*columns) if columns else frame.select(*node.keys).dropDuplicates()
    return context.exchange(aggregated, keep_key_group=False)


def _merged_partials(operator: physical.MergedPartialsAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    node = operator.node
    partial, types, values = _partials(operator.calls, frame.groupBy(*node.keys))
    state = {column: ValueState(types.field(column).type) for column in _partial_expressions(operator.calls)}
    merge = PartialMerge(operator.calls, node.keys)
    exchanged = context.exchange(partial, keep_key_group=True)
    output = pa.schema([*[types.field(key) for key in node.keys], *values])
    return context.run(exchanged, merge, output, state, (), unique_keys=True)


def _partial_expressions(calls: tuple[AggregateCall, ...]) -> dict[str, str]:
    return {column: expression for call in calls for column, (_, expression) in partials(call).items()}


def _partials(
    calls: tuple[AggregateCall, ...], grouped: GroupedData, *extra: Column
) -> tuple[DataFrame, pa.Schema, list[pa.Field]]:
    """Spark's partial aggregates of one micro-batch (and ``extra`` aggregates), their Arrow
    types, and the fields of the final values."""
    wanted = _partial_expressions(calls)
    partial = grouped.agg(*[F.expr(e).alias(column) for column, e in wanted.items()], *extra)
    types = to_arrow_schema(partial.schema, timezone=session_timezone(partial))
    values = [
        pa.field(call.name, pa.float64())
        if call.function in ("avg", "mean")
        else types.field(f"__{call.name}").with_name(call.name)
        for call in calls
    ]
    return partial, types, values


def _window_aggregate(operator: physical.WindowAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Tumbling and sliding windows: Spark assigns each row its window(s) and aggregates the
    micro-batch per key and window; state merges the partials and fires on the watermark."""
    windowing = operator.node.windowing
    windowed = with_windows(
        windowing, _assigned(operator.node, windowing, frame, context), context.time.watermark_before
    )
    function = WindowMerge(operator.calls, windowing.allowed_lateness, bool(windowing.allowed_lateness))
    return _merged_windows(operator, windowed, function, context)


def _processing_time_window_aggregate(
    operator: physical.ProcessingTimeWindowAggregate, frame: DataFrame, context: KeyedContext
) -> DataFrame:
    """Windows by the processing time: each row in the windows of its PROCTIME() column (the
    time its micro-batch runs, Spark's clock; so a row's time is always in its window), none
    late; the windows fire by the operators' clock, read before the micro-batch's rows."""
    windowing = operator.node.windowing
    timed = frame.withColumn(EVENT_MICROS, event_micros(windowing.time_column))
    windowed = with_windows(windowing, timed, NO_WATERMARK)
    function = WindowMerge(operator.calls, 0, False, domain=PROCESSING_TIME)
    return _merged_windows(operator, windowed, function, context)


def _merged_windows(
    operator: physical.WindowAggregate, windowed: DataFrame, function: WindowMerge, context: KeyedContext
) -> DataFrame:
    """Spark aggregates the micro-batch's rows per key and window; ``function`` merges the
    partials in state and fires the windows."""
    node, windowing = operator.node, operator.node.windowing
    keys = (*node.keys, WINDOW_START, WINDOW_END)
    partial, types, values = _partials(operator.calls, windowed.groupBy(*keys))
    state = WindowMerge.state({column: types.field(column).type for column in _partial_expressions(operator.calls)})
    exchanged = context.exchange(partial, keep_key_group=True)
    output = pa.schema([*[types.field(key) for key in keys], *values, *_updates(windowing)])
    return context.run(exchanged, function, output, state, (), unique_keys=True, keys=keys)


def _session_window_aggregate(
    operator: physical.SessionWindowAggregate, frame: DataFrame, context: KeyedContext
) -> DataFrame:
    """Session windows: Spark's ``session_window`` sessions of the micro-batch per key (with
    their partials) merge in the worker with the key's open sessions."""
    node, windowing = operator.node, operator.node.windowing
    assigned = _assigned(node, windowing, frame, context)
    gap = windowing.assigner.gap
    session = F.session_window(F.timestamp_micros(F.col(EVENT_MICROS)), f"{gap} microseconds")
    bounds = (
        F.min(EVENT_MICROS).alias(START_MICROS),
        (F.max(EVENT_MICROS) + F.lit(gap)).alias(END_MICROS),
        F.count(F.lit(1)).alias(ROW_COUNT),
    )
    grouped = assigned.groupBy(*node.keys, session.alias("__session"))
    partial, types, values = _partials(operator.calls, grouped, *bounds)
    partial = partial.drop("__session")
    state = SessionMerge.state({column: types.field(column).type for column in _partial_expressions(operator.calls)})
    assert context.late_accumulator is not None  # the frame builder gives one
    late = context.late_accumulator(node)  # sessions are late or not once merged (as Flink): in the workers
    function = SessionMerge(operator.calls, windowing.allowed_lateness, context.time.watermark_before, late)
    exchanged = context.exchange(partial, keep_key_group=True)
    window = [pa.field(WINDOW_START, TIMESTAMP), pa.field(WINDOW_END, TIMESTAMP)]
    output = pa.schema([*[types.field(key) for key in node.keys], *window, *values, *_updates(windowing)])
    return context.run(exchanged, function, output, state, ())


def _window_process(operator: physical.WindowProcess, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """All rows of each window kept as a list in its state slot until it fires; then the
    user's function over every fired window at once."""
    node, windowing = operator.node, operator.node.windowing
    assigned = _assigned(node, windowing, frame, context)
    windowed = with_windows(windowing, assigned, context.time.watermark_before)
    row_columns = [c for c in frame.columns if c != KEY_GROUP_COLUMN]
    keys = (*node.keys, WINDOW_START, WINDOW_END)
    rows = windowed.select(*keys, *[F.col(c).alias(f"{ROW_PREFIX}{c}") for c in row_columns],
                           *([F.col(KEY_GROUP_COLUMN)] if KEY_GROUP_COLUMN in windowed.columns else []))  # fmt: skip
    types = to_arrow_schema(rows.schema, timezone=session_timezone(frame))
    row_type = pa.struct([types.field(f"{ROW_PREFIX}{c}").with_name(c) for c in row_columns])
    assert node.function is not None  # the builder requires one
    function = WindowRows(node.function, context.label, row_columns, windowing.allowed_lateness)
    schema = arrow_schema(node.schema, node, session_timezone(frame))
    exchanged = context.exchange(rows, keep_key_group=True)
    return context.run(exchanged, function, schema, WindowRows.state(row_type), (), keys=keys)


def _assigned(node: KeyedNode, windowing: Windowing, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """The rows that have a window; the others (late, no event time) to the dead letters or counted."""
    if windowing.time_column not in frame.columns:
        raise PlanError(
            f"operator {node.name!r}: the event-time column {windowing.time_column!r} (the source's watermark "
            f"column) is not among its input's columns {frame.columns}; keep it in the operators before the window"
        )
    count = context.reject(None) if windowing.late_rows is None else None
    if windowing.late_rows is not None and context.persist is not None:
        frame = context.persist(frame)  # read by the window and by its late rows: its inputs run once
    assigned = split_late(windowing, frame, context.time.watermark_before, count, windowing.late_rows is not None)
    if assigned.rejected is not None:
        context.reject(assigned.rejected)
    return assigned.rows


def _updates(windowing: Windowing) -> list[pa.Field]:
    return [pa.field(IS_UPDATE, pa.bool_())] if windowing.allowed_lateness else []


def _in_worker(operator: physical.InWorkerAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """No exchange, so no Spark groupBy (it would shuffle). Spark evaluates each argument; the
    worker groups rows by hashing (no sort), merges running partials and emits each touched
    key once, as key_by's aggregate does."""
    node = operator.node
    prepared, specs, types = _arguments(operator, frame, sign=None)
    output = [types.field(key) for key in node.keys]
    for spec in specs:
        argument_type = None if spec.argument is None else types.field(spec.argument).type
        output.append(pa.field(spec.name, spec.output_type(argument_type)))
    function = RunningAggregate(node.keys, specs)
    exchanged = context.exchange(prepared, keep_key_group=True)
    return context.run(exchanged, function, pa.schema(output), function.state(specs, types), ())


def _retracting(operator: physical.RetractingAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Rows may retract (``op`` -U/-D) what they added; the output is a changelog."""
    node = operator.node
    if node.changelog_input and OP not in frame.columns:
        raise PlanError(
            f"operator {node.name!r}: its input is a changelog, but the rows reaching it have no {OP!r} column (a "
            f"select or map_batches before it dropped it), so updates and deletes would count as inserts; keep "
            f"{OP!r} in the columns of the operators before it"
        )
    sign = F.when(F.col(OP).isin(*RETRACTIONS), F.lit(-1)).otherwise(F.lit(1)) if node.changelog_input else F.lit(1)
    return _retracting_changes(operator, frame, context, sign, every_key=False)


def _in_worker_distinct(
    operator: physical.InWorkerDistinctAggregate, frame: DataFrame, context: KeyedContext
) -> DataFrame:
    """Whole keys aggregated in the worker and, like key_by's aggregate, each changed key's
    new values without row kinds."""
    changes = _retracting_changes(operator, frame, context, F.lit(1), every_key=True)
    return changes.filter(F.col(OP) != F.lit(UPDATE_BEFORE)).drop(OP)


def _retracting_changes(
    operator: physical.Aggregate, frame: DataFrame, context: KeyedContext, sign: Any, every_key: bool
) -> DataFrame:
    """Spark evaluates each argument and the row's sign; the state keeps what retraction needs."""
    node = operator.node
    prepared, specs, types = _arguments(operator, frame, sign)
    state, output = {ROWS: ValueState(pa.int64())}, [types.field(key) for key in node.keys]
    for spec in specs:
        argument_type = None if spec.argument is None else types.field(spec.argument).type
        state.update(spec.state(argument_type))
        output.append(pa.field(spec.name, spec.output_type(argument_type)))
    output.append(pa.field(OP, pa.string()))
    function = RetractingAggregate(node.keys, specs, every_key=every_key)
    # Ordered by sign only to receive whole keys per call: one -U/+U pair per changed key and micro-batch.
    exchanged = context.exchange(prepared, keep_key_group=True).sortWithinPartitions(*node.keys)
    return context.run(exchanged, function, pa.schema(output), state, (SIGN,))


def _arguments(
    operator: physical.Aggregate, frame: DataFrame, sign: Any
) -> tuple[DataFrame, tuple[Retracting, ...], pa.Schema]:
    """The keys, the row's sign (when given) and each aggregate's argument as a column
    ``__arg_<name>``; the aggregates reading those columns; the Arrow types of all."""
    node = operator.node
    arguments = [F.expr(c.argument).alias(f"__arg_{c.name}") for c in operator.calls if c.argument is not None]
    signs = [] if sign is None else [sign.cast("byte").alias(SIGN)]
    carried = [F.col(KEY_GROUP_COLUMN)] if KEY_GROUP_COLUMN in frame.columns else []  # a pre-keyed source's
    prepared = frame.select(*[F.col(key) for key in node.keys], *signs, *arguments, *carried)
    types = to_arrow_schema(prepared.schema, timezone=session_timezone(frame))
    specs = tuple(
        Retracting(c.name, c.function, None if c.argument is None else f"__arg_{c.name}") for c in operator.calls
    )
    return prepared, specs, types


def _rank(operator: physical.Rank, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Batch: Spark's ``row_number`` over each key's rows, then the exchange by key group; no state."""
    return context.exchange(_numbered(operator.node, frame, operator.node.keys), keep_key_group=False)


def _numbered(node: RankNode, frame: DataFrame, partition: tuple[str, ...]) -> DataFrame:
    """The rows numbered ``first``..``limit`` in each ``partition`` by Spark's ``row_number``
    (nulls first ascending, last descending: Flink's order)."""
    order = [F.col(c).desc_nulls_last() if descending else F.col(c).asc_nulls_first() for c, descending in node.order]
    number = F.row_number().over(Window.partitionBy(*partition).orderBy(*order)).cast("bigint")
    ranked = frame.withColumn(RANK_NUMBER, number).filter(F.col(RANK_NUMBER).between(node.first, node.limit))
    return ranked.withColumnRenamed(RANK_NUMBER, node.rank_column) if node.rank_column else ranked.drop(RANK_NUMBER)


def _windowed_rows(operator: physical.WindowTableRankBatch, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """A window Top-N's rows, each with its windows (``window_start``, ``window_end``); late ones left out."""
    node = operator.node
    assert node.windowing is not None  # the builder gives one
    carried = [KEY_GROUP_COLUMN] if KEY_GROUP_COLUMN in frame.columns else []
    columns = [c for c in frame.columns if c != KEY_GROUP_COLUMN]
    windowed = with_windows(
        node.windowing, _assigned(node, node.windowing, frame, context), context.time.watermark_before
    )
    return windowed.select(*columns, WINDOW_START, WINDOW_END, *carried)


def _window_table_rank_batch(
    operator: physical.WindowTableRankBatch, frame: DataFrame, context: KeyedContext
) -> DataFrame:
    """Batch window Top-N: windows assigned, then ``row_number`` per key and window."""
    windows = (*operator.node.keys, WINDOW_START, WINDOW_END)
    numbered = _numbered(operator.node, _windowed_rows(operator, frame, context), windows)
    return context.exchange(numbered, keep_key_group=False)


def _window_table_top_n(operator: physical.WindowTableRank, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Streaming window Top-N: windows assigned in Spark; per key and window the first rows in
    state, emitted when the window ends (``WindowTopNRows``)."""
    windowed = _windowed_rows(operator, frame, context)
    shape, output = _rank_shape(operator, windowed)
    exchanged = context.exchange(windowed.drop(KEY_GROUP_COLUMN), keep_key_group=True)
    function = WindowTopNRows(shape, output, WINDOW_END)
    keys = (*operator.node.keys, WINDOW_START, WINDOW_END)
    return context.run(exchanged, function, output, function.state_of(shape), (), keys=keys)


RANK_NUMBER = "__rank_number"


def _top_n(operator: physical.AppendOnlyTopN, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Streaming: each key's first rows in state, the changes emitted (``keyflow.runtime.ranks``)."""
    shape, output = _rank_shape(operator, frame)
    output = output.append(pa.field(OP, pa.string()))
    exchanged = context.exchange(frame.drop(KEY_GROUP_COLUMN), keep_key_group=True)
    return context.run(exchanged, TopNRows(shape, output), output, shape.state(), ())


def _retractable_top_n(operator: physical.RetractableTopN, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Streaming, of a changelog: each key's current rows and the first ones emitted in state."""
    shape, output = _rank_shape(operator, frame.drop(OP))
    nested = ungroupable_fields(shape.row_type)
    if nested:
        raise PlanError(
            f"operator {operator.node.name!r}: its input's columns {nested} are lists or maps, which a Top-N of a "
            "changelog cannot match a retraction against; drop them or cast them to strings before the Top-N"
        )
    output = output.append(pa.field(OP, pa.string()))
    exchanged = context.exchange(frame.drop(KEY_GROUP_COLUMN), keep_key_group=True)
    return context.run(exchanged, RetractableTopNRows(shape, output), output, RetractableTopNRows.state_of(shape), ())


def _window_top_n(operator: physical.WindowRank, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Streaming per window: each key's (window's) first rows in state, emitted when it ends."""
    node = operator.node
    assert node.window_end is not None  # the plan chose this kind for it
    shape, output = _rank_shape(operator, frame)
    exchanged = context.exchange(frame.drop(KEY_GROUP_COLUMN), keep_key_group=True)
    function = WindowTopNRows(shape, output, node.window_end)
    return context.run(exchanged, function, output, function.state_of(shape), ())


def _over(operator: physical.OverAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Batch: Spark's window functions over each key's rows, then the exchange by key group."""
    node = operator.node
    _over_arguments(operator, frame)
    computed = over_batch(frame, node.keys, node.order, node.frame, operator.calls)
    return context.exchange(computed, keep_key_group=False)


def _over_arguments(operator: physical.OverAggregate, frame: DataFrame) -> tuple[DataFrame, pa.Schema]:
    """The rows with their event time in microseconds and each aggregate's argument as a
    column, and their Arrow types; the aggregates checked against the types (batch and
    streaming take the same ones) and the input's columns."""
    node, calls = operator.node, operator.calls
    clash = sorted({c.name for c in calls} & set(frame.columns))
    if clash:
        raise PlanError(f"operator {node.name!r}: aggregate output {clash} has the name of an input column; rename it")
    arguments = {argument_column(c): F.expr(c.argument) for c in calls if c.argument is not None}
    prepared = frame.drop(KEY_GROUP_COLUMN).withColumns({OVER_TIME: event_micros(node.order), **arguments})
    types = to_arrow_schema(prepared.schema, timezone=session_timezone(frame))
    for call in calls:
        kind = types.field(argument_column(call)).type if call.argument is not None else None
        numeric = kind is not None and (pa.types.is_integer(kind) or pa.types.is_floating(kind))
        ordered = kind is not None and (pa.types.is_timestamp(kind) or pa.types.is_date(kind))
        if call.function != "count" and not (numeric or (ordered and call.function in ("min", "max"))):
            raise PlanError(
                f"operator {node.name!r}: {call.expression} OVER reads a {kind} value; an OVER aggregation sums and "
                "averages integers and floating point numbers, and takes MIN/MAX of those and of times and dates "
                "(CAST a DECIMAL to DOUBLE)"
            )
    return prepared, types


def _row_time_over(operator: physical.RowTimeOverAggregate, frame: DataFrame, context: KeyedContext) -> DataFrame:
    """Streaming: each key's rows wait in state for the watermark (``keyflow.runtime.over``)."""
    node, calls = operator.node, operator.calls
    columns = [c for c in frame.columns if c != KEY_GROUP_COLUMN]
    prepared, types = _over_arguments(operator, frame)
    argument_types = {c.name: types.field(argument_column(c)).type if c.argument else None for c in calls}
    partials = [pa.field(OVER_TIME, pa.int64())]
    partials += [f for c in calls for f in partial_fields(c, argument_types[c.name])]
    row_type, partials_type = pa.struct(list(types)), pa.struct(partials)
    output = pa.schema([*(types.field(c) for c in columns),
                        *(pa.field(c.name, result_type(c, argument_types[c.name])) for c in calls)])  # fmt: skip
    late = context.late_accumulator(node) if context.late_accumulator is not None else None
    function = OverRows(calls, node.frame, row_type, partials_type, output, late, context.time.watermark_before)
    exchanged = context.exchange(prepared, keep_key_group=True)
    return context.run(exchanged, function, output, OverRows.state(row_type, partials_type), ())


def _rank_shape(operator: physical.Rank, frame: DataFrame) -> tuple[RankShape, pa.Schema]:
    """What a streaming Top-N keeps (rows of the input's columns) and its output without row kinds."""
    node = operator.node
    types = to_arrow_schema(frame.drop(KEY_GROUP_COLUMN).schema, timezone=session_timezone(frame))
    deduplicates = isinstance(operator, physical.Deduplicate)
    # keep the last row: a later row of an equal time replaces (also Flink's window deduplication)
    latest_wins = (deduplicates or (isinstance(operator, physical.WindowTableRank) and node.deduplicates)) and (
        node.order[0][1])  # fmt: skip
    shape = RankShape(
        pa.struct(list(types)), node.order, node.limit, node.rank_column, latest_wins, deduplicates, node.first
    )
    ranked = [pa.field(node.rank_column, pa.int64())] if node.rank_column else []
    return shape, pa.schema([*types, *ranked])


TRANSLATORS: dict[type[physical.KeyedOperator], Callable[[Any, DataFrame, KeyedContext], DataFrame]] = {
    physical.ChangelogNormalize: _normalize,
    physical.KeyedProcess: _process,
    physical.TimedProcess: _timed_process,
    physical.KeyedCoProcess: _co_process,
    physical.RegularJoin: _join,
    physical.ChangelogJoin: _changelog_join,
    physical.IntervalJoin: _interval_join,
    physical.WindowJoin: _window_join,
    physical.GroupByAggregate: _group_by,
    physical.MergedPartialsAggregate: _merged_partials,
    physical.WindowAggregate: _window_aggregate,
    physical.SessionWindowAggregate: _session_window_aggregate,
    physical.ProcessingTimeWindowAggregate: _processing_time_window_aggregate,
    physical.WindowProcess: _window_process,
    physical.InWorkerAggregate: _in_worker,
    physical.RetractingAggregate: _retracting,
    physical.InWorkerDistinctAggregate: _in_worker_distinct,
    physical.Rank: _rank,
    physical.AppendOnlyTopN: _top_n,
    physical.Deduplicate: _top_n,
    physical.RetractableTopN: _retractable_top_n,
    physical.WindowRank: _window_top_n,
    physical.WindowTableRankBatch: _window_table_rank_batch,
    physical.WindowTableRank: _window_table_top_n,
    physical.OverAggregate: _over,
    physical.RowTimeOverAggregate: _row_time_over,
}
