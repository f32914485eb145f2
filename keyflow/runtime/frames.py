"""Turn a compiled plan into Spark DataFrames: one per operator, built once.

Everything is read from the plan: the partitioner on each operator's input decides
whether it is rebalanced, keyed (an exact exchange by key group, then the keyed
operator) or chained; the nodes give the functions, sources and sinks.
"""

from __future__ import annotations

import math
import time as clock
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyspark import Accumulator, Broadcast
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from keyflow.config import NULL_KEYS, PIPELINE_NAME, PRE_KEYED_VERIFY, STATE_TTL
from keyflow.connectors.base import MALFORMED_COLUMN, HasDeadLetters
from keyflow.errors import DataError, NullKeysError, PlanError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan import nodes
from keyflow.plan.columns import missing_primary_key_message
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.graph import Partitioner
from keyflow.runtime.adaptive_exchange import StageReport, adaptive_keyed_exchange
from keyflow.runtime.connected import PACKED, connected_inputs
from keyflow.runtime.errors import guarded
from keyflow.runtime.exchange import keyed_exchange, null_key_condition, rebalance
from keyflow.runtime.lookup import lookup_join
from keyflow.runtime.operators import (
    AdaptiveExchange,
    KeyGroupRanges,
    apply_stateless,
    require_key_columns,
)
from keyflow.runtime.session import spark_session
from keyflow.runtime.translators import KeyedContext, translate_keyed
from keyflow.scheduler.batch_parallelism import AutoParallelism
from keyflow.state.durable import CheckpointedState
from keyflow.state.timers import TaskTime

T = TypeVar("T")
MAX_SIDE_INPUT_BYTES = 1 << 30  # a broadcast side input is collected on the driver and sent to every task


@dataclass(frozen=True)
class DeadLetters:
    """Rows an operator could not place (null keys, late rows, a source's malformed records) for the sink of ``kind``
    (its uid is the operator's ``<uid>/<kind>``)."""

    node: nodes.Node
    kind: str
    sink: Any
    rows: DataFrame


class FrameBuilder:
    """Operators as DataFrames, each built once; operators read by several are persisted."""

    def __init__(
        self,
        spark: SparkSession,
        plan: CompiledPlan,
        sources: dict[int, DataFrame] | None = None,
        state: dict[str, CheckpointedState] | None = None,
        auto_parallelism: AutoParallelism | None = None,
        source_parallelism: int | None = None,
        time: TaskTime | Mapping[int, TaskTime] | None = None,
    ) -> None:
        """``sources`` replace reading a source (a streaming micro-batch), by node id; ``state``
        gives keyed operators durable state by uid (streaming); without it state lives for one run.
        ``auto_parallelism`` (batch): keyed operators without a parallelism of their own decide
        it from their input's bytes (``stages`` reports each decision); sources without one
        read at ``source_parallelism``. ``time``: the watermarks and processing time keyed
        operators run at (a batch run: its end fires every timer), or each source's by node id
        (an operator runs at the earliest of the sources it reads)."""
        self.spark, self.plan = spark, plan
        self._times = time if isinstance(time, Mapping) else None
        self.time = time if isinstance(time, TaskTime) else TaskTime.bounded(int(clock.time() * 1_000_000))
        self._sources, self._state, self._stateful = sources or {}, state or {}, state is not None
        self._auto, self._source_parallelism = auto_parallelism, source_parallelism
        self.stages: list[StageReport] = []
        self._ranges: dict[int, KeyGroupRanges] = {}  # decided key groups of keyed operators, by node id
        self._decided: dict[int, int] = {}  # parallelism decided at run time, by node id
        self.parallelism: dict[int, int] = {}  # what each built operator runs at, by node id
        self._consumers: dict[int, int] = {}
        for node in plan.nodes.values():
            for input_id in node.inputs:
                self._consumers[input_id] = self._consumers.get(input_id, 0) + 1
        self._frames: dict[int, DataFrame] = {}
        self._keyed_inputs: dict[int, DataFrame] = {}  # for null-key counts and key types
        self._dead_letters: list[DeadLetters] = []
        self.late_counts: list[tuple[str, Callable[[], int]]] = []  # late rows dropped, per operator
        self._persisted: list[DataFrame] = []
        self._broadcasts: list[Broadcast[pa.Table]] = []

    def frame(self, node_id: int) -> DataFrame:
        if node_id in self._frames:
            return self._frames[node_id]
        node, operator = self.plan.nodes[node_id], self.plan.operator(node_id)
        parallelism = operator.parallelism
        if node_id in self._sources:
            frame = self._without_malformed(node, self._sources[node_id])
        elif isinstance(node, nodes.SourceNode):
            read = node.source.read
            parallelism = (node.parallelism is None and self._source_parallelism) or operator.parallelism
            frame = self._without_malformed(node, self.guarded(lambda: read(self.spark, parallelism), node))
        elif isinstance(node, nodes.UnionNode):
            frame = self._union(node, parallelism)
        elif isinstance(node, nodes.LookupJoinNode):
            stream = self.frame(node.inputs[0]).drop(KEY_GROUP_COLUMN)
            if self.parallelism[node.inputs[0]] != parallelism:
                stream = rebalance(stream, parallelism)
            frame = lookup_join(node, stream, self.frame(node.inputs[1]).drop(KEY_GROUP_COLUMN), self._names(node))
        else:
            upstream = self.frame(node.inputs[0])
            partitioner = operator.input_partitioner
            reinterpreted = isinstance(node, nodes.KeyedNode) and node.reinterpreted
            if partitioner is Partitioner.FORWARD and not reinterpreted:
                # The plan saw equal parallelisms; one decided at run time may differ. An
                # operator with its own parallelism keeps it, the others follow their input.
                if node.parallelism is None:
                    parallelism = self.parallelism[node.inputs[0]]
                elif node.parallelism != self.parallelism[node.inputs[0]]:
                    partitioner = Partitioner.REBALANCE
            elif partitioner is Partitioner.FORWARD:
                parallelism = self.parallelism[node.inputs[0]]
            if partitioner is Partitioner.REBALANCE:
                upstream = rebalance(upstream, operator.parallelism)
            if not (isinstance(node, (nodes.FilterNode, nodes.WithColumnsNode)) or self.plan.reads_pre_keyed(node)):
                upstream = upstream.drop(KEY_GROUP_COLUMN)  # a pre-keyed source's, for its keyed operator only
            if isinstance(node, nodes.SinkNode):
                frame = upstream
                if partitioner is Partitioner.HASH:  # table.exec.sink.keyed-shuffle
                    missing = [key for key in node.primary_key if key not in upstream.columns]
                    if missing:
                        raise PlanError(missing_primary_key_message(node, missing, upstream.columns))
                    frame = keyed_exchange(upstream, node.primary_key, self.plan.max_parallelism, operator.parallelism,
                                           keep_key_group=False)  # fmt: skip
            elif partitioner is Partitioner.HASH or node.keyed:
                frame = self._keyed(node, upstream)
            else:
                frame = apply_stateless(node, upstream)
        if self._consumers.get(node_id, 0) > 1:
            frame = self._persist(frame)
        self._frames[node_id] = frame
        self.parallelism[node_id] = self._decided.get(node_id, parallelism)
        return frame

    def _without_malformed(self, node: nodes.Node, frame: DataFrame) -> DataFrame:
        """A source's rows; the records it could not decode go to its dead-letter sink."""
        if MALFORMED_COLUMN not in frame.columns:
            return frame
        assert isinstance(node, nodes.SourceNode)
        assert isinstance(node.source, HasDeadLetters)
        malformed = F.col(MALFORMED_COLUMN).isNotNull()
        letters = frame.where(malformed).select(f"{MALFORMED_COLUMN}.*")
        self._dead_letters.append(DeadLetters(node, "dead-letters", node.source.dead_letters, letters))
        return frame.where(~malformed).drop(MALFORMED_COLUMN)

    def _names(self, node: nodes.Node) -> tuple[str, str]:
        """The operator names of a two-input operator's inputs, for errors."""
        return (self.plan.nodes[node.inputs[0]].name, self.plan.nodes[node.inputs[1]].name)

    def _union(self, node: nodes.UnionNode, parallelism: int) -> DataFrame:
        """The inputs' rows by column name, in ``parallelism`` partitions: an input at another
        parallelism is rebalanced to it, then the inputs' partitions are merged (not shuffled)."""
        inputs = [self.frame(input_id).drop(KEY_GROUP_COLUMN) for input_id in node.inputs]
        inputs = [
            self._unionable(input_id, frame)
            if self.parallelism[input_id] == parallelism
            else rebalance(frame, parallelism)
            for input_id, frame in zip(node.inputs, inputs, strict=True)
        ]
        first = inputs[0]
        for input_id, frame in zip(node.inputs[1:], inputs[1:], strict=True):
            if sorted(frame.columns) != sorted(first.columns):
                a, b = self.plan.nodes[node.inputs[0]].name, self.plan.nodes[input_id].name
                raise PlanError(
                    f"union {node.name!r}: {a!r} has columns {first.columns}, {b!r} has {frame.columns}; select or "
                    "rename the columns so every input has the same names"
                )
            kinds = [(c, first.schema[c].dataType.simpleString(), frame.schema[c].dataType.simpleString())
                     for c in first.columns]  # fmt: skip
            differ = [f"{c} ({a} vs {b})" for c, a, b in kinds if a != b]  # nullability aside, as Spark's union
            if differ:
                raise PlanError(
                    f"union {node.name!r}: {self.plan.nodes[input_id].name!r} has columns of other types than "
                    f"{self.plan.nodes[node.inputs[0]].name!r}: {', '.join(differ)}; cast them with select(...) first"
                )
        unioned = first
        for frame in inputs[1:]:
            unioned = unioned.unionByName(frame)
        return unioned.coalesce(parallelism)

    def _keyed(self, node: nodes.Node, upstream: DataFrame) -> DataFrame:
        if not isinstance(node, nodes.KeyedNode):
            raise AssertionError(f"the plan partitions {node.kind} {node.name!r} by key, but it has no keys")
        if isinstance(node, nodes.ConnectedNode):
            first, second = (self._unionable(i, self.frame(i)).drop(KEY_GROUP_COLUMN) for i in node.inputs)
            upstream = connected_inputs(node, first, second, self._names(node))
        require_key_columns(node, upstream)
        self._keyed_inputs[node.id] = upstream
        if node.on_null is not None:
            rows = upstream.filter(null_key_condition(node.keys)).drop(KEY_GROUP_COLUMN)
            self._dead_letters.append(DeadLetters(node, "dead-letters", node.on_null, rows))
            upstream = upstream.filter(~null_key_condition(node.keys))
        policy = "keep" if node.on_null is not None else self.plan.config.get(NULL_KEYS)
        operator = self.plan.operator(node.id)
        checks = self.plan.config.get(PRE_KEYED_VERIFY)
        state = self._state.get(operator.uid)
        pre_keyed = self.plan.reads_pre_keyed(node)
        context = KeyedContext(
            node,
            operator,
            self.plan.max_parallelism,
            policy,
            keyed_state=state,
            verify=not node.reinterpreted or checks != "off",
            pre_keyed=pre_keyed,
            report_keys=pre_keyed and checks != "off" and state is not None,
            time=self._time_of(node),
            rejected=self._rejected,
            persist=self._persist,
            late_accumulator=self._late_accumulator,
            state_ttl=math.ceil(self.plan.config.get(STATE_TTL) * 1_000_000),
        )
        if node.reinterpreted:
            context.ranges = self._ranges.get(nodes.keyed_origin(self.plan.nodes, node.inputs[0]).id)
            if context.ranges is not None:
                self._ranges[node.id] = context.ranges
        table = self._side_input(node)
        if table is not None:
            context.side = self.spark.sparkContext.broadcast(table)
            self._broadcasts.append(context.side)
        if self._auto and node in self.plan.auto_sized():
            context.adaptive = self._adaptive(node, 0 if table is None else table.nbytes)
        return translate_keyed(self.plan.keyed_operator(node, self._stateful), upstream, context)

    def _time_of(self, node: nodes.Node) -> TaskTime:
        if self._times is None:
            return self.time
        upstream = nodes.upstream(self.plan.nodes, [node.id])
        return TaskTime.earliest(self._times[n.id] for n in upstream if n.id in self._times)

    def _side_input(self, node: nodes.KeyedNode) -> pa.Table | None:
        """A process function's broadcast side input, read whole on the driver."""
        if not (isinstance(node, nodes.ProcessNode) and node.side_input):
            return None
        frame = self.frame(node.inputs[1]).drop(KEY_GROUP_COLUMN)
        table: pa.Table = self.guarded(frame.toArrow, self.plan.nodes[node.inputs[1]])
        if table.nbytes > MAX_SIDE_INPUT_BYTES:
            raise DataError(
                f"the side input of {node.name!r} holds {table.nbytes:,} bytes in memory, above "
                f"{MAX_SIDE_INPUT_BYTES:,}: every subtask receives it whole. Filter or aggregate it first, or join "
                "it to the keyed stream before key_by"
            )
        return table

    def _adaptive(self, node: nodes.KeyedNode, broadcast_bytes: int) -> AdaptiveExchange:
        """The exchange of ``node`` with its parallelism decided from the bytes it receives
        (and those of its broadcast input)."""
        assert self._auto is not None
        options = self._auto

        def exchange(
            rows: DataFrame, keep_key_group: bool, fail_on_null: str | None
        ) -> tuple[DataFrame, KeyGroupRanges]:
            exchanged, report = adaptive_keyed_exchange(
                rows, node.keys, self.plan.max_parallelism, options, (node.id, node.name),
                lambda action: self.guarded(action, node), broadcast_bytes, keep_key_group, fail_on_null,
            )  # fmt: skip
            self.stages.append(report)
            self._ranges[node.id] = report.key_groups
            self._decided[node.id] = report.decision.parallelism
            return exchanged, report.key_groups

        return exchange

    def key_types(self, node_id: int) -> dict[str, str]:
        """The Spark types of a built keyed operator's key columns (and of a join's stored rows)."""
        node, upstream = self.plan.nodes[node_id], self._keyed_inputs[node_id]
        assert isinstance(node, nodes.KeyedNode)
        types = {key: upstream.schema[key].dataType.simpleString() for key in node.keys}
        if isinstance(node, nodes.JoinNode):  # its state holds each input's rows: their columns are fixed too
            types.update({f"rows of input {i + 1}": upstream.schema[PACKED[i]].dataType.simpleString() for i in (0, 1)})
        if isinstance(node, nodes.RankNode):  # its state holds the input's rows
            types["rows"] = upstream.schema.simpleString()
        return types

    def _unionable(self, input_id: int, frame: DataFrame) -> DataFrame:
        """``frame`` ready to be unioned: a keyed operator knows its subtask by the index of the
        partition its task computes, which a union (or its coalesce) renumbers in the same
        stage, so the rows of one that no exchange follows are first rebalanced."""
        node = self.plan.nodes[input_id]
        while not isinstance(node, (nodes.KeyedNode, nodes.SourceNode, nodes.UnionNode)) and node.inputs:
            if self.plan.operator(node.id).input_partitioner is not Partitioner.FORWARD:
                return frame  # an exchange after any keyed operator
            node = self.plan.nodes[node.inputs[0]]
        return rebalance(frame, self.parallelism[input_id]) if isinstance(node, nodes.KeyedNode) else frame

    def _persist(self, frame: DataFrame) -> DataFrame:
        persisted = frame.persist()
        self._persisted.append(persisted)
        return persisted

    def _rejected(self, node: nodes.KeyedNode, rows: DataFrame | None) -> Observation | None:
        """Late rows of a window: to its ``late_rows`` sink, or (None given) counted."""
        if rows is not None:
            windowing = nodes.windowing_of(node)
            assert windowing is not None
            self._dead_letters.append(DeadLetters(node, "late-rows", windowing.late_rows, rows))
            return None
        observation = Observation()
        self.late_counts.append((self._label(node), lambda: observed(observation)))
        return observation

    def _late_accumulator(self, node: nodes.KeyedNode) -> Accumulator[int]:
        """A count of late rows the workers drop (a session found late once merged)."""
        dropped = self.spark.sparkContext.accumulator(0)
        self.late_counts.append((self._label(node), lambda: int(dropped.value)))
        return dropped

    def _label(self, node: nodes.Node) -> str:
        return f"{node.name} ({self.plan.uid(node.id)})"

    def take_dead_letters(self) -> list[DeadLetters]:
        """Rows with null keys or late, per operator with a sink for them, not yet written."""
        taken, self._dead_letters = self._dead_letters, []
        return taken

    def guarded(self, action: Callable[[], T], node: nodes.Node) -> T:
        """Run a Spark action for ``node``; its failure becomes one clear keyflow error."""
        try:
            return guarded(action, f"while running {node.name!r}")
        except NullKeysError as error:
            raise self._null_key_error(error.node) from None

    def _null_key_error(self, node_id: int) -> DataError:
        node, upstream = self.plan.nodes[node_id], self._keyed_inputs[node_id]
        assert isinstance(node, nodes.KeyedNode)
        count = upstream.filter(null_key_condition(node.keys)).count()
        total = upstream.count()
        if isinstance(node, nodes.ConnectedNode):
            return DataError(
                f"operator {node.name!r}: {count} of {total} rows of its two inputs have a null in key column(s) "
                f"{list(node.keys)} / {list(node.other_keys)}; filter them out first or set pipeline.null-keys=drop "
                "(an outer join does not emit them padded with nulls yet, as SQL would)"
            )
        return DataError(
            f"operator {node.name!r}: {count} of {total} rows have a null in key column(s) {list(node.keys)}; "
            "filter them out first, set pipeline.null-keys=drop, or keep them with "
            "key_by(..., on_null=parquet('out/dead_letters'))"
        )

    def release(self) -> None:
        for frame in self._persisted:
            frame.unpersist()
        for side in self._broadcasts:
            side.destroy()


ARROW_BATCH_ROWS = 100_000


def observed(observation: Observation) -> int:
    """The rows an observation counted (0 where Spark's optimizer pruned the observed node)."""
    try:
        return int(observation.get.get("rows") or 0)
    except Exception:  # Spark's adaptive execution may prune the observed node of an empty stage
        return 0


def session_for(plan: CompiledPlan) -> SparkSession:
    """The session, with Spark's own shuffles (inside aggregations) as wide as the keyed
    operators, and Arrow batches to Python workers of up to 100,000 rows (Spark's default,
    10,000, costs more per row in the transfer and in every per-call step of a keyed
    operator; Spark's 64 MiB cap per batch still bounds wide rows), unless the pipeline sets
    these ``spark.*`` options itself."""
    keyed = [operator.parallelism for operator in plan.graph.keyed_operators().values()]
    name = plan.config.get(PIPELINE_NAME)
    settings = {
        "spark.app.name": name,
        "spark.sql.shuffle.partitions": str(max(keyed, default=plan.parallelism)),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
        **plan.config.spark,
    }
    session = spark_session(settings, app_name=name)
    for function in plan.functions.values():  # vectorised: pandas Series in, a Series out
        session.udf.register(function.name, pandas_udf(function.function, function.result_type))
    return session
