"""Physical keyed operators: what each keyed node of a plan runs as, decided once, in the plan.

The logical node says what the user asked for (an aggregate by ``user``); the physical kind
says how it runs and what it stores: a batch ``groupBy``, partials of each micro-batch
merged into state, running partials in the worker, or the value multisets a changelog
needs to retract rows. Each kind has its own translator in ``keyflow.runtime.translators``,
so a new way of running (event-time windows, joins) is a new kind, not a new flag. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from keyflow.plan.aggregates import AggregateCall, mergeable, over_calls, parse_aggregations, retractable
from keyflow.plan.event_time import WindowAssigner, timer_state
from keyflow.plan.nodes import (
    AggregateNode,
    ChangelogJoinNode,
    CoProcessNode,
    IntervalJoinNode,
    JoinNode,
    KeyedNode,
    NormalizeNode,
    OverNode,
    ProcessNode,
    RankNode,
    RetractableRankNode,
    WindowAggregateNode,
    WindowJoinNode,
    WindowProcessNode,
    WindowTableRankNode,
)
from keyflow.plan.state_schema import KeyGroupSource, StateLayout, StateSchema


@dataclass(frozen=True, eq=False)
class KeyedOperator:
    """A keyed node as it runs: routed by key group, state kept per key."""

    node: KeyedNode
    layout: ClassVar[StateLayout] = StateLayout.PARTIALS

    def state_schema(self, key_groups: KeyGroupSource) -> StateSchema:
        """What it persists, for ``plan.json``; ``key_groups``: decided by the compiler."""
        return StateSchema(self.node.keys, self.contents(), self.layout, key_groups)

    def contents(self) -> tuple[tuple[str, str], ...]:
        return ()  # a normalize: each key's last row, of the input's schema


@dataclass(frozen=True, eq=False)
class ChangelogNormalize(KeyedOperator):
    """Flink's ChangelogNormalize: each key's previous row in state, upserts become -U/+U."""

    node: NormalizeNode


@dataclass(frozen=True, eq=False)
class KeyedProcess(KeyedOperator):
    """The user's function over whole keys (with ``order_by``) or batches of keys, with state."""

    node: ProcessNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        return self.node.declared_state()


@dataclass(frozen=True, eq=False)
class TimedProcess(KeyedProcess):
    """A process function with timers: its declared state and each key's pending timers."""

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (*self.node.declared_state(), *_timer_contents())


@dataclass(frozen=True, eq=False)
class KeyedCoProcess(KeyedOperator):
    """Two inputs' rows in the same key groups, a function per input over one shared state
    (with ``on_timer``: and each key's pending timers)."""

    node: CoProcessNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (*self.node.declared_state(), *(_timer_contents() if self.node.on_timer is not None else ()))


def _timer_contents() -> tuple[tuple[str, str], ...]:
    """Each key's pending timers, as the plan records them."""
    return tuple((name, str(descriptor.arrow_type)) for name, descriptor in timer_state().items())


@dataclass(frozen=True, eq=False)
class RegularJoin(KeyedOperator):
    """Each input's rows of a key in list state (with outer joins: how many rows of the other
    input each has matched); a new row is joined with the other input's rows of its key."""

    node: JoinNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (("rows", "each input's rows"), ("how", self.node.how))


@dataclass(frozen=True, eq=False)
class ChangelogJoin(KeyedOperator):
    """A regular join of changelogs (Flink's ``StreamingJoinOperator`` with retractions): each
    input's current rows of a key in list state; an update or delete removes its row and
    retracts the joined rows it made, an insert or update joins as in a regular join."""

    node: ChangelogJoinNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (("rows", "each input's current rows"), ("how", self.node.how), ("retracts", "-U and -D rows"))


@dataclass(frozen=True, eq=False)
class IntervalJoin(KeyedOperator):
    """Each input's rows of a key in list state until the watermark passes the last time a row
    of the other input could match them (each key's earliest such time in a column, so the
    rows due to leave are found with one comparison per micro-batch)."""

    node: IntervalJoinNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        node = self.node
        between = f"{node.time_columns[1]} - {node.time_columns[0]} in [{node.lower}, {node.upper}] us"
        return (("rows", "each input's rows until the watermark passes them"), ("how", node.how), ("between", between))


@dataclass(frozen=True, eq=False)
class WindowJoin(KeyedOperator):
    """Each input's rows of a key and window in list state until the watermark passes the
    window's end (when that is, per key and window, in a column: one comparison finds them)."""

    node: WindowJoinNode
    layout: ClassVar[StateLayout] = StateLayout.WINDOWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        assert self.node.assigner is not None  # the builder requires one
        rows = ("rows", "each input's rows of each window until it ends")
        return (rows, ("how", self.node.how), window_contents(self.node.assigner))


@dataclass(frozen=True, eq=False)
class Aggregate(KeyedOperator):
    node: AggregateNode
    calls: tuple[AggregateCall, ...]

    def contents(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.node.aggregations.items())


@dataclass(frozen=True, eq=False)
class GroupByAggregate(Aggregate):
    """Batch: Spark's ``groupBy`` of all rows, then the exchange by key group; no state."""


@dataclass(frozen=True, eq=False)
class MergedPartialsAggregate(Aggregate):
    """Streaming after ``key_by``: Spark aggregates each micro-batch, state merges its partials."""


@dataclass(frozen=True, eq=False)
class InWorkerAggregate(Aggregate):
    """After ``reinterpret_as_keyed`` (a Spark ``groupBy`` would shuffle): running partials
    merged in the worker, each touched key emitted once."""

    layout: ClassVar[StateLayout] = StateLayout.RUNNING


@dataclass(frozen=True, eq=False)
class RetractingAggregate(Aggregate):
    """Over a changelog: rows retract what they added; the output is a changelog (-U/+U)."""

    layout: ClassVar[StateLayout] = StateLayout.RETRACTING


@dataclass(frozen=True, eq=False)
class InWorkerDistinctAggregate(Aggregate):
    """After ``reinterpret_as_keyed`` with a DISTINCT (running partials cannot hold one): the
    retracting layout, emitting each changed key's new values as key_by's aggregate does."""

    layout: ClassVar[StateLayout] = StateLayout.RETRACTING


@dataclass(frozen=True, eq=False)
class WindowAggregate(Aggregate):
    """Tumbling or sliding windows: Spark aggregates each micro-batch per key and window, state
    merges the partials per (key, window) and the window fires when the watermark passes its end."""

    node: WindowAggregateNode
    layout: ClassVar[StateLayout] = StateLayout.WINDOWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (*super().contents(), window_contents(self.node.windowing.assigner))


@dataclass(frozen=True, eq=False)
class ProcessingTimeWindowAggregate(WindowAggregate):
    """Windows by the processing time (Flink's over a PROCTIME() column): each micro-batch's
    rows go to the windows of the time it runs at; a window's partials merge in state until a
    micro-batch runs after its end (or the bounded input ends), which emits it."""

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (*super().contents(), ("time", "processing time"))


@dataclass(frozen=True, eq=False)
class SessionWindowAggregate(WindowAggregate):
    """Session windows: each key's open sessions (bounds and partials) in state; a micro-batch's
    sessions (Spark's ``session_window``) merge with them where rows bridge the gap."""

    layout: ClassVar[StateLayout] = StateLayout.SESSIONS


@dataclass(frozen=True, eq=False)
class WindowProcess(KeyedOperator):
    """Tumbling or sliding windows of rows: each (key, window) keeps its rows in state until
    the window fires, then the function runs over all of them."""

    node: WindowProcessNode
    layout: ClassVar[StateLayout] = StateLayout.WINDOWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        return (("rows", "the input's rows"), window_contents(self.node.windowing.assigner))


@dataclass(frozen=True, eq=False)
class Rank(KeyedOperator):
    """Batch Top-N: Spark's ``row_number`` over each key's rows, then the exchange by key group."""

    node: RankNode

    def contents(self) -> tuple[tuple[str, str], ...]:
        order = ", ".join(f"{column} {'DESC' if descending else 'ASC'}" for column, descending in self.node.order)
        return (("rows", f"the first {self.node.limit} rows by {order}"),)


@dataclass(frozen=True, eq=False)
class AppendOnlyTopN(Rank):
    """Flink's AppendOnlyTopNFunction: each key's first rows in state, in order; a row that
    enters them pushes the last one out (``-D``, or with row numbers ``-U``/``+U`` for every
    rank whose row changed)."""

    layout: ClassVar[StateLayout] = StateLayout.TOP_ROWS


@dataclass(frozen=True, eq=False)
class RetractableTopN(Rank):
    """Flink's RetractableTopNFunction: each key's current rows (a changelog's additions
    stored, its retractions removing an equal row) and the first rows last emitted; a call
    emits the difference of the old and new first rows, retractions first."""

    layout: ClassVar[StateLayout] = StateLayout.ALL_ROWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        order = ", ".join(f"{column} {'DESC' if descending else 'ASC'}" for column, descending in self.node.order)
        return (("rows", f"every current row, and the first {self.node.limit} emitted, by {order}"),)


@dataclass(frozen=True, eq=False)
class WindowRank(Rank):
    """Flink's WindowRank: a Top-N keyed by a window aggregation's windows; each key (window
    included) keeps its first rows until the window ends, emits them then (insert-only) and
    drops its state (per key, when its window ends, so one comparison finds those due)."""

    layout: ClassVar[StateLayout] = StateLayout.TOP_ROWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        (rows, described), *_ = super().contents()
        return ((rows, f"{described}, of each window until it ends"),)


@dataclass(frozen=True, eq=False)
class Deduplicate(AppendOnlyTopN):
    """Flink's row-time deduplication: each key's kept row in state; keeping the last row, a
    later row of an equal or later time replaces it (``-U``/``+U``); keeping the first, only
    an earlier one does."""


@dataclass(frozen=True, eq=False)
class OverAggregate(KeyedOperator):
    """Batch OVER aggregation: Spark's window functions over each key's rows in time order,
    then the exchange by key group; no state."""

    node: OverNode
    calls: tuple[AggregateCall, ...]

    def contents(self) -> tuple[tuple[str, str], ...]:
        described = ", ".join(f"{call.function}({call.argument or '*'})" for call in self.calls)
        return (("frame", f"{self.node.frame.describe()} ORDER BY {self.node.order}: {described}"),)


@dataclass(frozen=True, eq=False)
class RowTimeOverAggregate(OverAggregate):
    """Flink's RowTime*PrecedingFunction: each key's rows wait in state until the watermark
    passes them; then, in time order (rows of an equal time together for RANGE), each gets
    the aggregates of its frame. State keeps what later frames still need: an unbounded
    frame's running partials, a bounded one's last rows (ROWS) or rows within its reach (RANGE)."""

    layout: ClassVar[StateLayout] = StateLayout.OVER_ROWS


@dataclass(frozen=True, eq=False)
class WindowTableRankBatch(Rank):
    """Batch window Top-N: Spark assigns each row its windows, then ``row_number`` over each
    key's rows of a window, then the exchange by key group."""

    node: WindowTableRankNode


@dataclass(frozen=True, eq=False)
class WindowTableRank(WindowTableRankBatch):
    """Flink's window Top-N (and window deduplication) after a window table function: Spark
    assigns windows and drops late rows; the workers keep each key's first rows per window
    (as ``WindowRank``) and emit them, insert-only, once the watermark passes its end."""

    layout: ClassVar[StateLayout] = StateLayout.TOP_ROWS

    def contents(self) -> tuple[tuple[str, str], ...]:
        assert self.node.windowing is not None  # the builder gives one
        return (*super().contents(), window_contents(self.node.windowing.assigner))


def window_contents(assigner: WindowAssigner) -> tuple[str, str]:
    """The windows a window operator's state is cut by (a restore with other windows is refused)."""
    return "window", json.dumps(assigner.describe(), sort_keys=True)


IN_WORKER = "after reinterpret_as_keyed (it runs in the worker; use key_by for others)"


def lower_keyed(node: KeyedNode, stateful: bool) -> KeyedOperator:
    """The physical kind of ``node``; ``stateful``: state lives across micro-batches (a
    streaming run), else one batch run. Raises a PlanError naming what cannot run."""
    if isinstance(node, NormalizeNode):
        return ChangelogNormalize(node)
    if isinstance(node, WindowProcessNode):
        return WindowProcess(node)
    if isinstance(node, ProcessNode):
        return KeyedProcess(node) if node.on_timer is None else TimedProcess(node)
    if isinstance(node, CoProcessNode):
        return KeyedCoProcess(node)
    if isinstance(node, IntervalJoinNode):
        return IntervalJoin(node)
    if isinstance(node, WindowJoinNode):
        return WindowJoin(node)
    if isinstance(node, ChangelogJoinNode):
        return ChangelogJoin(node)
    if isinstance(node, JoinNode):
        return RegularJoin(node)
    if isinstance(node, WindowTableRankNode):
        return WindowTableRank(node) if stateful else WindowTableRankBatch(node)
    if isinstance(node, RetractableRankNode):
        return RetractableTopN(node)
    if isinstance(node, RankNode):
        if node.window_end is not None and stateful:
            return WindowRank(node)
        return (Deduplicate if node.deduplicates else AppendOnlyTopN)(node) if node.changelog else Rank(node)
    if isinstance(node, OverNode):
        calls = over_calls(node.name, parse_aggregations(node.aggregations))
        return RowTimeOverAggregate(node, calls) if stateful else OverAggregate(node, calls)
    if not isinstance(node, AggregateNode):
        raise AssertionError(f"no physical kind for {node.kind} {node.name!r}")
    calls = parse_aggregations(node.aggregations)
    if isinstance(node, WindowAggregateNode):
        kind = SessionWindowAggregate if node.windowing.assigner.merging else WindowAggregate
        kind = ProcessingTimeWindowAggregate if node.windowing.processing_time else kind
        return kind(node, mergeable(node.name, calls))
    if node.changelog:
        return RetractingAggregate(node, retractable(node.name, calls, "over a changelog"))
    if node.reinterpreted and any(call.distinct for call in calls):
        return InWorkerDistinctAggregate(node, retractable(node.name, calls, IN_WORKER))
    if node.reinterpreted:
        return InWorkerAggregate(node, retractable(node.name, calls, IN_WORKER))
    if stateful:
        return MergedPartialsAggregate(node, mergeable(node.name, calls))
    return GroupByAggregate(node, calls)
