"""Streams: what users chain operators on. Each method adds one plan node and returns a stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from keyflow.connectors.base import Sink
from keyflow.errors import PlanError, positive_option
from keyflow.plan import nodes
from keyflow.plan.descriptors import StateDescriptor
from keyflow.plan.uids import check_uid

if TYPE_CHECKING:
    import pandas as pd

    from keyflow.api.pipeline import Pipeline


def check_parallelism_option(value: int | None, what: str) -> int | None:
    return positive_option(value, f"{what} parallelism")


class Stream:
    """A stream of rows; stateless operators run as Spark SQL expressions or Arrow batches."""

    def __init__(self, pipeline: Pipeline, node_id: int) -> None:
        self.pipeline = pipeline
        self.node_id = node_id

    @property
    def node(self) -> nodes.Node:
        """The plan node of the operator that produced this stream."""
        return self.pipeline.node(self.node_id)

    def _then(
        self,
        kind: type[nodes.Node],
        name: str,
        parallelism: int | None = None,
        inputs: tuple[int, ...] | None = None,
        **fields: Any,
    ) -> Stream:
        return Stream(self.pipeline, self.pipeline.add(kind, inputs or (self.node_id,), name, parallelism, **fields))

    def broadcast(self) -> Broadcast:
        """This stream as a side input that every subtask of a keyed operator receives whole
        (``process(..., side=small.broadcast())``); keep it small: it is read on the driver."""
        return Broadcast(self)

    def set_name(self, name: str) -> Stream:
        """Name the operator that produced this stream (plans and error messages use it)."""
        if not isinstance(name, str) or not name.strip():
            raise PlanError(f"an operator name must be a non-empty string, got {name!r}")
        self.pipeline.replace(self.node_id, name=name)
        return self

    def set_parallelism(self, parallelism: int) -> Stream:
        """Run the operator that produced this stream with ``parallelism`` subtasks."""
        checked = check_parallelism_option(parallelism, f"operator {self.node.name!r}")
        self.pipeline.replace(self.node_id, parallelism=checked)
        return self

    def uid(self, uid: str) -> Stream:
        """Give the operator that produced this stream a stable id (Flink's ``uid``): its state
        is restored by this id, so it survives renames and changes elsewhere in the pipeline."""
        self.pipeline.replace(self.node_id, explicit_uid=check_uid(uid))
        return self

    def select(self, *expressions: str, name: str = "select", parallelism: int | None = None) -> Stream:
        """Keep or compute columns with Spark SQL expressions: ``select("user", "price * 2 AS double")``."""
        if not expressions or not all(isinstance(e, str) and e.strip() for e in expressions):
            raise PlanError(f"select needs one or more SQL expression strings, got {expressions!r}")
        return self._then(nodes.SelectNode, name, _p(parallelism, name), expressions=tuple(expressions))

    def filter(self, condition: str, name: str = "filter", parallelism: int | None = None) -> Stream:
        """Keep rows where a Spark SQL condition holds: ``filter("price > 0")``."""
        if not isinstance(condition, str) or not condition.strip():
            raise PlanError(f"filter needs a SQL condition string such as 'price > 0', got {condition!r}")
        return self._then(nodes.FilterNode, name, _p(parallelism, name), condition=condition)

    def with_columns(self, **columns: str) -> Stream:
        """Add or replace columns from Spark SQL expressions: ``with_columns(total="price * qty")``.

        Every keyword is a column (even ``name``); name the operator with :meth:`set_name`.
        """
        if not columns or not all(isinstance(e, str) and e.strip() for e in columns.values()):
            raise PlanError(f"with_columns needs column=SQL expression pairs, got {columns!r}")
        return self._then(nodes.WithColumnsNode, "with_columns", columns=columns)

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
        if not callable(function):
            raise PlanError(f"map_batches needs a function, got {function!r}")
        if batch_format not in ("arrow", "pandas"):
            raise PlanError(f"map_batches batch_format={batch_format!r} is invalid; choose arrow or pandas")
        label = name or str(getattr(function, "__name__", "map_batches"))
        return self._then(
            nodes.MapBatchesNode,
            label,
            _p(parallelism, label),
            function=function,
            schema=schema,
            batch_format=batch_format,
        )

    def key_by(self, *keys: str, on_null: Any = None) -> KeyedStream:
        """Partition by key: rows with equal keys meet in one subtask, in one key group.

        ``on_null``: a sink that receives rows whose key has a null (a dead letter queue);
        by default ``pipeline.null-keys`` decides (``fail`` with the count, or ``drop``).
        """
        if not keys or not all(isinstance(key, str) and key.strip() for key in keys):
            raise PlanError(f"key_by needs one or more column names, got {keys!r}")
        if on_null is not None and not isinstance(on_null, Sink):
            raise PlanError(f"key_by on_null={on_null!r} is not a sink; pass e.g. parquet('out/dead_letters')")
        return KeyedStream(self, tuple(keys), on_null)

    def reinterpret_as_keyed(self, *keys: str) -> KeyedStream:
        """This stream, already partitioned by ``keys`` as a keyed operator left it: the next
        keyed operator runs in the same partitions, with no exchange (Flink's
        ``reinterpretAsKeyedStream``, checked). It must follow a keyed operator on the same
        keys at the same parallelism, through filters only; rows whose key group is not their
        subtask's stop the job (``pipeline.pre-keyed.verify``)."""
        keyed = self.key_by(*keys)
        keyed.reinterpreted = True
        return keyed

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
        if not isinstance(sink, Sink):
            raise PlanError(f"{sink!r} is not a sink; use parquet(...), json(...), csv(...) or console()")
        label = name or f"sink: {nodes.sink_target(sink)}"
        checked_uid = None if uid is None else check_uid(uid)
        keys = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
        self.pipeline.add_sink(
            self.pipeline.add(
                nodes.SinkNode,
                (self.node_id,),
                label,
                _p(parallelism, label),
                explicit_uid=checked_uid,
                sink=sink,
                primary_key=keys,
                changelog=self.is_changelog,
            )
        )

    @property
    def is_changelog(self) -> bool:
        """Whether rows carry row kinds in ``op`` (+I, -U, +U, -D): see ``keyflow.changelog``."""
        return nodes.emits_changelog(self.pipeline.operators, self.node_id)

    def to_arrow(self) -> pa.Table:
        """Run the pipeline up to this stream (bounded sources) and return its rows."""
        return self.pipeline.collect(self.node_id)

    def to_pandas(self) -> pd.DataFrame:
        """Like :meth:`to_arrow`, as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def collect(self, as_pandas: bool = False) -> pa.Table | pd.DataFrame:
        """The stream's rows for tests and notebooks: an Arrow table, or pandas with ``as_pandas``."""
        return self.to_pandas() if as_pandas else self.to_arrow()


@dataclass(frozen=True)
class Broadcast:
    """A stream every subtask of a keyed operator sees whole (a broadcast edge): one table,
    read once per run (per micro-batch when streaming), passed to the function."""

    stream: Stream


class KeyedStream:
    """A stream partitioned by key; its operators keep per-key state in key groups."""

    def __init__(self, stream: Stream, keys: tuple[str, ...], on_null: Any) -> None:
        self._stream = stream
        self.keys = keys
        self._on_null = on_null
        self.reinterpreted = False

    def aggregate(self, **aggregations: str) -> Stream:
        """Per-key aggregates as Spark SQL: ``aggregate(clicks="count(*)", revenue="sum(price)")``.

        Built-ins (count, sum, min, max, avg, first, last, and any other Spark aggregate)
        are partially aggregated before the keyed exchange, so one row per key crosses it.
        Every keyword is an output column; use :meth:`Stream.set_name`,
        :meth:`Stream.set_parallelism` and :meth:`Stream.uid` on the result for the operator's
        name, parallelism and stable id.
        """
        if not aggregations or not all(isinstance(e, str) and e.strip() for e in aggregations.values()):
            raise PlanError(
                f"aggregate needs name='aggregate expression' pairs such as count='count(*)', got {aggregations!r}"
            )
        clash = set(aggregations) & set(self.keys)
        if clash:
            raise PlanError(f"aggregate output {sorted(clash)} has the name of a key column; rename the aggregate")
        changelog = nodes.emits_changelog(self._stream.pipeline.operators, self._stream.node_id)
        return self._stream._then(
            nodes.AggregateNode,
            "aggregate",
            keys=self.keys,
            on_null=self._on_null,
            aggregations=aggregations,
            changelog=changelog,
            changelog_input=changelog,
            reinterpreted=self.reinterpreted,
        )

    def process(
        self,
        function: Callable[..., Any],
        schema: pa.Schema | str,
        state: dict[str, StateDescriptor] | None = None,
        order_by: str | tuple[str, ...] | list[str] = (),
        name: str | None = None,
        parallelism: int | None = None,
        side: Broadcast | None = None,
    ) -> Stream:
        """A keyed process function over Arrow batches: ``function(batch, state) -> table``.

        ``batch`` is a :class:`keyflow.KeyedBatch` (rows grouped by key; with ``order_by``,
        whole keys with their rows sorted by it);
        ``state`` gives vectorised access to the declared per-key ``state``; the result is a
        ``pyarrow.Table``/``RecordBatch`` or pandas DataFrame matching ``schema``. With
        ``side=stream.broadcast()`` the function is ``function(batch, state, side)``, ``side``
        the whole side stream as a ``pyarrow.Table``.
        """
        if side is not None and not isinstance(side, Broadcast):
            raise PlanError(f"process side= takes a broadcast stream (stream.broadcast()), got {side!r}")
        if side is not None and side.stream.pipeline is not self._stream.pipeline:
            raise PlanError("process side= is a stream of another pipeline; build both streams from one Pipeline")
        if side is not None and side.stream.node_id == self._stream.node_id:
            raise PlanError("process side= is the keyed stream itself; broadcast another (small) stream")
        if not callable(function):
            raise PlanError(f"process needs a function, got {function!r}")
        if schema is None:
            raise PlanError("process needs the output schema: a pyarrow.Schema or a DDL string 'user string, n long'")
        for state_name, descriptor in (state or {}).items():
            if state_name in self.keys or state_name.startswith("__"):
                raise PlanError(
                    f"state {state_name!r} has the name of a key column or starts with '__' (kept for keyflow's "
                    "own columns); rename the state"
                )
            if not hasattr(descriptor, "arrow_type"):
                raise PlanError(f"state {state_name!r} is {descriptor!r}; declare ValueState, ListState or MapState")
            descriptor.arrow_type  # validates the type now, at plan time  # noqa: B018
        label = name or str(getattr(function, "__name__", "process"))
        inputs = (self._stream.node_id,) if side is None else (self._stream.node_id, side.stream.node_id)
        return self._stream._then(
            nodes.ProcessNode,
            label,
            _p(parallelism, label),
            inputs=inputs,
            side_input=side is not None,
            keys=self.keys,
            on_null=self._on_null,
            function=function,
            schema=schema,
            state=dict(state or {}),
            order_by=(order_by,) if isinstance(order_by, str) else tuple(order_by),
            reinterpreted=self.reinterpreted,
        )


def _p(parallelism: int | None, name: str) -> int | None:
    return check_parallelism_option(parallelism, f"operator {name!r}")
