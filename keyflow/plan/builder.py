"""The one way a plan is built: the Python API and SQL both add their operators here.

Each method adds one logical node after the checks that need no data (names, parallelism,
uids, keys, aggregations, state, that an object is a source or a sink by the connector
protocols of ``keyflow.connectors.base``), so an operator gets the same checks and the same
node whichever front end wrote it. What needs the whole plan (columns, whether state can
merge or retract, partitioning) is checked by :func:`~keyflow.plan.compile.compile_plan`. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from keyflow.changelog import DELETED, OP
from keyflow.config import Config
from keyflow.connectors.base import (
    AppendOnlySink,
    ChangelogSource,
    DeclaresTypes,
    KnowsColumns,
    KnowsTypes,
    MarksDeletes,
    Sink,
    Source,
    is_unbounded,
)
from keyflow.errors import PlanError, positive_option
from keyflow.plan import nodes
from keyflow.plan.aggregates import over_calls, parse_aggregations
from keyflow.plan.columns import (
    event_time_at,
    join_clash_message,
    join_clashes,
    output_columns,
    union_problems,
    window_clash_message,
)
from keyflow.plan.compile import CompiledPlan, compile_plan
from keyflow.plan.descriptors import StateDescriptor, StateTtlConfig
from keyflow.plan.event_time import WatermarkStrategy, WindowAssigner
from keyflow.plan.functions import ScalarFunction
from keyflow.plan.graph import JobGraph
from keyflow.plan.uids import check_uid


def check_event_time(label: str, source: object, strategy: object) -> None:
    """The watermark strategy's column exists and holds timestamps, where the source tells."""
    if not isinstance(strategy, WatermarkStrategy):
        raise PlanError(
            f"source {label!r} watermark={strategy!r} is not a watermark strategy; pass e.g. "
            "WatermarkStrategy.for_bounded_out_of_orderness('ts', '5 s')"
        )
    types = source.declared_types() if isinstance(source, DeclaresTypes) else None
    types = source.column_types() if isinstance(source, KnowsTypes) else types
    columns = source.column_names() if isinstance(source, KnowsColumns) else None
    if columns is not None and strategy.column not in columns:
        raise PlanError(
            f"source {label!r}: the watermark's event-time column {strategy.column!r} is not among its columns "
            f"{list(columns)}; name a timestamp column of the source"
        )
    found = (types or {}).get(strategy.column)
    if found == "timestamp_ntz":
        raise PlanError(ntz_message(label, strategy.column))
    if found is not None and not found.startswith("timestamp"):
        raise PlanError(
            f"source {label!r}: the watermark's event-time column {strategy.column!r} is {found}, not a timestamp; "
            f"convert it before writing the source, or declare it as a timestamp column"
        )


def ntz_message(label: str, column: str) -> str:
    return (
        f"source {label!r}: the watermark's event-time column {column!r} is a timestamp without time zone "
        "(timestamp_ntz), whose instant depends on the session's time zone; store it as a timestamp with time "
        "zone (UTC), e.g. write it with pyarrow's timestamp('us', tz='UTC')"
    )


def check_parallelism(value: int | None, what: str) -> int | None:
    return positive_option(value, f"{what} parallelism")


@dataclasses.dataclass(frozen=True)
class Keying:
    """How the next keyed operator gets its rows: by ``keys`` (checked), with ``on_null`` for
    rows with a null key, ``reinterpreted`` when the input is already partitioned by them."""

    keys: tuple[str, ...]
    on_null: Sink | None = None
    reinterpreted: bool = False

    def fields(self) -> dict[str, Any]:
        """The keyed node's fields this keying sets."""
        return {"keys": self.keys, "on_null": self.on_null, "reinterpreted": self.reinterpreted}


class PlanBuilder:
    """A pipeline's operators, its sinks and its configuration, as the front ends build them.

    ``overrides`` (the CLI's ``--conf``) win over every option set later (SQL's ``SET``)."""

    def __init__(self, config: Config, overrides: Mapping[str, Any] | None = None) -> None:
        self._overrides = dict(overrides or {})
        self.config = config.merged(self._overrides)
        self._nodes: dict[int, nodes.Node] = {}
        self._sinks: list[int] = []
        self._functions: dict[str, ScalarFunction] = {}

    @property
    def operators(self) -> Mapping[int, nodes.Node]:
        """Every operator added so far, by id."""
        return self._nodes

    def node(self, node_id: int) -> nodes.Node:
        return self._nodes[node_id]

    def set_option(self, key: str, value: Any) -> None:
        self.config = self.config.merged({key: value}).merged(self._overrides)

    def _add(
        self, kind: type[nodes.Node], inputs: tuple[int, ...], name: str, parallelism: int | None, **fields: Any
    ) -> int:
        """Add an operator; its id is its position in creation order."""
        node_id = len(self._nodes) + 1
        self._nodes[node_id] = kind(node_id, inputs, name, parallelism, **fields)
        return node_id

    def _sized(
        self, kind: type[nodes.Node], inputs: tuple[int, ...], name: str, parallelism: int | None, **fields: Any
    ) -> int:
        """Add an operator whose ``parallelism`` the user set, checked under its name."""
        return self._add(kind, inputs, name, _operator(parallelism, name), **fields)

    def _replace(self, node_id: int, **changes: Any) -> None:
        """Nodes are immutable: a changed setting swaps in a new one."""
        self._nodes[node_id] = dataclasses.replace(self._nodes[node_id], **changes)

    def rename(self, node_id: int, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise PlanError(f"an operator name must be a non-empty string, got {name!r}")
        self._replace(node_id, name=name)

    def set_parallelism(self, node_id: int, parallelism: int) -> None:
        self._replace(node_id, parallelism=_operator(parallelism, self._nodes[node_id].name))

    def set_uid(self, node_id: int, uid: str) -> None:
        self._replace(node_id, explicit_uid=check_uid(uid))

    def source(
        self,
        source: object,
        parallelism: int | None = None,
        name: str | None = None,
        uid: str | None = None,
        watermark: object = None,
    ) -> int:
        """A source; a changelog with a primary key is normalized by it (Flink's ChangelogNormalize);
        ``watermark``: a :class:`~keyflow.plan.event_time.WatermarkStrategy` on one of its columns."""
        if not isinstance(source, Source):
            raise PlanError(f"{source!r} is not a source; use datagen(...), files(...) or log(...)")
        label = name or f"source: {source.describe().get('connector', 'source')}"
        checked = check_parallelism(parallelism, f"source {label!r}")
        if watermark is not None:
            check_event_time(label, source, watermark)
        node_id = self._add(
            nodes.SourceNode, (), label, checked, explicit_uid=None if uid is None else check_uid(uid), source=source,
            watermark=watermark,
        )  # fmt: skip
        if isinstance(source, ChangelogSource) and source.changelog_mode != "insert" and source.primary_key:
            node_id = self._normalized(node_id, source, label, checked)
        return node_id

    def _normalized(self, node_id: int, source: ChangelogSource, label: str, parallelism: int | None) -> int:
        """Rows routed by the primary key's key group, each key's previous row in keyed state."""
        keys = tuple(source.primary_key)
        if isinstance(source, MarksDeletes) and source.marks_deletes:
            return self._add(
                nodes.NormalizeNode, (node_id,), f"normalize {label}", None, keys=keys, mode=source.changelog_mode
            )
        if source.changelog_mode == "all":
            # As Flink's ChangelogNormalize: -U and -D delete the key; a +U after -U (the newest) upserts it.
            deleted = f"{OP} IN ('-U', '-D')"
        else:
            columns = source.column_names() if isinstance(source, KnowsColumns) else None
            if columns is None:
                raise PlanError(
                    f"source {label!r} is an upsert changelog but does not tell its columns before it runs "
                    "(column_names()), so a delete (its non-key columns all null) cannot be told from an upsert; "
                    "give the source a schema"
                )
            values = [name for name in columns if name not in keys]
            deleted = " AND ".join(f"`{name}` IS NULL" for name in values) or "false"
        node_id = self._add(
            nodes.WithColumnsNode, (node_id,), f"row kind {label}", parallelism, columns={DELETED: deleted}
        )
        return self._add(
            nodes.NormalizeNode, (node_id,), f"normalize {label}", None, keys=keys, mode=source.changelog_mode
        )

    def select(
        self, input_id: int, expressions: Sequence[str], name: str = "select", parallelism: int | None = None
    ) -> int:
        if not expressions or not all(isinstance(e, str) and e.strip() for e in expressions):
            raise PlanError(f"select needs one or more SQL expression strings, got {tuple(expressions)!r}")
        return self._sized(nodes.SelectNode, (input_id,), name, parallelism, expressions=tuple(expressions))

    def filter(self, input_id: int, condition: str, name: str = "filter", parallelism: int | None = None) -> int:
        if not isinstance(condition, str) or not condition.strip():
            raise PlanError(f"filter needs a SQL condition string such as 'price > 0', got {condition!r}")
        return self._sized(nodes.FilterNode, (input_id,), name, parallelism, condition=condition)

    def with_columns(self, input_id: int, columns: Mapping[str, str]) -> int:
        if not columns or not all(isinstance(e, str) and e.strip() for e in columns.values()):
            raise PlanError(f"with_columns needs column=SQL expression pairs, got {dict(columns)!r}")
        return self._add(nodes.WithColumnsNode, (input_id,), "with_columns", None, columns=dict(columns))

    def map_batches(
        self,
        input_id: int,
        function: Callable[[Any], Any],
        schema: pa.Schema | str | None,
        batch_format: str,
        name: str | None,
        parallelism: int | None,
    ) -> int:
        if not callable(function):
            raise PlanError(f"map_batches needs a function, got {function!r}")
        if batch_format not in ("arrow", "pandas"):
            raise PlanError(f"map_batches batch_format={batch_format!r} is invalid; choose arrow or pandas")
        label = name or str(getattr(function, "__name__", "map_batches"))
        return self._sized(
            nodes.MapBatchesNode,
            (input_id,),
            label,
            parallelism,
            function=function,
            schema=schema,
            batch_format=batch_format,
        )

    def union(self, input_ids: Sequence[int], name: str = "union") -> int:
        """The rows of every input; their columns must have the same names (and types, where known)."""
        if len(set(input_ids)) != len(input_ids):
            raise PlanError("union(...) of a stream with itself: every row would be there twice; union other streams")
        problems = union_problems(self._nodes, input_ids)
        if problems:
            raise PlanError(*problems)
        changelogs = [self._nodes[input_id].name for input_id in input_ids if self.is_changelog(input_id)]
        if changelogs:
            raise PlanError(
                f"union(...) of a changelog ({changelogs}: rows with updates and deletes in 'op') is not supported "
                "yet: a union rebalances its inputs, which would reorder each key's changes; union streams of inserts"
            )
        return self._add(nodes.UnionNode, tuple(input_ids), name, None)

    def key_by(self, keys: Sequence[str], on_null: object = None, reinterpreted: bool = False) -> Keying:
        """``on_null``: None, or a sink for rows with a null key."""
        if not keys or not all(isinstance(key, str) and key.strip() for key in keys):
            raise PlanError(f"key_by needs one or more column names, got {tuple(keys)!r}")
        if on_null is not None and not isinstance(on_null, Sink):
            raise PlanError(f"key_by on_null={on_null!r} is not a sink; pass e.g. parquet('out/dead_letters')")
        return Keying(tuple(keys), on_null, reinterpreted)

    def aggregate(
        self,
        input_id: int,
        keying: Keying,
        aggregations: Mapping[str, str],
        name: str = "aggregate",
        emit_changelog: bool = False,
    ) -> int:
        """Per-key aggregates. The output is a changelog over a changelog, and with
        ``emit_changelog`` also over inserts (SQL's streaming GROUP BY: as Flink, an update
        retracts the key's previous row); else each changed key's new row. No aggregations:
        the distinct keys (SQL's GROUP BY without aggregates)."""
        if not all(isinstance(e, str) and e.strip() for e in aggregations.values()):
            raise aggregations_needed(aggregations)
        clash = set(aggregations) & set(keying.keys)
        if clash:
            raise PlanError(f"aggregate output {sorted(clash)} has the name of a key column; rename the aggregate")
        changelog_input = self.is_changelog(input_id)
        return self._add(
            nodes.AggregateNode,
            (input_id,),
            name,
            None,
            aggregations=dict(aggregations),
            changelog=changelog_input or emit_changelog,
            changelog_input=changelog_input,
            **keying.fields(),
        )

    def rank(
        self,
        input_id: int,
        keying: Keying,
        order: Sequence[tuple[str, bool]],
        limit: int,
        rank_column: str | None = None,
        name: str = "top-n",
        first: int = 1,
    ) -> int:
        """The first ``limit`` rows of each key by ``order`` ((column, descending) pairs): Flink's
        Top-N, and its deduplication where the order is the event-time column alone. Over an
        unbounded input the output is a changelog: rows leaving the top are retracted."""
        fields = self._rank_fields(input_id, order, limit, first, rank_column, name)
        window_end = self._ranked_windows(input_id, keying.keys)
        if self.is_changelog(input_id) and window_end is None:  # every current row kept: a retracted one's
            fields["time_ordered"] = False  # place is refilled; never a deduplication (Flink ranks it too)
            return self._add(nodes.RetractableRankNode, (input_id,), name, None, **keying.fields(), **fields)
        return self._add(
            nodes.RankNode,
            (input_id,),
            name,
            None,
            **keying.fields(),
            **fields,
            changelog=self.reads_unbounded([input_id]) and window_end is None,
            window_end=window_end,
        )

    def window_rank(
        self,
        input_id: int,
        keying: Keying,
        windowing: nodes.Windowing,
        order: Sequence[tuple[str, bool]],
        limit: int,
        rank_column: str | None = None,
        name: str = "window top-n",
        first: int = 1,
    ) -> int:
        """Flink's window Top-N (window deduplication, ordered by the event time alone) after
        a window table function: the first ``limit`` rows of each key and window by
        ``order``, emitted once the window ends, with ``window_start`` and ``window_end``."""
        fields = self._rank_fields(input_id, order, limit, first, rank_column, name)
        clash = {nodes.WINDOW_START, nodes.WINDOW_END} & set(output_columns(self._nodes, input_id, {}) or ())
        if clash:
            raise PlanError(f"{name}: its input has column(s) {sorted(clash)}, which the windows add; rename them")
        return self._add(nodes.WindowTableRankNode, (input_id,), name, None, **keying.fields(), **fields,
                         windowing=windowing)  # fmt: skip

    def _rank_fields(
        self,
        input_id: int,
        order: Sequence[tuple[str, bool]],
        limit: int,
        first: int,
        rank_column: str | None,
        name: str,
    ) -> dict[str, Any]:
        """A Top-N's checked order, range and row-number column, and whether it is ordered by
        the event time alone (a deduplication when it keeps one unnumbered row)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise PlanError(f"{name}: the number of rows to keep per key is {limit!r}; give a whole number >= 1")
        if not order or not all(isinstance(c, str) and c.strip() and isinstance(d, bool) for c, d in order):
            raise PlanError(f"{name}: order {list(order)!r} must be (column, descending) pairs, e.g. [('price', True)]")
        if isinstance(first, bool) or not isinstance(first, int) or not 1 <= first <= limit:
            raise PlanError(f"{name}: the first row number to emit is {first!r}; give a whole number from 1 to {limit}")
        if rank_column is not None and not (isinstance(rank_column, str) and rank_column.strip()):
            raise PlanError(f"{name}: row_number={rank_column!r} must be a column name, e.g. 'rn', or None")
        event_time = event_time_at(self.operators, input_id)
        time_ordered = len(order) == 1 and event_time is not None and order[0][0].lower() == event_time.lower()
        return {"order": tuple(order), "limit": limit, "first": first, "rank_column": rank_column,
                "time_ordered": time_ordered}  # fmt: skip

    def over(
        self,
        input_id: int,
        keying: Keying,
        order: str | None,
        aggregations: Mapping[str, str],
        frame: nodes.OverFrame,
        name: str = "over",
    ) -> int:
        """Flink's OVER aggregation: each row with ``aggregations`` over its key's rows in
        ``frame``, ordered by the event-time column ``order`` (None: the input's; as Flink's
        streaming OVER: a time attribute, ascending); rows are emitted once the watermark
        passes them."""
        if not aggregations or not all(isinstance(e, str) and e.strip() for e in aggregations.values()):
            raise aggregations_needed(aggregations)
        if frame.preceding is not None and (isinstance(frame.preceding, bool) or frame.preceding < 0):
            raise PlanError(f"{name}: the frame reaches back {frame.preceding!r}; give a number >= 0 or None "
                            "(UNBOUNDED PRECEDING)")  # fmt: skip
        event_time = event_time_at(self.operators, input_id)
        if event_time is None:
            raise PlanError(f"{name}: an OVER aggregation is ordered by the event time, and its input has none; give "
                            "the source a watermark (source(..., watermark=WatermarkStrategy.for_bounded_out_of_"
                            "orderness('ts', '5 s')), in SQL WATERMARK FOR ts AS ts - INTERVAL '5' "
                            "SECOND)")  # fmt: skip
        if order is not None and order.lower() != event_time.lower():
            raise PlanError(f"{name}: OVER … ORDER BY {order}: an OVER aggregation is ordered by the event time "
                            f"(the source's WATERMARK column), ascending, as in Flink; its event-time column is "
                            f"{event_time!r}")  # fmt: skip
        if self.is_changelog(input_id):
            raise PlanError(f"{name}: its input {self.node(input_id).name!r} is a changelog (it updates or retracts "
                            "rows); an OVER aggregation takes insert-only rows, as in Flink")  # fmt: skip
        clash = set(aggregations) & set(output_columns(self._nodes, input_id, {}) or ())
        if clash:
            raise PlanError(f"{name}: aggregate output {sorted(clash)} has the name of an input column; rename it")
        over_calls(name, parse_aggregations(aggregations))  # an unsupported aggregate fails here
        return self._add(nodes.OverNode, (input_id,), name, None, **keying.fields(), order=event_time,
                         frame=frame, aggregations=dict(aggregations))  # fmt: skip

    def _ranked_windows(self, input_id: int, keys: Sequence[str]) -> str | None:
        """The window end column where ``keys`` hold ``window_start`` and ``window_end`` of a
        window aggregation (without allowed lateness: each window's rows come once) that
        reaches ``input_id`` through stateless operators; else None."""
        names = {key.lower(): key for key in keys}
        if not {nodes.WINDOW_START, nodes.WINDOW_END} <= names.keys():
            return None
        origin = self.node(input_id)
        while isinstance(origin, (nodes.SelectNode, nodes.FilterNode, nodes.WithColumnsNode)):
            origin = self.node(origin.inputs[0])
        windowed = isinstance(origin, nodes.WindowAggregateNode) and not origin.windowing.allowed_lateness
        if isinstance(origin, nodes.WindowAggregateNode) and origin.windowing.processing_time:
            raise PlanError(f"a Top-N of the windows of {origin.name!r}, which are by processing time, is not "
                            "supported (nor is it in Flink); rank the windows of an event-time window "
                            "aggregation")  # fmt: skip
        return names[nodes.WINDOW_END] if windowed else None

    def windowing(
        self, input_id: int, keying: Keying, assigner: object, allowed_lateness: int, late_rows: object
    ) -> nodes.Windowing:
        """Windows for the keyed stream ``input_id``; its event time is its source's watermark column."""
        if not isinstance(assigner, WindowAssigner):
            raise PlanError(
                f"window({assigner!r}) is not a window; use tumbling('1 min'), sliding(...) or session(...)"
            )
        if late_rows is not None and not isinstance(late_rows, Sink):
            raise PlanError(f"window late_rows={late_rows!r} is not a sink; pass e.g. parquet('out/late')")
        if keying.reinterpreted:
            raise PlanError("window(...) after reinterpret_as_keyed is not supported yet; use key_by(...)")
        if self.is_changelog(input_id):
            raise PlanError("window(...) over a changelog (rows with updates and deletes) is not supported yet")
        if nodes.event_time_column(self._nodes, input_id) is None:
            raise PlanError(self._no_event_time(input_id))
        column = self._event_time_kept(
            input_id, lambda column: f"window(...): the event-time column {column}", "window"
        )
        return nodes.Windowing(assigner, column, allowed_lateness, late_rows)

    def processing_windowing(
        self, input_id: int, keying: Keying, assigner: WindowAssigner, column: str
    ) -> nodes.Windowing:
        """Windows by the processing time (Flink's over a PROCTIME() ``column``): each row is in
        the windows of the time its micro-batch runs at; a window fires at the first
        micro-batch that runs after its end (every one at a bounded input's end)."""
        if assigner.merging:
            raise PlanError(f"{assigner.kind} windows by processing time are not supported; use tumbling, sliding "
                            "or cumulating windows (SQL: TUMBLE, HOP, CUMULATE)")  # fmt: skip
        if keying.reinterpreted or self.is_changelog(input_id):
            raise PlanError("window(...) by processing time after reinterpret_as_keyed or over a changelog is not "
                            "supported yet; use key_by(...) on insert-only rows")  # fmt: skip
        return nodes.Windowing(assigner, column, processing_time=True)

    def _no_event_time(self, input_id: int) -> str:
        """Why the rows of ``input_id`` have no event time to window by."""
        origin = nodes.event_time_origin(self._nodes, input_id)
        if isinstance(origin, nodes.ConnectedNode):
            return (
                f"window(...) over the output of {origin.kind} {origin.name!r} is not supported: its rows carry "
                "no one source's event time; window each input before joining them"
            )
        if isinstance(origin, nodes.UnionNode):
            columns = {self._nodes[i].name: nodes.event_time_column(self._nodes, i) for i in origin.inputs}
            return (
                f"window(...) after union {origin.name!r}: its inputs' event-time columns are {columns} (None: no "
                "watermark); give every source a watermark strategy on the same column"
            )
        return (
            "window(...) needs event time: declare the source's with "
            "pipeline.source(src, watermark=WatermarkStrategy.for_bounded_out_of_orderness('ts', '5 s'))"
        )

    def window_aggregate(
        self, input_id: int, keying: Keying, windowing: nodes.Windowing, aggregations: Mapping[str, str]
    ) -> int:
        """Per-key aggregates per event-time window."""
        if not aggregations or not all(isinstance(e, str) and e.strip() for e in aggregations.values()):
            raise aggregations_needed(aggregations)
        reserved = set(aggregations) & {*keying.keys, nodes.WINDOW_START, nodes.WINDOW_END, nodes.IS_UPDATE}
        if reserved:
            raise PlanError(
                f"window aggregate output {sorted(reserved)} has the name of a key or of window_start, window_end, "
                "is_update; rename the aggregate"
            )
        return self._add(
            nodes.WindowAggregateNode, (input_id,), f"{windowing.assigner.kind} window", None, keys=keying.keys,
            on_null=keying.on_null, aggregations=dict(aggregations), windowing=windowing,
        )  # fmt: skip

    def window_process(
        self,
        input_id: int,
        keying: Keying,
        windowing: nodes.Windowing,
        function: Callable[..., Any],
        schema: pa.Schema | str,
        name: str | None,
    ) -> int:
        """A function over all rows of each window, when it fires."""
        if not callable(function):
            raise PlanError(f"window process needs a function, got {function!r}")
        if schema is None:
            raise PlanError("window process needs the output schema: a pyarrow.Schema or a DDL string")
        if windowing.assigner.merging:
            raise PlanError(
                "process(...) over session windows is not supported yet; use aggregate(...) on session windows, "
                "or key_by(...).process(fn, on_timer=...) to keep a session's rows yourself"
            )
        label = name or str(getattr(function, "__name__", "window process"))
        return self._add(
            nodes.WindowProcessNode, (input_id,), label, None, keys=keying.keys, on_null=keying.on_null,
            function=function, schema=schema, windowing=windowing,
        )  # fmt: skip

    def process(
        self,
        input_id: int,
        keying: Keying,
        function: Callable[..., Any],
        schema: pa.Schema | str,
        state: Mapping[str, StateDescriptor] | None,
        order_by: str | Sequence[str],
        name: str | None,
        parallelism: int | None,
        side: int | None,
        on_timer: Callable[..., Any] | None = None,
    ) -> int:
        """A keyed process function; ``side`` is the id of a stream broadcast to it whole;
        ``on_timer`` receives the keys whose timers fire."""
        if side == input_id:
            raise PlanError("process side= is the keyed stream itself; broadcast another (small) stream")
        if not callable(function):
            raise PlanError(f"process needs a function, got {function!r}")
        if on_timer is not None and not callable(on_timer):
            raise PlanError(f"process on_timer={on_timer!r} is not a function; pass on_timer(timers, state) -> rows")
        if on_timer is not None and side is not None:
            raise PlanError("process with on_timer= takes no side= input (not supported yet); join the side first")
        if schema is None:
            raise PlanError("process needs the output schema: a pyarrow.Schema or a DDL string 'user string, n long'")
        _check_state(state, keying.keys)
        label = name or str(getattr(function, "__name__", "process"))
        return self._sized(
            nodes.ProcessNode,
            (input_id,) if side is None else (input_id, side),
            label,
            parallelism,
            side_input=side is not None,
            on_timer=on_timer,
            function=function,
            schema=schema,
            state=dict(state or {}),
            order_by=(order_by,) if isinstance(order_by, str) else tuple(order_by),
            **keying.fields(),
        )

    def co_process(
        self,
        inputs: tuple[int, int],
        keyings: tuple[Keying, Keying],
        functions: tuple[Callable[..., Any], Callable[..., Any]],
        schema: pa.Schema | str,
        state: Mapping[str, StateDescriptor] | None,
        on_timer: Callable[..., Any] | None,
        name: str | None,
        parallelism: int | None,
    ) -> int:
        """Two keyed streams in one operator: a function per input, one keyed state."""
        first, second = keyings
        if len(first.keys) != len(second.keys):
            raise PlanError(
                f"connect(...): the first stream is keyed by {list(first.keys)}, the second by {list(second.keys)}; "
                "key both by the same number of columns, of the same types"
            )
        if first.reinterpreted or second.reinterpreted:
            raise PlanError("connect(...) of a stream from reinterpret_as_keyed is not supported yet; use key_by(...)")
        if first.on_null is not None or second.on_null is not None:
            raise PlanError(
                "connect(...) of key_by(..., on_null=...) is not supported yet; filter the null keys out first, or "
                "set pipeline.null-keys"
            )
        for which, function in zip(("first", "second"), functions, strict=True):
            if not callable(function):
                raise PlanError(
                    f"connect(...).process needs a function for the {which} stream's rows, got {function!r}"
                )
        if on_timer is not None and not callable(on_timer):
            raise PlanError(f"process on_timer={on_timer!r} is not a function; pass on_timer(timers, state) -> rows")
        if schema is None:
            raise PlanError("process needs the output schema: a pyarrow.Schema or a DDL string 'user string, n long'")
        _check_state(state, first.keys)
        label = name or "_".join(str(getattr(f, "__name__", "process")) for f in functions)
        return self._sized(
            nodes.CoProcessNode, inputs, label, parallelism, keys=first.keys, other_keys=second.keys,
            function=functions[0], other_function=functions[1], schema=schema, state=dict(state or {}),
            on_timer=on_timer,
        )  # fmt: skip

    def join(
        self,
        inputs: tuple[int, int],
        on: Sequence[tuple[str, str]],
        how: str,
        name: str | None,
        parallelism: int | None,
    ) -> int:
        """A regular join of ``inputs`` on ``on`` (pairs of a left and a right column); of
        changelogs too, whose updates and deletes then retract the rows they joined."""
        updating = any(self.is_changelog(input_id) for input_id in inputs)
        kind = nodes.ChangelogJoinNode if updating else nodes.JoinNode
        return self._join(kind, inputs, on, how, name or f"{how} join", parallelism)

    def interval_join(
        self,
        inputs: tuple[int, int],
        on: Sequence[tuple[str, str]],
        between: tuple[int, int],
        how: str,
        name: str | None,
        parallelism: int | None,
    ) -> int:
        """A join of ``inputs`` on ``on`` where ``between[0] <= right time - left time <=
        between[1]`` (microseconds; each input's time is its source's watermark column)."""
        label = name or f"{how} interval join"
        lower, upper = between
        if lower > upper:
            raise PlanError(
                f"{label}: between=({lower / 1e6:g} s, {upper / 1e6:g} s) is empty: the lower bound is after the "
                f"upper; swap them: between=('{upper / 1e6:g} s', '{lower / 1e6:g} s')"
            )
        times = tuple(self._join_time(label, input_id, position) for position, input_id in enumerate(inputs))
        return self._join(
            nodes.IntervalJoinNode, inputs, on, how, label, parallelism, lower=lower, upper=upper, time_columns=times
        )

    def window_join(
        self,
        inputs: tuple[int, int],
        on: Sequence[tuple[str, str]],
        assigner: object,
        how: str,
        name: str | None,
        parallelism: int | None,
    ) -> int:
        """A join of ``inputs`` on ``on`` within each event-time window of ``assigner``."""
        label = name or f"{how} window join"
        if not isinstance(assigner, WindowAssigner) or assigner.merging:
            raise PlanError(
                f"{label}: window={assigner!r} is not a window a join can use; give tumbling('1 min') or "
                "sliding('10 min', '1 min') (session windows are not supported by window joins)"
            )
        times = tuple(self._join_time(label, input_id, position) for position, input_id in enumerate(inputs))
        for input_id in inputs:
            columns = output_columns(self._nodes, input_id, {}) or {}
            clashes = sorted({nodes.WINDOW_START, nodes.WINDOW_END} & set(columns))
            if clashes:
                raise PlanError(window_clash_message(label, clashes))
        return self._join(
            nodes.WindowJoinNode, inputs, on, how, label, parallelism, assigner=assigner, time_columns=times
        )

    def _join_time(self, label: str, input_id: int, position: int) -> str:
        """The event-time column of a time-bounded join's input (its source's watermark column);
        an input of inserts, as Flink's interval and window joins take."""
        if self.is_changelog(input_id):
            raise PlanError(
                f"{label}: {self._nodes[input_id].name!r} is a changelog (rows with updates and deletes); a "
                "time-bounded join takes streams of inserts (as in Flink): join them before they are aggregated or "
                "ranked, or use a regular join"
            )
        origin = nodes.event_time_origin(self._nodes, input_id)
        which = f"the {('left', 'right')[position]} stream ({self._nodes[input_id].name!r}"
        which += f", from {origin.kind} {origin.name!r})" if origin.id != input_id else ")"
        if nodes.event_time_column(self._nodes, input_id) is None:
            raise PlanError(
                f"{label}: {which} has no event time, which the join matches rows by; declare its source's "
                "with pipeline.source(src, watermark=WatermarkStrategy.for_bounded_out_of_orderness('ts', '5 s'))"
            )
        return self._event_time_kept(
            input_id, lambda column: f"{label}: the event-time column {column} of {which}", "join"
        )

    def _event_time_kept(self, input_id: int, what: Callable[[str], str], consumer: str) -> str:
        """The event-time column's name in ``input_id``'s rows (of a stream with event time),
        or a PlanError saying the operators before ``consumer`` dropped it (``what``: the
        column, as the message names it)."""
        column = event_time_at(self._nodes, input_id)
        available = output_columns(self._nodes, input_id, {})
        if column is None or (available is not None and column not in available):
            source_column = nodes.event_time_column(self._nodes, input_id)
            raise PlanError(
                f"{what(repr(source_column))} (the source's watermark column) is not among the columns "
                f"reaching the {consumer}{'' if available is None else ' ' + str(list(available))}; keep it in the "
                f"operators before the {consumer}"
            )
        return column

    def lookup_join(self, inputs: tuple[int, int], on: Sequence[tuple[str, str]], how: str, name: str | None) -> int:
        """Rows of ``inputs[0]`` enriched with the matching rows of the bounded ``inputs[1]``."""
        label = name or f"{how} lookup join"
        if how not in nodes.LOOKUP_JOIN_TYPES:
            raise PlanError(
                f"{label}: how={how!r} is not a lookup join type; choose inner or left (the table's rows are not "
                "a stream: no row of it is emitted unmatched)"
            )
        table = self._nodes[inputs[1]]
        behind = nodes.upstream(self._nodes, [inputs[1]])
        unbounded = [node.name for node in behind if isinstance(node, nodes.SourceNode) and is_unbounded(node.source)]
        if unbounded:
            raise PlanError(
                f"{label}: the table ({table.name!r}) reads unbounded source(s) {unbounded}; a lookup join's table "
                "is read whole at every micro-batch, so it must be bounded. Join two streams with join(...)"
            )
        keyed = [
            f"{node.kind} {node.name!r}" for node in behind if isinstance(node, (nodes.KeyedNode, nodes.LookupJoinNode))
        ]
        if keyed:
            raise PlanError(
                f"{label}: the table ({table.name!r}) goes through {', '.join(keyed)}; a lookup join's table is read "
                "again at every micro-batch, so only sources and stateless operators (select, filter, with_columns, "
                "union, map_batches) may make it. Aggregate the table in a batch run first and look up its output"
            )
        if self.is_changelog(inputs[0]):
            raise PlanError(
                f"{label}: {self._nodes[inputs[0]].name!r} is a changelog (rows with updates and deletes); a lookup "
                "join enriches a stream of inserts: look the rows up before they are aggregated or ranked, or join "
                "the changelog with join(...)"
            )
        keys, other_keys = self._join_keys(inputs, on, label)
        return self._add(nodes.LookupJoinNode, inputs, label, None, keys=keys, other_keys=other_keys, how=how)

    def _join(
        self,
        kind: type[nodes.JoinNode],
        inputs: tuple[int, int],
        on: Sequence[tuple[str, str]],
        how: str,
        label: str,
        parallelism: int | None,
        **fields: Any,
    ) -> int:
        if how not in nodes.JOIN_TYPES:
            raise PlanError(f"join how={how!r} is not a join type; choose one of {', '.join(nodes.JOIN_TYPES)}")
        if not on:
            raise PlanError("join needs on=: a column both streams have ('user'), or pairs [('user', 'uid')]")
        keys, other_keys = self._join_keys(inputs, on, label)
        return self._sized(kind, inputs, label, parallelism, keys=keys, other_keys=other_keys, how=how, **fields)

    def _join_keys(
        self, inputs: tuple[int, int], on: Sequence[tuple[str, str]], label: str
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The left and right key columns of a join of ``inputs``: no column besides the keys in
        both (where their columns are known)."""
        keys, other_keys = tuple(left for left, _ in on), tuple(right for _, right in on)
        left, right = (output_columns(self._nodes, input_id, {}) for input_id in inputs)
        clashes = join_clashes(other_keys, list(left), list(right)) if left is not None and right is not None else []
        if clashes:
            raise PlanError(join_clash_message(label, clashes))
        return keys, other_keys

    def sink(
        self,
        input_id: int,
        sink: object,
        parallelism: int | None = None,
        name: str | None = None,
        uid: str | None = None,
        primary_key: str | Sequence[str] = (),
        run: bool = True,
    ) -> int:
        """A sink of ``input_id``'s rows; ``run`` False: only to explain (SQL's ``EXPLAIN INSERT``)."""
        if not isinstance(sink, Sink):
            raise PlanError(f"{sink!r} is not a sink; use parquet(...), json(...), csv(...) or console()")
        label = name or f"sink: {nodes.sink_target(sink)}"
        keys = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
        if isinstance(sink, AppendOnlySink):
            keys = self._sink_keys(input_id, sink, label, keys)
        node_id = self._sized(
            nodes.SinkNode,
            (input_id,),
            label,
            parallelism,
            explicit_uid=None if uid is None else check_uid(uid),
            sink=sink,
            primary_key=keys,
            changelog=self.is_changelog(input_id),
        )
        if run:
            self._sinks.append(node_id)
        return node_id

    def _sink_keys(self, input_id: int, sink: AppendOnlySink, label: str, keys: tuple[str, ...]) -> tuple[str, ...]:
        """An upsert sink writes by its own key (given again, it must be the same); an
        append-only sink refuses a changelog, as Flink's planner does."""
        if sink.append_only and self.is_changelog(input_id):
            raise PlanError(
                f"{label} takes inserts only, but {self._nodes[input_id].name!r} is a changelog (rows with updates and "
                "deletes); write it with an upsert sink keyed by its key (upsert_kafka_sink(..., primary_key=...); "
                "SQL: 'connector' = 'upsert-kafka' with a PRIMARY KEY)"
            )
        if sink.primary_key and keys and set(keys) != set(sink.primary_key):
            raise PlanError(
                f"{label} writes by key {list(sink.primary_key)}, but primary_key={list(keys)} was given; give the "
                "same columns or leave primary_key out"
            )
        return keys or tuple(sink.primary_key)

    def is_changelog(self, node_id: int) -> bool:
        """Whether the rows of ``node_id`` carry row kinds in ``op`` (see ``keyflow.changelog``)."""
        return nodes.emits_changelog(self._nodes, node_id)

    def reads_unbounded(self, roots: Iterable[int] | None = None) -> bool:
        """Whether ``roots`` (default: the sinks) read an unbounded source, so they run as a stream."""
        return nodes.reads_unbounded(nodes.upstream(self._nodes, self._sinks if roots is None else roots))

    def register_function(self, function: ScalarFunction) -> None:
        """Make ``function`` callable by name in this pipeline's expressions."""
        if function.name in self._functions:
            raise PlanError(f"a function named {function.name!r} is registered already; choose another name")
        self._functions[function.name] = function

    def compile(self, roots: Sequence[int] | None = None) -> CompiledPlan:
        """The plan of ``roots`` (default: every sink) and what they depend on."""
        if roots is None and not self._sinks:
            raise PlanError("the pipeline has no sink; end a stream with .sink(parquet('out/...')) or use .to_arrow()")
        return compile_plan(self._nodes, tuple(self._sinks if roots is None else roots), self.config, self._functions)

    def plan(self) -> JobGraph:
        """The job graph of the sinks; without sinks, of every stream nothing else reads."""
        if self._sinks:
            return self.compile().graph
        consumed = {input_id for node in self._nodes.values() for input_id in node.inputs}
        ends = tuple(node_id for node_id in self._nodes if node_id not in consumed)
        if not ends:
            raise PlanError("the pipeline is empty; start with p.source(datagen(...)) or p.source(files(...))")
        return self.compile(ends).graph


def _check_state(state: Mapping[str, StateDescriptor] | None, keys: tuple[str, ...]) -> None:
    """Declared state: names that are not keys or keyflow's own, descriptors with valid types and TTLs."""
    for state_name, descriptor in (state or {}).items():
        if state_name in keys or state_name.startswith("__"):
            raise PlanError(
                f"state {state_name!r} has the name of a key column or starts with '__' (kept for keyflow's "
                "own columns); rename the state"
            )
        if not hasattr(descriptor, "arrow_type"):
            raise PlanError(f"state {state_name!r} is {descriptor!r}; declare ValueState, ListState or MapState")
        if descriptor.ttl is not None and not isinstance(descriptor.ttl, StateTtlConfig):
            raise PlanError(
                f"state {state_name!r} ttl={descriptor.ttl!r} is not a StateTtlConfig; pass e.g. "
                "ttl=StateTtlConfig('1 h')"
            )
        descriptor.arrow_type  # validates the type now, at plan time  # noqa: B018


def aggregations_needed(aggregations: Mapping[str, str]) -> PlanError:
    return PlanError(
        f"aggregate needs name='aggregate expression' pairs such as count='count(*)', got {dict(aggregations)!r}"
    )


def _operator(parallelism: int | None, name: str) -> int | None:
    return check_parallelism(parallelism, f"operator {name!r}")
