"""The logical operators a pipeline is built from: the plan's input, one small class each.

Nodes are immutable and refer to their inputs by id, so renaming or re-parallelising an
operator replaces one node without touching its consumers. Nodes only describe: the
compiler (``keyflow.plan.compile``) decides parallelism, exchanges and operator ids, and
the runtime turns the compiled plan into Spark DataFrame operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from keyflow.connectors.base import Sink, Source, changelog_mode, is_unbounded
from keyflow.plan.descriptors import StateDescriptor, with_ttl_columns
from keyflow.plan.event_time import WatermarkStrategy, WindowAssigner


@dataclass(frozen=True, eq=False)
class Node:
    """An operator: ``id`` is its place in creation order, ``inputs`` the ids it reads;
    ``parallelism`` and ``explicit_uid`` are the user's settings, if any (the compiler
    derives the uid of an operator without one, see ``keyflow.plan.uids``)."""

    id: int
    inputs: tuple[int, ...]
    name: str
    parallelism: int | None = None
    explicit_uid: str | None = None

    kind: ClassVar[str] = "node"
    keyed: ClassVar[bool] = False  # needs its input partitioned by key group

    def describe(self) -> dict[str, Any]:
        """What the plan shows (JSON-serialisable)."""
        return {}

    @property
    def partition_keys(self) -> tuple[str, ...]:
        """The columns a hash edge into this operator routes by (none: not routed by key)."""
        return ()

    def input_keys(self, position: int) -> tuple[str, ...]:
        """The columns the hash edge from input ``position`` routes by."""
        return self.partition_keys


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    source: Source = field(kw_only=True)
    watermark: WatermarkStrategy | None = None  # where the source's event time is, and its watermark
    kind: ClassVar[str] = "source"

    def describe(self) -> dict[str, Any]:
        described = dict(self.source.describe())
        if self.watermark is not None:
            described["watermark"] = self.watermark.describe()
        return described


@dataclass(frozen=True, eq=False)
class SelectNode(Node):
    expressions: tuple[str, ...] = ()
    kind: ClassVar[str] = "select"

    def describe(self) -> dict[str, Any]:
        return {"expressions": list(self.expressions)}


@dataclass(frozen=True, eq=False)
class FilterNode(Node):
    condition: str = ""
    kind: ClassVar[str] = "filter"

    def describe(self) -> dict[str, Any]:
        return {"condition": self.condition}


@dataclass(frozen=True, eq=False)
class WithColumnsNode(Node):
    columns: Mapping[str, str] = field(default_factory=dict)
    kind: ClassVar[str] = "with_columns"

    def describe(self) -> dict[str, Any]:
        return {"columns": dict(self.columns)}


@dataclass(frozen=True, eq=False)
class MapBatchesNode(Node):
    function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    batch_format: str = "arrow"
    kind: ClassVar[str] = "map_batches"

    def describe(self) -> dict[str, Any]:
        return {"function": function_name(self.function), "format": self.batch_format}


@dataclass(frozen=True, eq=False)
class UnionNode(Node):
    """The rows of every input, matched by column name (Flink's ``union``): no state, no order."""

    kind: ClassVar[str] = "union"

    def describe(self) -> dict[str, Any]:
        return {"inputs": len(self.inputs)}


@dataclass(frozen=True, eq=False)
class LookupJoinNode(Node):
    """Each row of a stream (``inputs[0]``) enriched with the matching rows of a bounded table
    (``inputs[1]``), read whole at every micro-batch (Flink's lookup join, against a table
    read from files): a Spark join, broadcast when the table is small; no state."""

    keys: tuple[str, ...] = ()
    other_keys: tuple[str, ...] = ()
    how: str = "inner"
    kind: ClassVar[str] = "lookup_join"
    changelog: ClassVar[bool] = False

    def input_keys(self, position: int) -> tuple[str, ...]:
        return self.other_keys if position == 1 else self.keys

    def describe(self) -> dict[str, Any]:
        return {"keys": [list(self.keys), list(self.other_keys)], "how": self.how}


LOOKUP_JOIN_TYPES = ("inner", "left")


def stream_sources(nodes: Mapping[int, Node], roots: Iterable[int]) -> list[Node]:
    """The sources whose rows flow to ``roots`` as a stream: all but those read only as a
    lookup join's table (a streaming run reads those again at every micro-batch)."""
    found: list[Node] = []
    seen: set[int] = set()

    def visit(node_id: int) -> None:
        if node_id in seen:
            return
        seen.add(node_id)
        node = nodes[node_id]
        if isinstance(node, SourceNode):
            found.append(node)
        for input_id in node.inputs[:1] if isinstance(node, LookupJoinNode) else node.inputs:
            visit(input_id)

    for root in roots:
        visit(root)
    return found


@dataclass(frozen=True, eq=False)
class KeyedNode(Node):
    """An operator that needs its input partitioned by key group."""

    keys: tuple[str, ...] = ()
    on_null: Sink | None = None  # None: pipeline.null-keys; or a sink for a dead letter queue
    reinterpreted: bool = False  # input already keyed by ``keys`` in this partition: no exchange
    keyed: ClassVar[bool] = True

    @property
    def partition_keys(self) -> tuple[str, ...]:
        return self.keys


@dataclass(frozen=True, eq=False)
class AggregateNode(KeyedNode):
    """Per-key aggregates. With ``changelog`` the input may carry row kinds (``op``): updates
    and deletes retract what the old row contributed, and the output is a changelog."""

    aggregations: Mapping[str, str] = field(default_factory=dict)
    changelog: bool = False
    changelog_input: bool = False  # rows carry row kinds to retract (else: all inserts)
    kind: ClassVar[str] = "aggregate"

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"keys": list(self.keys), "aggregations": dict(self.aggregations)}
        if self.changelog:
            described["changelog"] = True
        return described


WINDOW_START, WINDOW_END, IS_UPDATE = "window_start", "window_end", "is_update"


@dataclass(frozen=True)
class Windowing:
    """Event-time windows (``assigner``) over the source's watermark column ``time_column``: a
    window is emitted once the watermark passes its end; rows for it within ``allowed_lateness``
    after that update it (the row says ``is_update``), later ones go to ``late_rows`` (or are
    dropped, counted)."""

    assigner: WindowAssigner
    time_column: str
    allowed_lateness: int = 0
    late_rows: Sink | None = None
    processing_time: bool = False  # windows by the processing time (``time_column``: a PROCTIME() column)

    def describe(self) -> dict[str, Any]:
        time = "processing_time" if self.processing_time else "event_time"
        described: dict[str, Any] = {"window": self.assigner.describe(), time: self.time_column}
        if self.allowed_lateness:
            described["allowed_lateness_us"] = self.allowed_lateness
        return described


@dataclass(frozen=True, eq=False)
class WindowAggregateNode(AggregateNode):
    """Per-key aggregates per event-time window, merged incrementally."""

    windowing: Windowing = field(kw_only=True)
    kind: ClassVar[str] = "window_aggregate"

    def output_names(self) -> tuple[str, ...]:
        updates = (IS_UPDATE,) if self.windowing.allowed_lateness else ()
        return (*self.keys, WINDOW_START, WINDOW_END, *self.aggregations, *updates)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.windowing.describe()}


@dataclass(frozen=True, eq=False)
class WindowProcessNode(KeyedNode):
    """A function over all rows of each event-time window, called when the window fires."""

    function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    windowing: Windowing = field(kw_only=True)
    kind: ClassVar[str] = "window_process"

    def describe(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "function": function_name(self.function), **self.windowing.describe()}


def windowing_of(node: Node) -> Windowing | None:
    """The windows of a window operator, else None."""
    return node.windowing if isinstance(node, (WindowAggregateNode, WindowProcessNode)) else None


@dataclass(frozen=True, eq=False)
class NormalizeNode(KeyedNode):
    """Flink's ChangelogNormalize: a changelog source keyed by its primary key (``keys``)
    becomes a consistent changelog: the previous row of each key lives in keyed state, so an
    upsert retracts it (-U/+U) and a delete removes it (-D). ``mode`` is ``upsert`` (a row
    whose non-key columns are all null deletes its key) or ``all`` (rows carry ``op``)."""

    mode: str = "upsert"
    kind: ClassVar[str] = "changelog_normalize"

    def describe(self) -> dict[str, Any]:
        return {"primary_key": list(self.keys), "mode": self.mode}


@dataclass(frozen=True, eq=False)
class ProcessNode(KeyedNode):
    function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    state: Mapping[str, StateDescriptor] = field(default_factory=dict)
    order_by: tuple[str, ...] = ()
    side_input: bool = False  # inputs[1] is broadcast to every subtask, whole
    on_timer: Callable[..., Any] | None = None  # called with the keys whose timers fire
    kind: ClassVar[str] = "process"

    def declared_state(self) -> tuple[tuple[str, str], ...]:
        """Each declared state's name and Arrow type (and the write times of one with a TTL),
        as the plan records them."""
        return tuple((name, str(descriptor.arrow_type)) for name, descriptor in with_ttl_columns(self.state).items())

    def describe(self) -> dict[str, Any]:
        described = {
            "keys": list(self.keys),
            "function": function_name(self.function),
            "state": dict(self.declared_state()),
            "order_by": list(self.order_by),
        }
        if self.on_timer is not None:
            described["on_timer"] = function_name(self.on_timer)
        return {**described, "side_input": True} if self.side_input else described


@dataclass(frozen=True, eq=False)
class ConnectedNode(KeyedNode):
    """A keyed operator over two inputs routed by the same key groups: ``keys`` of the first
    input, ``other_keys`` of the second, equal in number and type."""

    other_keys: tuple[str, ...] = ()

    def input_keys(self, position: int) -> tuple[str, ...]:
        return self.other_keys if position == 1 else self.keys


@dataclass(frozen=True, eq=False)
class CoProcessNode(ConnectedNode):
    """Two keyed streams connected (Flink's ``connect`` + ``KeyedCoProcessFunction``): one
    keyed state shared by both inputs, ``function`` called with the first input's rows and
    ``other_function`` with the second's."""

    function: Callable[..., Any] | None = None
    other_function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    state: Mapping[str, StateDescriptor] = field(default_factory=dict)
    on_timer: Callable[..., Any] | None = None
    kind: ClassVar[str] = "co_process"

    def declared_state(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, str(descriptor.arrow_type)) for name, descriptor in with_ttl_columns(self.state).items())

    def describe(self) -> dict[str, Any]:
        described = {
            "keys": [list(self.keys), list(self.other_keys)],
            "functions": [function_name(self.function), function_name(self.other_function)],
            "state": dict(self.declared_state()),
        }
        if self.on_timer is not None:
            described["on_timer"] = function_name(self.on_timer)
        return described


@dataclass(frozen=True, eq=False)
class RankNode(KeyedNode):
    """Flink's Top-N (``ROW_NUMBER() OVER (PARTITION BY keys ORDER BY …)`` filtered by
    ``rownum <= limit``): the first ``limit`` rows of each key by ``order`` ((column,
    descending) pairs; ascending puts nulls first, descending last, as Flink). With
    ``rank_column`` each row carries its row number under that name. ``changelog``: the input
    is unbounded (or a changelog: :class:`RetractableRankNode`), so the output retracts rows
    that leave the top (``-D``, or ``-U`` where a rank's row changes). ``time_ordered``:
    ordered by the event-time column alone, which with a limit of 1 and no rank column is
    Flink's deduplication (a later row of an equal time
    replaces the kept one when descending: keep the last row). ``window_end``: the partition
    holds the windows of a window aggregation (Flink's window Top-N): each window's rows are
    ranked once it ends, insert-only, and its state is then dropped."""

    order: tuple[tuple[str, bool], ...] = ()
    limit: int = 1
    first: int = 1  # the first row number emitted (Flink's rank range start): rows first..limit
    rank_column: str | None = None
    changelog: bool = False
    time_ordered: bool = False
    window_end: str | None = None  # partitioned by a window aggregation's windows: their end column
    kind: ClassVar[str] = "rank"

    @property
    def deduplicates(self) -> bool:
        """Whether it is Flink's deduplication (keep the first or last row by event time)."""
        return self.time_ordered and self.limit == 1 and self.first == 1 and self.rank_column is None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "keys": list(self.keys),
            "order": [f"{column} {'DESC' if descending else 'ASC'}" for column, descending in self.order],
            "limit": self.limit,
        }
        if self.first > 1:
            described["first"] = self.first
        if self.rank_column:
            described["rank_column"] = self.rank_column
        if self.deduplicates:
            described["deduplicate"] = "keep first row" if not self.order[0][1] else "keep last row"
        if self.window_end:
            described["per_window"] = self.window_end
        if self.changelog:
            described["changelog"] = True
        return described


@dataclass(frozen=True)
class OverFrame:
    """An OVER window's frame, ending at the current row: ``rows`` (ROWS) or by time (RANGE);
    ``preceding``: how far back, in rows or microseconds (None: UNBOUNDED PRECEDING)."""

    rows: bool = False
    preceding: int | None = None

    def describe(self) -> str:
        unit = "" if self.rows else " µs"
        start = "UNBOUNDED" if self.preceding is None else f"{self.preceding}{unit}"
        return f"{'ROWS' if self.rows else 'RANGE'} BETWEEN {start} PRECEDING AND CURRENT ROW"


@dataclass(frozen=True, eq=False)
class OverNode(KeyedNode):
    """Flink's OVER aggregation: each row of the (insert-only) input with ``aggregations``
    over its key's rows in the ``frame`` ordered by the event-time column ``order``. Rows are
    emitted once the watermark passes them (rows of an equal time together), insert-only."""

    order: str = ""
    frame: OverFrame = field(default_factory=OverFrame)
    aggregations: Mapping[str, str] = field(default_factory=dict)
    kind: ClassVar[str] = "over"

    def describe(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "order": self.order, "frame": self.frame.describe(),
                "aggregations": dict(self.aggregations)}  # fmt: skip


@dataclass(frozen=True, eq=False)
class WindowTableRankNode(RankNode):
    """Flink's window Top-N and window deduplication after a window table function: each
    row's windows assigned (rows whose windows all ended are late: dropped, counted), each
    key's first rows per window kept until the watermark passes the window's end, then
    emitted once with ``window_start`` and ``window_end``, insert-only."""

    windowing: Windowing | None = None
    kind: ClassVar[str] = "window_rank"

    def describe(self) -> dict[str, Any]:
        assert self.windowing is not None  # the builder gives one
        return {**super().describe(), "windows": self.windowing.assigner.describe()}


@dataclass(frozen=True, eq=False)
class RetractableRankNode(RankNode):
    """A Top-N of a changelog (Flink's RetractableTopNFunction): each key keeps every current
    row, so a retracted row's place is taken by the next; the output is a changelog."""

    changelog: bool = True
    kind: ClassVar[str] = "retractable_rank"


JOIN_TYPES = ("inner", "left", "right", "full")


@dataclass(frozen=True, eq=False)
class JoinNode(ConnectedNode):
    """A regular join on key equality (Flink's streaming join): each input's rows kept in keyed
    state, every new row joined with the other input's rows of its key. Outer joins emit a
    changelog: a row padded with nulls is retracted (-D) when its first match arrives."""

    how: str = "inner"
    kind: ClassVar[str] = "join"

    @property
    def changelog(self) -> bool:
        """Whether the output carries row kinds (``op``): an outer join retracts padded rows."""
        return self.how != "inner"

    def describe(self) -> dict[str, Any]:
        return {"keys": [list(self.keys), list(self.other_keys)], "how": self.how}


@dataclass(frozen=True, eq=False)
class ChangelogJoinNode(JoinNode):
    """A regular join of which an input is a changelog (Flink's streaming join of updating
    tables): an input's update or delete retracts its row from the state and the joined rows
    it made (``-D``), so the output is a changelog whatever ``how`` is."""

    kind: ClassVar[str] = "changelog_join"

    @property
    def changelog(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class IntervalJoinNode(JoinNode):
    """A join of rows whose keys are equal and whose event times are close (Flink's interval
    join): ``lower <= right time - left time <= upper`` (microseconds, over each input's
    watermark column ``time_columns``). A row leaves the state once the watermark passes the
    last time a row of the other input could match it, so the state stays bounded; an outer
    join emits a preserved row that never matched, padded, when it leaves (as Flink SQL), so
    the output is append-only."""

    lower: int = 0
    upper: int = 0
    time_columns: tuple[str, str] = ("", "")
    kind: ClassVar[str] = "interval_join"

    @property
    def changelog(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        between = [self.lower, self.upper]
        return {**super().describe(), "time_columns": list(self.time_columns), "between_us": between}


@dataclass(frozen=True, eq=False)
class WindowJoinNode(JoinNode):
    """A join of rows whose keys are equal and that fall in the same event-time window
    (Flink's window join): ``assigner`` (tumbling or sliding) over each input's watermark
    column ``time_columns``. The state is kept per key and window, and a window's rows leave
    it once the watermark passes the window's end; an outer join emits a preserved row that
    never matched, padded, then (as Flink SQL), so the output is append-only. The output has
    ``window_start`` and ``window_end`` after the keys."""

    assigner: WindowAssigner | None = None
    time_columns: tuple[str, str] = ("", "")
    kind: ClassVar[str] = "window_join"

    @property
    def changelog(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        window = self.assigner.describe() if self.assigner is not None else None
        return {**super().describe(), "time_columns": list(self.time_columns), "window": window}


@dataclass(frozen=True, eq=False)
class SinkNode(Node):
    """A sink; ``primary_key`` routes its input by key group under
    ``table.exec.sink.keyed-shuffle``; ``changelog`` says its input carries row kinds."""

    sink: Sink = field(kw_only=True)
    primary_key: tuple[str, ...] = ()
    changelog: bool = False
    kind: ClassVar[str] = "sink"

    def describe(self) -> dict[str, Any]:
        described = dict(self.sink.describe())
        if self.primary_key:
            described["primary_key"] = list(self.primary_key)
        if self.changelog:
            described["changelog"] = True
        return described

    @property
    def partition_keys(self) -> tuple[str, ...]:
        return self.primary_key


def sink_target(sink: Any) -> str:
    """Where a sink writes: its path, its connector and topic, or its connector's name."""
    described = sink.describe()
    if "topic" in described:
        return f"{described.get('connector', 'sink')} {described['topic']}"
    return str(described.get("path", described.get("connector", "sink")))


def function_name(function: Callable[..., Any] | None) -> str:
    if function is None:
        return "?"
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def emits_changelog(nodes: Mapping[int, Node], node_id: int) -> bool:
    """Whether the rows of ``node_id`` carry row kinds (``op``): a normalized changelog source,
    an aggregate over a changelog, an outer join, a streaming Top-N, and the stateless
    operators after them."""
    node = nodes[node_id]
    if isinstance(node, NormalizeNode):
        return True
    if isinstance(node, JoinNode):
        return node.changelog
    if isinstance(node, (AggregateNode, RankNode)):
        return node.changelog
    if isinstance(node, SourceNode):
        return changelog_mode(node.source) == "all"
    if isinstance(node, (SelectNode, FilterNode, WithColumnsNode, MapBatchesNode, UnionNode)):
        return emits_changelog(nodes, node.inputs[0])  # they must keep ``op`` (checked when they run)
    return False


def reads_unbounded(needed: Iterable[Node]) -> bool:
    """Whether any of ``needed`` reads an unbounded source (the plan then runs as a stream)."""
    return any(is_unbounded(node.source) for node in needed if isinstance(node, SourceNode))


def event_time_column(nodes: Mapping[int, Node], node_id: int) -> str | None:
    """The event-time column of the source(s) ``node_id`` reads from (their watermark strategy's);
    None where a source has none or a union's sources name different columns."""
    found = event_time_origin(nodes, node_id)
    if isinstance(found, ConnectedNode):
        return None  # a join's or connect's rows carry no event time of one source (as Flink SQL)
    if isinstance(found, UnionNode):
        columns = {event_time_column(nodes, input_id) for input_id in found.inputs}
        return columns.pop() if len(columns) == 1 else None
    return found.watermark.column if isinstance(found, SourceNode) and found.watermark is not None else None


def event_time_origin(nodes: Mapping[int, Node], node_id: int) -> Node:
    """Where the event time of ``node_id``'s rows comes from: a source, a union, or a two-input
    keyed operator (following the first input of every other operator)."""
    found = nodes[node_id]
    while not isinstance(found, (SourceNode, UnionNode, ConnectedNode)) and found.inputs:
        found = nodes[found.inputs[0]]
    return found


def keyed_origin(nodes: Mapping[int, Node], node_id: int) -> Node:
    """The first operator at or before ``node_id`` that is not a filter or a with_columns: where
    a ``reinterpret_as_keyed`` finds the partitioning it declares."""
    found = nodes[node_id]
    while isinstance(found, (FilterNode, WithColumnsNode)):
        found = nodes[found.inputs[0]]
    return found


def upstream(nodes: Mapping[int, Node], roots: Iterable[int]) -> list[Node]:
    """Every node the roots depend on, inputs before consumers, each once."""
    ordered: list[Node] = []
    seen: set[int] = set()

    def visit(node_id: int) -> None:
        if node_id in seen:
            return
        seen.add(node_id)
        for input_id in nodes[node_id].inputs:
            visit(input_id)
        ordered.append(nodes[node_id])

    for root in roots:
        visit(root)
    return ordered
