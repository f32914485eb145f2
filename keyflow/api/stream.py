"""Streams: what users chain operators on. Each method adds one plan node through the
pipeline's :class:`~keyflow.plan.builder.PlanBuilder` (which checks it) and returns a stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from keyflow.errors import PlanError
from keyflow.plan import nodes
from keyflow.plan.builder import Keying, PlanBuilder, aggregations_needed
from keyflow.plan.descriptors import StateDescriptor
from keyflow.plan.durations import duration
from keyflow.plan.event_time import WindowAssigner

if TYPE_CHECKING:
    import pandas as pd

    from keyflow.api.pipeline import Pipeline


class Stream:
    """A stream of rows; stateless operators run as Spark SQL expressions or Arrow batches."""

    def __init__(self, pipeline: Pipeline, node_id: int) -> None:
        self.pipeline = pipeline
        self.node_id = node_id

    @property
    def node(self) -> nodes.Node:
        """The plan node of the operator that produced this stream."""
        return self._builder.node(self.node_id)

    @property
    def _builder(self) -> PlanBuilder:
        return self.pipeline.builder

    def _then(self, node_id: int) -> Stream:
        return Stream(self.pipeline, node_id)

    def broadcast(self) -> Broadcast:
        """This stream as a side input that every subtask of a keyed operator receives whole
        (``process(..., side=small.broadcast())``); keep it small: it is read on the driver."""
        return Broadcast(self)

    def set_name(self, name: str) -> Stream:
        """Name the operator that produced this stream (plans and error messages use it)."""
        self._builder.rename(self.node_id, name)
        return self

    def set_parallelism(self, parallelism: int) -> Stream:
        """Run the operator that produced this stream with ``parallelism`` subtasks."""
        self._builder.set_parallelism(self.node_id, parallelism)
        return self

    def uid(self, uid: str) -> Stream:
        """Give the operator that produced this stream a stable id (Flink's ``uid``): its state
        is restored by this id, so it survives renames and changes elsewhere in the pipeline."""
        self._builder.set_uid(self.node_id, uid)
        return self

    def select(self, *expressions: str, name: str = "select", parallelism: int | None = None) -> Stream:
        """Keep or compute columns with Spark SQL expressions: ``select("user", "price * 2 AS double")``."""
        return self._then(self._builder.select(self.node_id, expressions, name, parallelism))

    def filter(self, condition: str, name: str = "filter", parallelism: int | None = None) -> Stream:
        """Keep rows where a Spark SQL condition holds: ``filter("price > 0")``."""
        return self._then(self._builder.filter(self.node_id, condition, name, parallelism))

    def with_columns(self, **columns: str) -> Stream:
        """Add or replace columns from Spark SQL expressions: ``with_columns(total="price * qty")``.

        Every keyword is a column (even ``name``); name the operator with :meth:`set_name`.
        """
        return self._then(self._builder.with_columns(self.node_id, columns))

    def map_batches(
        self,
        function: Callable[[Any], Any],
        schema: pa.Schema | str | None = None,
        batch_format: str = "arrow",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Python logic over whole batches: ``function(batch) -> batch``, where a batch is a
        ``pyarrow.RecordBatch`` (``batch_format="arrow"``) or a pandas DataFrame (``"pandas"``).

        ``schema`` (Arrow schema or Spark DDL string) is the output's; when omitted it is the
        result of calling ``function`` on an empty batch of the input schema.
        """
        return self._then(self._builder.map_batches(self.node_id, function, schema, batch_format, name, parallelism))

    def union(self, *others: Stream, name: str = "union") -> Stream:
        """The rows of this stream and of ``others`` (Flink's ``union``), matched by column name:
        every stream must have the same column names and types. Sources may differ, bounded
        or not; with event time, the union's watermark is the smallest of its inputs'."""
        if not others:
            raise PlanError("union(...) needs one or more other streams: a.union(b, c)")
        for other in others:
            if not isinstance(other, Stream):
                raise PlanError(f"union(...) takes streams, got {other!r}")
            if other.pipeline is not self.pipeline:
                raise PlanError("union(...) of a stream of another pipeline; build both streams from one Pipeline")
        return self._then(self._builder.union([self.node_id, *(other.node_id for other in others)], name))

    def join(
        self,
        other: Stream,
        on: str | list[str] | list[tuple[str, str]] | tuple[str, ...],
        how: str = "inner",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A regular join with ``other`` where the ``on`` columns are equal (Flink's streaming
        join): ``on="user"``, ``on=["user", "day"]`` (columns both streams have) or
        ``on=[("user", "uid")]`` (this stream's column, ``other``'s). ``how``: ``inner``,
        ``left``, ``right`` or ``full``. Both streams' rows are kept in keyed state, so every
        pair of rows that match is emitted once, whatever order they arrive in. Outer joins
        emit a changelog (``op``): a row padded with nulls (``+I``) is retracted (``-D``) when
        its first match arrives, so the output's current table
        (:func:`keyflow.changelog.current`) is the batch join at every micro-batch. Output
        columns: the keys (named as this stream's), this stream's other columns, then
        ``other``'s; other columns both streams have are a plan error (rename one side)."""
        self._check_other("join", other)
        pairs = _join_pairs(on)
        return self._then(self._builder.join((self.node_id, other.node_id), pairs, how, name, parallelism))

    def interval_join(
        self,
        other: Stream,
        on: str | list[str] | list[tuple[str, str]] | tuple[str, ...],
        between: tuple[Any, Any],
        how: str = "inner",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A join of rows whose ``on`` columns are equal and whose event times are close
        (Flink's interval join): a row of this stream at time ``t`` matches the rows of
        ``other`` at times in ``[t + lower, t + upper]``, ``between=(lower, upper)``, e.g.
        ``('-5 s', '10 min')``. Each stream's time is its source's watermark column, so both
        sources need a watermark strategy. A row leaves the state once the watermark passes
        the last time a row of the other stream could match it, so the state stays bounded
        however long the job runs. ``how``: ``inner``, ``left``, ``right`` or ``full``; an
        outer join emits a row that never matched, padded with nulls, when it leaves the state
        (as Flink SQL), so the output is append-only. Columns as :meth:`join`."""
        self._check_other("interval_join", other)
        if not (isinstance(between, (tuple, list)) and len(between) == 2):
            raise PlanError(
                f"interval_join between={between!r}: give (lower, upper), the other stream's times relative to this "
                "one's, e.g. between=('-5 s', '10 s')"
            )
        lower = duration(between[0], "between lower", signed=True)
        upper = duration(between[1], "between upper", signed=True)
        inputs, pairs = (self.node_id, other.node_id), _join_pairs(on)
        return self._then(self._builder.interval_join(inputs, pairs, (lower, upper), how, name, parallelism))

    def window_join(
        self,
        other: Stream,
        on: str | list[str] | list[tuple[str, str]] | tuple[str, ...],
        window: WindowAssigner,
        how: str = "inner",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """A join of rows whose ``on`` columns are equal and that fall in the same event-time
        window (Flink's window join): ``window`` is ``tumbling('1 min')`` or ``sliding('10 min',
        '1 min')`` over each stream's source watermark column. Every pair is emitted once, as
        soon as both rows arrived; a window's rows leave the state once the watermark passes
        its end, and rows arriving after that are late (dropped, counted in the run's metrics).
        ``how``: ``inner``, ``left``, ``right`` or ``full``; an outer join emits a row that
        matched nothing in its window, padded with nulls, when the window ends (as Flink SQL),
        so the output is append-only. Columns: the keys, ``window_start``, ``window_end``,
        then as :meth:`join`."""
        self._check_other("window_join", other)
        inputs, pairs = (self.node_id, other.node_id), _join_pairs(on)
        return self._then(self._builder.window_join(inputs, pairs, window, how, name, parallelism))

    def lookup_join(
        self,
        table: Stream,
        on: str | list[str] | list[tuple[str, str]] | tuple[str, ...],
        how: str = "inner",
        name: str | None = None,
    ) -> Stream:
        """Each row of this stream enriched with the matching rows of ``table``, a stream of
        bounded sources only (Flink's lookup join, against a table read from files): ``on`` as
        :meth:`join`; ``how``: ``inner`` or ``left`` (a row with no match, padded with nulls).
        The table is read whole at every micro-batch, so a streaming run sees its current
        files; Spark broadcasts it where it is small and shuffles both by the key otherwise.
        No state: nothing to checkpoint or rescale. Output columns as :meth:`join`."""
        self._check_other("lookup_join", table)
        inputs, pairs = (self.node_id, table.node_id), _join_pairs(on)
        return self._then(self._builder.lookup_join(inputs, pairs, how, name))

    def _check_other(self, operation: str, other: object) -> None:
        if not isinstance(other, Stream):
            raise PlanError(f"{operation}(...) takes a stream, got {other!r}")
        if other.pipeline is not self.pipeline:
            raise PlanError(f"{operation}(...) of a stream of another pipeline; build both streams from one Pipeline")

    def key_by(self, *keys: str, on_null: Any = None) -> KeyedStream:
        """Partition by key: rows with equal keys meet in one subtask, in one key group.

        ``on_null``: a sink that receives rows whose key has a null (a dead letter queue);
        by default ``pipeline.null-keys`` decides (``fail`` with the count, or ``drop``).
        """
        return KeyedStream(self, self._builder.key_by(keys, on_null))

    def reinterpret_as_keyed(self, *keys: str) -> KeyedStream:
        """This stream, already partitioned by ``keys`` as a keyed operator left it: the next
        keyed operator runs in the same partitions, with no exchange (Flink's
        ``reinterpretAsKeyedStream``, checked). It must follow a keyed operator on the same
        keys at the same parallelism, through filters only; rows whose key group is not their
        subtask's stop the job (``pipeline.pre-keyed.verify``)."""
        return KeyedStream(self, self._builder.key_by(keys, reinterpreted=True))

    def sink(
        self,
        sink: Any,
        parallelism: int | None = None,
        name: str | None = None,
        uid: str | None = None,
        primary_key: str | tuple[str, ...] = (),
    ) -> None:
        """Write this stream to ``sink`` when the pipeline runs (``uid``: the sink's stable id;
        ``primary_key``: rows reach the sink routed by it, see ``table.exec.sink.keyed-shuffle``)."""
        self._builder.sink(self.node_id, sink, parallelism, name, uid, primary_key)

    @property
    def is_changelog(self) -> bool:
        """Whether rows carry row kinds in ``op`` (+I, -U, +U, -D): see ``keyflow.changelog``."""
        return self._builder.is_changelog(self.node_id)

    def to_arrow(self) -> pa.Table:
        """Run the pipeline up to this stream (bounded sources) and return its rows."""
        return self.pipeline.collect(self.node_id)

    def to_pandas(self) -> pd.DataFrame:
        """Like :meth:`to_arrow`, as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def collect(self, as_pandas: bool = False) -> pa.Table | pd.DataFrame:
        """The stream's rows for tests and notebooks: an Arrow table, or pandas with ``as_pandas``."""
        return self.to_pandas() if as_pandas else self.to_arrow()


def _join_pairs(on: object) -> list[tuple[str, str]]:
    """``on`` as (left column, right column) pairs."""
    items = [on] if isinstance(on, str) else list(on) if isinstance(on, (list, tuple)) else None
    pairs = []
    for item in items or ():
        if isinstance(item, str) and item.strip():
            pairs.append((item, item))
        elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(c, str) and c.strip() for c in item):
            pairs.append((item[0], item[1]))
        else:
            items = None
            break
    if not items:
        raise PlanError(
            f"join on={on!r}: name the columns to match, e.g. on='user', on=['user', 'day'] or on=[('user', 'uid')]"
        )
    for side in (0, 1):
        columns = [pair[side] for pair in pairs]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise PlanError(
                f"join on={on!r} names {repeated} twice; name each column once (a pair of a column of each stream is "
                "a tuple inside a list: on=[('user', 'uid')])"
            )
    return pairs


@dataclass(frozen=True)
class Broadcast:
    """A stream every subtask of a keyed operator sees whole (a broadcast edge): one table,
    read once per run (per micro-batch when streaming), passed to the function."""

    stream: Stream


class KeyedStream:
    """A stream partitioned by key; its operators keep per-key state in key groups."""

    def __init__(self, stream: Stream, keying: Keying) -> None:
        self._stream = stream
        self._keying = keying

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keying.keys

    def aggregate(self, **aggregations: str) -> Stream:
        """Per-key aggregates as Spark SQL: ``aggregate(clicks="count(*)", revenue="sum(price)")``.

        Built-ins (count, sum, min, max, avg, first, last, and any other Spark aggregate)
        are partially aggregated before the keyed exchange, so one row per key crosses it.
        Every keyword is an output column; use :meth:`Stream.set_name`,
        :meth:`Stream.set_parallelism` and :meth:`Stream.uid` on the result for the operator's
        name, parallelism and stable id.
        """
        if not aggregations:  # keys alone are SQL's GROUP BY without aggregates; here, a slip
            raise aggregations_needed(aggregations)
        stream = self._stream
        return stream._then(stream._builder.aggregate(stream.node_id, self._keying, aggregations))

    def top_n(self, n: int, *order_by: str, row_number: str | None = None, name: str = "top-n") -> Stream:
        """Each key's first ``n`` rows by ``order_by`` (``"price DESC"``, ``"order_id"``;
        ascending puts nulls first, descending last): Flink's Top-N, SQL's ``ROW_NUMBER() …
        WHERE rn <= n``. ``row_number``: a column numbering the rows 1..n. Over an unbounded
        source the output is a changelog (a row pushed out of its key's top is retracted),
        except keyed by a window aggregate's windows: each ranked once, when it ends. Of a
        changelog (an upsert source, a join of changelogs), each key keeps every current row,
        so a retracted row's place is taken by the next (Flink's RetractableTopN)."""
        order = [_ordering(item, name) for item in order_by]
        stream = self._stream
        node_id = stream._builder.rank(stream.node_id, self._keying, order, n, row_number, name=name)
        return stream._then(node_id)

    def over(self, preceding: Any = None, *, rows: bool = False, name: str = "over", **aggregations: str) -> Stream:
        """Flink's OVER aggregation: each row with ``aggregations`` (``total="sum(amount)"``:
        count, sum, avg, min, max) over its key's rows up to it in event time (the source's
        watermark column). ``preceding``: None for all earlier rows (UNBOUNDED PRECEDING), a
        duration (``'10 min'``: RANGE, rows of an event time at most that much earlier), or with
        ``rows=True`` a number of earlier rows (ROWS n PRECEDING). Over an unbounded source a
        row is emitted once the watermark passes it; rows at or before a time its key already
        emitted are late, dropped and counted."""
        if rows and preceding is not None and (isinstance(preceding, bool) or not isinstance(preceding, int)):
            raise PlanError(f"{name}: over(preceding={preceding!r}, rows=True) counts rows; give a whole number")
        if not rows and isinstance(preceding, int) and not isinstance(preceding, bool):
            raise PlanError(f"{name}: over(preceding={preceding!r}) is a time range; give a duration such as "
                            f"'{preceding} s', or rows=True to count {preceding} rows")  # fmt: skip
        reach = preceding if rows or preceding is None else duration(preceding, "preceding")
        stream = self._stream
        frame = nodes.OverFrame(rows=rows, preceding=reach)
        node_id = stream._builder.over(stream.node_id, self._keying, None, aggregations, frame, name=name)
        return stream._then(node_id)

    def connect(self, other: KeyedStream) -> ConnectedStreams:
        """This keyed stream and ``other`` in one operator with one keyed state (Flink's
        ``connect``): both are routed by the same key groups, so the state of a key sees the
        rows of both streams and rescales like any keyed state. Continue with
        :meth:`ConnectedStreams.process`."""
        if not isinstance(other, KeyedStream):
            raise PlanError(f"connect(...) takes a keyed stream (stream.key_by(...)), got {other!r}")
        if other._stream.pipeline is not self._stream.pipeline:
            raise PlanError("connect(...) of a stream of another pipeline; build both streams from one Pipeline")
        return ConnectedStreams(self, other)

    def window(self, assigner: WindowAssigner, allowed_lateness: Any = 0, late_rows: Any = None) -> WindowedStream:
        """Event-time windows per key (Flink's ``window``): ``tumbling('1 min')``,
        ``sliding('10 min', '1 min')`` or ``session('30 min')``, over the source's watermark
        column. A window's row is emitted once, when the watermark passes its end; rows
        arriving within ``allowed_lateness`` after that update it (emitted again with
        ``is_update`` true); later rows go to the ``late_rows`` sink with the reason, or are
        dropped and counted in the run's metrics."""
        return WindowedStream(self, assigner, duration(allowed_lateness, "allowed_lateness"), late_rows)

    def process(
        self,
        function: Callable[..., Any],
        schema: pa.Schema | str,
        state: dict[str, StateDescriptor] | None = None,
        order_by: str | tuple[str, ...] | list[str] = (),
        name: str | None = None,
        parallelism: int | None = None,
        side: Broadcast | None = None,
        on_timer: Callable[..., Any] | None = None,
    ) -> Stream:
        """A keyed process function over Arrow batches: ``function(batch, state) -> table``.

        ``batch`` is a :class:`keyflow.KeyedBatch` (rows grouped by key; with ``order_by``,
        whole keys with their rows sorted by it);
        ``state`` gives vectorised access to the declared per-key ``state``; the result is a
        ``pyarrow.Table``/``RecordBatch`` or pandas DataFrame matching ``schema``. With
        ``side=stream.broadcast()`` the function is ``function(batch, state, side)``, ``side``
        the whole side stream as a ``pyarrow.Table``.

        With ``on_timer``, ``state.timers`` registers and deletes event-time and processing-time
        timers per key (:class:`keyflow.TimerService`), and ``on_timer(timers, state) -> table``
        is called with the keys whose timers fire (:class:`keyflow.FiredTimers`: at most one
        timer per key per call, in timestamp order) and their state. Event-time timers fire when
        the watermark passes them (see ``Pipeline.source(..., watermark=)``), all of them at the
        end of a bounded input.
        """
        if side is not None and not isinstance(side, Broadcast):
            raise PlanError(f"process side= takes a broadcast stream (stream.broadcast()), got {side!r}")
        if side is not None and side.stream.pipeline is not self._stream.pipeline:
            raise PlanError("process side= is a stream of another pipeline; build both streams from one Pipeline")
        stream = self._stream
        node_id = stream._builder.process(
            stream.node_id,
            self._keying,
            function,
            schema,
            state,
            order_by,
            name,
            parallelism,
            None if side is None else side.stream.node_id,
            on_timer,
        )
        return stream._then(node_id)


class ConnectedStreams:
    """Two keyed streams in one operator (see :meth:`KeyedStream.connect`)."""

    def __init__(self, first: KeyedStream, second: KeyedStream) -> None:
        self._first, self._second = first, second

    def process(
        self,
        first: Callable[..., Any],
        second: Callable[..., Any],
        schema: pa.Schema | str,
        state: dict[str, StateDescriptor] | None = None,
        on_timer: Callable[..., Any] | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Flink's ``KeyedCoProcessFunction``, vectorised: ``first(batch, state) -> table`` for
        rows of the first stream, ``second(batch, state) -> table`` for rows of the second;
        ``batch`` is a :class:`keyflow.KeyedBatch` of that stream's rows (its own columns) and
        ``state`` the one keyed state both share (declared in ``state``; with ``on_timer``,
        ``state.timers`` as in :meth:`KeyedStream.process`). Within one call the first
        stream's rows are processed before the second's; a micro-batch of a subtask may be
        several calls (Arrow batches), in any order of the two streams. Keys of the two streams are
        matched by position (``user`` of one with ``user_id`` of the other) and must have the
        same types."""
        one = self._first._stream
        node_id = one._builder.co_process(
            (one.node_id, self._second._stream.node_id),
            (self._first._keying, self._second._keying),
            (first, second),
            schema,
            state,
            on_timer,
            name,
            parallelism,
        )
        return one._then(node_id)


class WindowedStream:
    """A keyed stream cut into event-time windows (see :meth:`KeyedStream.window`)."""

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner, allowed_lateness: int, late_rows: Any) -> None:
        stream = keyed._stream
        self._keyed = keyed
        self._windowing = stream._builder.windowing(
            stream.node_id, keyed._keying, assigner, allowed_lateness, late_rows
        )

    def aggregate(self, **aggregations: str) -> Stream:
        """Aggregates per key and window, merged incrementally (count, sum, min, max, avg): no
        rows are kept. Output: the keys, ``window_start``, ``window_end``, the aggregates (and
        ``is_update`` with an allowed lateness)."""
        stream = self._keyed._stream
        node_id = stream._builder.window_aggregate(stream.node_id, self._keyed._keying, self._windowing, aggregations)
        return stream._then(node_id)

    def process(self, function: Callable[..., Any], schema: pa.Schema | str, name: str | None = None) -> Stream:
        """Flink's ``ProcessWindowFunction``: ``function(windows) -> table`` over all rows of the
        windows that fire, vectorised: ``windows`` is a :class:`keyflow.KeyedBatch` whose keys
        are the key columns with ``window_start`` and ``window_end``, one per window, and whose
        rows are each window's rows. Rows are kept in state until their window fires (tumbling
        and sliding windows; late rows within the lateness fire the window again)."""
        stream = self._keyed._stream
        node_id = stream._builder.window_process(
            stream.node_id, self._keyed._keying, self._windowing, function, schema, name
        )
        return stream._then(node_id)


def _ordering(item: str, operator: str) -> tuple[str, bool]:
    """``"price DESC"`` as ``("price", True)``; ``"price"`` or ``"price ASC"`` ascending."""
    words = item.split() if isinstance(item, str) else []
    if len(words) == 1 or (len(words) == 2 and words[1].upper() in ("ASC", "DESC")):
        return words[0], len(words) == 2 and words[1].upper() == "DESC"
    raise PlanError(f"{operator}: order {item!r} is not a column with an optional ASC or DESC, e.g. 'price DESC'")
